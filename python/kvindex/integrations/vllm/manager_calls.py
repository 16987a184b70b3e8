"""The manager calls that read only state every kvindex vLLM manager keeps alike.

:class:`~kvindex.integrations.vllm.manager.KVCacheManager` (one group) and
:class:`~kvindex.integrations.vllm.hybrid.HybridKVCacheManager` (several groups) both keep
the Rust ``_VllmManager`` in ``_core``, vLLM's ``PrefixCacheStats`` and metrics collector,
and the list of KV events not taken yet; the calls below depend on nothing else, so they
are written once here. Costs: O(1) each, but ``reset_prefix_cache`` (one Rust call over the
pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from vllm.distributed.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request

from kvindex._core import _VllmManager

__all__ = ["ManagerCalls"]


class ManagerCalls:
    """Mixin: the calls both managers share (module doc); the subclass sets the state."""

    _core: _VllmManager
    _events: list[KVCacheEvent]
    enable_caching: bool
    enable_kv_cache_events: bool
    log_stats: bool
    metrics_collector: KVCacheMetricsCollector | None
    prefix_cache_stats: PrefixCacheStats | None
    empty_kv_cache_blocks: KVCacheBlocks
    num_hash_lookahead_tokens: int

    @property
    def usage(self) -> float:
        """The KV cache usage (between 0.0 and 1.0)."""
        return self._core.usage

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Get (and reset) the prefix cache stats; None if logging is disabled."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether a local prefix cache lookup may be run for this request."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    def _reset_pool(self) -> bool:
        if not self._core.reset():
            return False
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return True

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; False (nothing changed) while requests hold blocks."""
        if not self._reset_pool():
            return False
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    def _append_stored(
        self,
        request: Request,
        group: int,
        block_size: int,
        start: int,
        end: int,
        stored: Iterable[int],
        hash_at: Callable[[int], bytes],
    ) -> None:
        """Buffer vLLM's ``BlockStored`` for the request's blocks ``stored`` (block indices
        of ``group``, ``block_size`` tokens each, the run ``start..end``; ``hash_at(i)`` is
        block ``i``'s hash), with the extra keys and lookahead tokens vLLM records."""
        bs = block_size
        blocks = list(stored)
        extra: list[tuple[Any, ...] | None] = []
        lookahead: list[list[int]] | None = [] if self.num_hash_lookahead_tokens else None
        mm_idx = 0
        tokens = request.all_token_ids
        for i in blocks:
            b0, b1 = i * bs, (i + 1) * bs
            if lookahead is not None:
                keys, mm_idx = generate_lookahead_block_hash_extra_keys(
                    request, b0, b1, b1 + self.num_hash_lookahead_tokens, mm_idx
                )
                lookahead.append(list(tokens[b1 : b1 + self.num_hash_lookahead_tokens]))
            else:
                keys, mm_idx = generate_block_hash_extra_keys(request, b0, b1, mm_idx)
            extra.append(keys)
        lora = request.lora_request
        self._events.append(
            BlockStored(
                block_hashes=[maybe_convert_block_hash(hash_at(i)) for i in blocks],
                parent_block_hash=None
                if start == 0
                else maybe_convert_block_hash(hash_at(start - 1)),
                token_ids=tokens[start * bs : end * bs],
                block_size=bs,
                lora_id=lora.adapter_id if lora else None,
                medium=MEDIUM_GPU,
                lora_name=lora.name if lora else None,
                extra_keys=to_event_extra_keys(extra),
                group_idx=group,
                session_id=request.session_id,
                lookahead_token_ids=lookahead,
            )
        )

    def _take_raw_events(self) -> list[KVCacheEvent]:
        events = self._events
        self._events = []
        return events

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self) -> list[int]:
        """Block ids to zero on the worker: none (zeroing is refused at construction)."""
        return []

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """No group records blocks for zeroing (refused at construction)."""
        return None
