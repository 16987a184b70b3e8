"""``KVCacheManager``: vLLM 0.33's KV cache manager, decided by kvindex's Rust pool.

A drop-in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` with the constructor and
every method and attribute vLLM's ``Scheduler`` / ``AsyncScheduler`` and KV connectors
use. It returns vLLM's own ``KVCacheBlocks`` / ``KVCacheBlock`` types (block 0 is the
null block), its events are vLLM's ``KVCacheEvent`` objects and its stats vLLM's
``PrefixCacheStats``. Hits, allocation, the free queue, eviction and ref counts are the
Rust ``_VllmManager``'s (``kvindex._core``), over the same block pool as
``HashChainCache``, keyed on the hashes vLLM computed for each request
(``request.block_hashes``), so hits and events agree with vLLM's bit for bit.

The calls the scheduler makes on every running request every step (``allocate_slots``,
``cache_blocks``, ``estimate_cached_tokens``) are native methods installed on each
instance (``kvindex._core._VllmFront``): a running request's plain step is answered in
Rust without a Python frame; every other call reaches the Python methods below.

Scope: one full-attention (or MLA) KV cache group here; a config with several groups (or
one sliding-window / chunked-local group) is served by
:class:`~kvindex.integrations.vllm.hybrid.HybridKVCacheManager`, which constructing this
class returns for it. Prefix caching on or off; chunked prefill, async scheduling,
speculative decoding (lookahead slots, EAGLE's last-block drop, multi-module MTP's
re-prefilled tail), preemption, KV connectors' scheduler side, KV events, reset and
metrics. Anything else raises
:class:`~kvindex.integrations.vllm.errors.UnsupportedVllmConfigError` at construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MethodType
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core import kv_cache_manager as _vllm_manager_module
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    KVCacheBlockCopy,
    maybe_convert_block_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    MLAAttentionSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

from kvindex._core import _VllmFront, _VllmManager
from kvindex.exceptions import InvalidArgumentError

from .blocks import BlockPoolView, GroupManagerView
from .errors import UnsupportedVllmConfigError
from .hybrid import HybridKVCacheManager
from .manager_calls import ManagerCalls

__all__ = ["KVCacheManager"]

_SUPPORTED_SPECS = (FullAttentionSpec, MLAAttentionSpec)
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_config(
    kv_cache_config: KVCacheConfig,
    scheduler_block_size: int,
    hash_block_size: int,
    enable_caching: bool,
    dcp_world_size: int,
    pcp_world_size: int,
) -> Any:
    """The one group's spec, or the error naming what is unsupported."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups) or "none"
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager supports exactly one KV cache group; this model has "
            f"{len(groups)} ({kinds}): hybrid KV cache groups (sliding window, chunked local, "
            "Mamba, cross-attention mixes) and attention-free models are not supported"
        )
    group = groups[0]
    spec = group.kv_cache_spec
    if type(spec) not in _SUPPORTED_SPECS:
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager supports full attention and MLA KV cache groups only, "
            f"not {type(spec).__name__}"
        )
    role = getattr(group, "role", None)
    if role is not None and getattr(role, "value", role) != "default":
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager does not support KV cache group role {role!r} (HiSparse)"
        )
    if dcp_world_size != 1 or pcp_world_size != 1:
        raise UnsupportedVllmConfigError(
            "kvindex's KVCacheManager does not support decode/prefill context parallelism "
            f"(dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size}; 1 is supported)"
        )
    if scheduler_block_size != spec.block_size:
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager needs scheduler_block_size == block_size "
            f"(got {scheduler_block_size} and {spec.block_size})"
        )
    if enable_caching and hash_block_size != spec.block_size:
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager needs hash_block_size == block_size with prefix caching "
            f"(got {hash_block_size} and {spec.block_size}): partial-block hits are not supported"
        )
    retention = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if retention is not None and retention != 0:
        raise UnsupportedVllmConfigError(
            f"prefix_cache_retention_interval={retention} is set but this model has no "
            "sliding-window or Mamba KV cache group, so retention has no effect (set it to 0)"
        )
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        raise UnsupportedVllmConfigError(
            "kvindex's KVCacheManager does not support KV cache zeroing (needs_kv_cache_zeroing)"
        )
    return spec


class _CoordinatorView:
    """The members of vLLM's KV cache coordinator the scheduler and tests read."""

    enable_partial_hash_hits = False

    def __init__(self, manager: KVCacheManager, core: _VllmManager, spec: Any) -> None:
        self._manager = manager
        self._core = core
        self.kv_cache_config = manager.kv_cache_config
        self.block_pool = manager.block_pool
        self.kv_cache_spec = spec
        self.block_size: int = spec.block_size
        self.scheduler_block_size = spec.block_size
        self.dcp_world_size = 1
        self.pcp_world_size = 1
        self.eagle_group_ids = manager._eagle_group_ids
        self.drop_eagle_group_ids = {0} if manager._drop_eagle else set()
        self.num_reprefillable_tokens = manager._num_reprefillable
        self.retention_interval = getattr(
            manager.kv_cache_config, "prefix_cache_retention_interval", None
        )
        self.single_type_managers = (GroupManagerView(manager, core, spec),)
        self.group_block_sizes = (spec.block_size,)
        self.full_attention_group_id = 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        ids = [b.block_id for b in new_computed_blocks[0]] if new_computed_blocks else []
        return self._core.num_blocks_to_allocate(request_id, num_tokens, ids)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        blocks, n = self._manager._find_hit(block_hashes, max_cache_hit_length)
        return (blocks,), n, 0

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return (self._manager._table(request_id),)

    def new_step_starts(self) -> None:
        return None


def _needs_groups(kv_cache_config: KVCacheConfig) -> bool:
    """Whether the config is for the manager of several groups (hybrid.py)."""
    groups = kv_cache_config.kv_cache_groups
    return len(groups) > 1 or (
        len(groups) == 1 and type(groups[0].kv_cache_spec) not in _SUPPORTED_SPECS
    )


class KVCacheManager(ManagerCalls):
    """vLLM 0.33's ``KVCacheManager`` for one full-attention (or MLA) group (module doc);
    constructing it for several groups returns a :class:`HybridKVCacheManager`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        config = args[0] if args else kwargs.get("kv_cache_config")
        if cls is KVCacheManager and config is not None and _needs_groups(config):
            return HybridKVCacheManager(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: KVCacheMetricsCollector | None = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        spec = _check_config(
            kv_cache_config,
            scheduler_block_size,
            hash_block_size,
            enable_caching,
            dcp_world_size,
            pcp_world_size,
        )
        if watermark < 0.0:
            raise UnsupportedVllmConfigError("watermark must be non-negative")
        group = kv_cache_config.kv_cache_groups[0]
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = 1
        self.block_size: int = spec.block_size
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self._eagle_group_ids: set[int] = (
            {0} if getattr(group, "is_eagle_group", False) or use_eagle else set()
        )
        self._drop_eagle = use_eagle
        self._num_reprefillable = max(0, num_prefill_lookahead - 1)
        if (
            enable_caching
            and self._eagle_group_ids
            and scheduler_block_size < num_prefill_lookahead
        ):
            raise UnsupportedVllmConfigError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size"
                f" (={scheduler_block_size}) >= num_speculative_tokens"
                f" (={num_prefill_lookahead})."
            )
        self._core = _VllmManager(
            kv_cache_config.num_blocks,
            spec.block_size,
            enable_caching=enable_caching,
            log_removed=enable_kv_cache_events or metrics_collector is not None,
        )
        self._events: list[KVCacheEvent] = []
        self._loose = 0
        self._last_hit: tuple[KVCacheBlocks, list[int]] | None = None
        self._last_ids: list[int] = []
        # get_blocks' result per request, dropped when the request's table changes.
        self._tables: dict[str, KVCacheBlocks] = {}
        self.block_pool: BlockPoolView = BlockPoolView(self, self._core, hash_block_size)
        self._blocks = self.block_pool.blocks
        self.coordinator = _CoordinatorView(self, self._core, spec)
        self.mamba_shared_prefix_checkpoint = False
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = (
            (get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)),
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        self._install_front()

    def _install_front(self) -> None:
        """Serve the per-step calls of running requests natively (``_VllmFront``: a plain
        step of a running request — a no-op, a filled block to cache, new blocks — without
        a Python frame; anything else reaches the methods below), unless a subclass
        overrides them."""
        front = _VllmFront(
            self._core,
            allocate=MethodType(KVCacheManager.allocate_slots, self),
            cache=MethodType(KVCacheManager.cache_blocks, self),
            empty=self.empty_kv_cache_blocks,
            blocks_cls=KVCacheBlocks,
            blocks=self._blocks,
            tables=self._tables,
            admitting=_ADMITTING,
            block_size=self.block_size,
            reprefill=self._num_reprefillable,
            max_model_len=self.max_model_len,
            caching=self.enable_caching,
            # Caching and allocating natively needs nothing else watching the
            # allocation (KV events, the metrics collector).
            cache_only=not self.enable_kv_cache_events and self.metrics_collector is None,
            events=self.enable_kv_cache_events,
            watermark=self.watermark_blocks > 0,
        )
        cls = type(self)
        for name in ("allocate_slots", "cache_blocks", "estimate_cached_tokens"):
            if getattr(cls, name) is getattr(KVCacheManager, name):
                self.__dict__[name] = getattr(front, name)

    # ------------------------------------------------------------------ stats

    # ----------------------------------------------------------------- lookups

    def _find_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[list[KVCacheBlock], int]:
        bs = self.block_size
        ids = self._core.find_hit(block_hashes, max_length // bs, self._drop_eagle)
        self._last_ids = ids
        blocks = self._blocks
        return [blocks[i] for i in ids], len(ids) * bs

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The cached blocks of the request's longest hit, the hit tokens, and 0 (the
        shared-prefix boundary of hybrid models)."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        blocks, n = self._find_hit(request.block_hashes, max_cache_hit_length)
        if (
            n > 0
            and self.enable_kv_cache_events
            and getattr(request, "kv_cache_report_mode", "incremental") == "full"
        ):
            self._emit_stored(request, 0, len(blocks))
        if not blocks:
            return self.empty_kv_cache_blocks, 0, 0
        result = KVCacheBlocks((blocks,))
        # allocate_slots usually adopts exactly this result next: keep its ids so the
        # blocks need not be read back one by one.
        self._last_hit = (result, self._last_ids)
        return result, n, 0

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """``get_computed_blocks`` plus ``hit_diverged`` (always False: one group)."""
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def estimate_cached_tokens(self, request: Request) -> int:
        """Tokens the request's table holds cached blocks for (the furthest hashed block)."""
        n = self._core.num_cached(request.request_id)
        return 0 if not n else n * self.block_size

    # -------------------------------------------------------------- allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``: the new blocks, or None (nothing changed)."""
        # A running request's plain step is answered by _VllmFront (installed over this
        # method) before it gets here.
        rid = request.request_id
        if (
            num_new_tokens == 0
            and num_external_computed_tokens == 0
            and num_new_computed_tokens == 0
        ):
            raise InvalidArgumentError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        if (
            new_computed_blocks is not None
            and new_computed_blocks is not self.empty_kv_cache_blocks
        ):
            last = self._last_hit
            if (
                last is not None
                and last[0] is new_computed_blocks
                and len(last[1]) == len(new_computed_blocks.blocks[0])
            ):
                hit = last[1]
                hit_blocks: list[KVCacheBlock] | None = list(new_computed_blocks.blocks[0])
            else:
                hit = [b.block_id for b in new_computed_blocks.blocks[0]]
                hit_blocks = None
            self._last_hit = None
            adopt = new_computed_blocks.blocks is not self.empty_kv_cache_blocks.blocks
        else:
            hit = []
            hit_blocks = []
            adopt = False
        adopt = adopt or num_external_computed_tokens > 0
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark = self.watermark_blocks
        full = min(request.num_tokens, self.max_model_len) if full_sequence_must_fit else None
        need_slot = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        collector = self.metrics_collector
        if collector is not None and hit and adopt and self._core.num_cached(rid) is None:
            touched = hit
        else:
            touched = []
        caching = self.enable_caching and not delay_cache_blocks
        # The caching step rides in the same Rust call: the finalized tokens only
        # (drafts beyond request.num_tokens are not cached), less MTP's re-prefilled tail.
        cache_tokens = (
            max(0, min(total + num_new_tokens, request.num_tokens) - self._num_reprefillable)
            if caching
            else None
        )
        res = self._core.allocate_slots(
            rid,
            hit,
            need_slot,
            num_local,
            num_external_computed_tokens,
            full,
            reserved_blocks,
            watermark,
            adopt,
            request.block_hashes if caching else None,
            cache_tokens,
        )
        if res is None:
            return None
        new, held, _ = res
        blocks = self._blocks
        new_blocks = [blocks[i] for i in new]
        if held == len(hit) + len(new_blocks):
            # Nothing was held before and nothing was allocated for external tokens:
            # the table is the adopted hit and the new blocks.
            if hit_blocks is None:
                hit_blocks = [blocks[i] for i in hit]
            self._tables[rid] = KVCacheBlocks((hit_blocks + new_blocks,))
        else:
            self._tables.pop(rid, None)
        if collector is not None:
            self._collect(collector, touched, new_blocks)
        if self.enable_kv_cache_events:
            self._drain_removed()
            run = self._core.last_cached_run
            if run is not None:
                self._emit_stored(request, run[0], run[1])
        elif collector is not None:
            self._core.take_removed()
        if not new_blocks:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks((new_blocks,))

    def _collect(
        self, collector: KVCacheMetricsCollector, touched: list[int], new_blocks: list[KVCacheBlock]
    ) -> None:
        """vLLM's metrics hooks: accessed hit blocks, evicted and allocated new ones."""
        blocks = self._blocks
        for i in touched:
            collector.on_block_accessed(blocks[i])
        for b in new_blocks:
            if self.enable_caching:
                collector.on_block_evicted(b)
            collector.on_block_allocated(b)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_computed_tokens``, if enabled."""
        if not self.enable_caching:
            return
        num_tokens = max(0, num_computed_tokens - self._num_reprefillable)
        run = self._core.cache(request.request_id, request.block_hashes, num_tokens)
        if run is not None and self.enable_kv_cache_events:
            self._emit_stored(request, run[0], run[1])

    def _forget(self, rid: str) -> None:
        self._tables.pop(rid, None)

    def free(self, request: Request) -> None:
        """Free the request's blocks in reverse order (tail blocks are evicted first)."""
        rid = request.request_id
        self._forget(rid)
        self._core.free(rid)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """Pop the request's table and return its blocks, not yet freed (the caller frees
        them through ``block_pool.free_blocks``, in reverse order)."""
        rid = request.request_id
        self._forget(rid)
        blocks = self._blocks
        return [blocks[i] for i in self._core.pop_blocks(rid)]

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Full attention skips no tokens: nothing to remove."""
        return None

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Evict blocks from the prefix cache by id (held blocks keep their references)."""
        ids = list(block_ids)  # the set's own order, as vLLM iterates it
        collector = self.metrics_collector
        if collector is not None:
            for i in ids:
                if 0 <= i < len(self._blocks):
                    collector.on_block_evicted(self._blocks[i])
        self._core.evict_blocks(ids)
        if self.enable_kv_cache_events:
            self._drain_removed()
        elif collector is not None:
            self._core.take_removed()

    def _take_loose_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self._core.num_free_blocks:
            raise InvalidArgumentError(f"Cannot get {num_blocks} free blocks from the pool")
        self._loose += 1
        rid = f"\x00kvindex-loose-{self._loose}"
        self._core.allocate_slots(rid, [], num_blocks * self.block_size, 0, 0, None, 0, 0, False)
        if self.enable_kv_cache_events:
            self._drain_removed()
        else:
            self._core.take_removed()
        blocks = self._blocks
        return [blocks[i] for i in self._core.pop_blocks(rid)]

    def _cache_loose(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        raise UnsupportedVllmConfigError(
            "kvindex's KVCacheManager supports block_pool.cache_full_blocks with several KV "
            "cache groups only"
        )

    def _cache_partial_loose(
        self,
        request: Request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        raise UnsupportedVllmConfigError(
            "kvindex's KVCacheManager supports block_pool.cache_partial_block with several KV "
            "cache groups only"
        )

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in vLLM (cascade attention is gone): 0 for the one group."""
        return [0]

    # ------------------------------------------------------------------ events

    def _drain_removed(self) -> None:
        for h in self._core.take_removed():
            self._events.append(
                BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(h)], medium=MEDIUM_GPU, group_idx=0
                )
            )

    def _emit_stored(self, request: Request, start: int, end: int) -> None:
        hashes = request.block_hashes
        self._append_stored(
            request, 0, self.block_size, start, end, range(start, end), hashes.__getitem__
        )

    def take_events(self) -> list[KVCacheEvent]:
        """Take the buffered KV events (vLLM's objects, annotated with the group's kind)."""
        if not self.enable_kv_cache_events:
            return []
        events = self._take_raw_events()
        kind, sliding_window = self.kv_cache_event_metadata[0]
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if event.group_idx != 0:
                # Events appended by others (connectors, tests) for a group this
                # manager does not have are passed on unannotated, as vLLM does.
                _vllm_manager_module.logger.warning(
                    "Group index `%s` not in KV cache metadata", event.group_idx
                )
                continue
            event.kv_cache_spec_kind = kind
            event.kv_cache_spec_sliding_window = sliding_window
        return events

    # ------------------------------------------------------------------ tables

    def _table(self, request_id: str) -> list[KVCacheBlock]:
        blocks = self._blocks
        return [blocks[i] for i in self._core.blocks(request_id)]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks (kept per request until its table changes)."""
        cached = self._tables.get(request_id)
        if cached is not None:
            return cached
        table = self._table(request_id)
        if not table:
            return self.empty_kv_cache_blocks
        result = KVCacheBlocks((table,))
        self._tables[request_id] = result
        return result

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids."""
        return (self._core.blocks(request_id),)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the request's first ``num_computed_tokens`` tokens."""
        ids = self._core.blocks(request_id)
        return (ids[: _cdiv(num_computed_tokens, self.block_size)],)

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        """A lookup result cut at a block-aligned token count (no ref count changes)."""
        group = blocks.blocks[0]
        if (
            num_computed_tokens % self.block_size != 0
            or num_computed_tokens // self.block_size > len(group)
        ):
            raise InvalidArgumentError(
                f"cannot truncate {len(group)} blocks of {self.block_size} tokens "
                f"at {num_computed_tokens}"
            )
        return self.create_kv_cache_blocks((list(group[: num_computed_tokens // self.block_size]),))

    # ------------------------------------------------------- worker hand-offs

    def take_kv_cache_block_copies(self) -> tuple[list[KVCacheBlockCopy], list[KVCacheBlock]]:
        """Drain pending copy-on-write copies and their retained endpoints (kvindex queues
        none itself: partial-block hits are refused at construction)."""
        pending = self.coordinator.single_type_managers[0].take_pending_cow_copies()
        copies = [
            KVCacheBlockCopy(src_block_id=s.block_id, dst_block_id=d.block_id) for s, d in pending
        ]
        return copies, [b for pair in pending for b in pair]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Mamba boundary states: none (one attention group)."""
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """Mamba partial tails: none (one attention group)."""
        return []

    def new_step_starts(self) -> None:
        """A new scheduler step starts (nothing to do for full attention)."""
        return None
