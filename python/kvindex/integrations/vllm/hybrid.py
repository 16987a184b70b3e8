"""``HybridKVCacheManager``: vLLM 0.33's ``KVCacheManager`` over several KV cache groups.

What vLLM's ``HybridKVCacheCoordinator`` (or, for one non-full-attention group, its unitary
coordinator) does, decided by kvindex's Rust ``_VllmManager`` built with ``groups``: one
block pool shared by the groups, one table per group per request, the longest hit as the
fixed point over groups (full attention bounds it), null blocks where a sliding-window or
chunked-local group skips positions, ``remove_skipped_blocks`` freeing what fell out of a
window, block hashes keyed by group, KV events carrying ``group_idx``, the group's kind and
its window. Python only converts vLLM's arguments, wraps block ids in vLLM's block objects
and builds vLLM's event objects.

:class:`~kvindex.integrations.vllm.manager.KVCacheManager` hands a config with several
groups (or one that is not full attention / MLA) to this class; it is not constructed
directly. Supported group kinds: full attention, MLA, sliding window, sliding-window MLA
(with or without bounded replay: a bounded-replay group is not prefix-cacheable, so it never
hits and is never cached, and the scheduler replays the hit's last window), cross-attention
beside the decoder's groups with prefix caching off (blocks for the encoder tokens
scheduled, as vLLM's ``CrossAttentionManager``), chunked local attention, Mamba state in
``"align"`` / ``"none"`` mode (:mod:`.mamba`), as the Rust layout accepts them, with EAGLE
on every group or on the groups flagged ``is_eagle_group``, KV cache zeroing, retention
intervals, blocks held by no request as
:mod:`~kvindex.integrations.vllm.hybrid_extra` describes, and full-attention groups whose
block is larger than the hash block (their prompt tail's partial-block prefix entry), hash
lookahead and multi-module MTP, the per-group hits a KV connector
that accepts diverging hybrid hits asks for, and partial hash hits (an align-mode Mamba
group larger than the hash block: hits at hash-block boundaries inside blocks, copied on
write, and the Mamba prompt tail's producer copy; not with EAGLE); anything else
(cross-attention with prefix caching on, HiSparse roles, context parallelism) raises
:class:`~kvindex.integrations.vllm.errors.UnsupportedVllmConfigError` at construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core import kv_cache_manager as _vllm_manager_module
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator, SpecGroup
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    KVCacheBlockCopy,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

from kvindex._core import _VllmManager
from kvindex.exceptions import InvalidArgumentError, KvIndexError

from .blocks import BlockPoolView, GroupManagerView
from .errors import ComputedBlocksTruncationError, UnsupportedVllmConfigError
from .hybrid_extra import (
    CrossAttentionManagerView,
    cache_loose,
    check_retention_interval,
    eagle_group_flags,
    register_partial_entry,
    spec_classes,
    take_loose_ids,
    zeroing_groups,
)
from .mamba import (
    BoundaryStateOffloads,
    align_groups,
    has_mamba,
    mamba_group_args,
    prefill_checkpoints,
    speculative_blocks,
)
from .manager_calls import ManagerCalls

__all__ = ["HybridKVCacheManager", "group_args"]

#: vLLM spec type -> the kind name kvindex's layout takes (exact types: subclasses such as
#: sliding-window MLA are other kinds).
_KINDS: dict[type, str] = {
    FullAttentionSpec: "full_attention",
    MLAAttentionSpec: "mla_attention",
    SlidingWindowSpec: "sliding_window",
    SlidingWindowMLASpec: "sliding_window_mla",
    ChunkedLocalAttentionSpec: "chunked_local_attention",
    CrossAttentionSpec: "cross_attention",
    CircularBufferSpec: "circular_buffer",
}
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _unsupported(what: str) -> UnsupportedVllmConfigError:
    return UnsupportedVllmConfigError(f"kvindex's KVCacheManager supports {what}")


def group_args(kv_cache_config: KVCacheConfig) -> list[tuple[str, int, int, str]]:
    """Each group as kvindex's layout takes it: (kind, block size, window or chunk, mode:
    Mamba's cache mode, ``"bounded_replay"`` for a sliding-window MLA group that is not
    prefix-cacheable); raises :class:`UnsupportedVllmConfigError` for a kind it does not
    take."""
    out: list[tuple[str, int, int, str]] = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        kind = _KINDS.get(type(spec))
        if type(spec) is MambaSpec:
            out.append(mamba_group_args(spec))
            continue
        if kind is None:
            raise _unsupported(
                "full attention, MLA, sliding window (plain or MLA), chunked local, Mamba, "
                "cross-attention and circular-buffer KV cache groups, not "
                f"{type(spec).__name__} (groups: "
                + ", ".join(type(g.kv_cache_spec).__name__ for g in kv_cache_config.kv_cache_groups)
                + ")"
            )
        role = getattr(group, "role", None)
        if role is not None and getattr(role, "value", role) != "default":
            raise _unsupported(f"the default KV cache group role only, not {role!r} (HiSparse)")
        size, mode = 0, ""
        if isinstance(spec, SlidingWindowSpec):
            size = spec.sliding_window
            if isinstance(spec, SlidingWindowMLASpec) and not spec.prefix_cacheable:
                mode = "bounded_replay"
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            size = spec.attention_chunk_size
        out.append((kind, spec.block_size, size, mode))
    return out


class _HybridCoordinatorView:
    """The members of vLLM's hybrid coordinator the scheduler and tests read."""

    def __init__(self, manager: HybridKVCacheManager, core: _VllmManager, specs: list[Any]) -> None:
        self._manager = manager
        self._core = core
        self.kv_cache_config = manager.kv_cache_config
        self.block_pool = manager.block_pool
        self.hash_block_size = core.hash_block_size
        self.scheduler_block_size = core.scheduler_block_size
        # Partial hash hits: hits land on hash-block boundaries (else scheduler blocks).
        self.enable_partial_hash_hits = bool(core.partial_hits)
        self._cache_hit_alignment_tokens = (
            self.hash_block_size if self.enable_partial_hash_hits else self.scheduler_block_size
        )
        self.dcp_world_size = 1
        self.pcp_world_size = 1
        flags = eagle_group_flags(manager.kv_cache_config)
        self.eagle_group_ids = {g for g, f in enumerate(flags) if f}
        if manager.use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(specs)))
        self.drop_eagle_group_ids = set(self.eagle_group_ids) if manager.use_eagle else set()
        self.num_reprefillable_tokens = manager._num_reprefillable

        self.single_type_managers = tuple(
            (
                CrossAttentionManagerView
                if isinstance(spec, CrossAttentionSpec)
                else GroupManagerView
            )(manager, core, spec, group=g)
            for g, spec in enumerate(specs)
        )
        for view, eagle in zip(self.single_type_managers, core.group_eagle_flags, strict=True):
            view.use_eagle = eagle
            view.cache_hit_alignment_tokens = self._cache_hit_alignment_tokens
        # The spec sets the Rust lookup walks, as vLLM's ``SpecGroup``s.
        self.attention_groups = [
            SpecGroup(
                specs[ids[0]],
                list(ids),
                KVCacheSpecRegistry.get_manager_class(specs[ids[0]]),
                use_eagle,
            )
            for ids, use_eagle in core.spec_sets
        ]
        self.group_block_sizes = tuple(core.group_block_sizes)
        full = [g for g, s in enumerate(specs) if isinstance(s, FullAttentionSpec)]
        self.full_attention_group_id: int | None = full[0] if full else None

    @property
    def retention_interval(self) -> int | None:
        """vLLM's ``prefix_cache_retention_interval`` (None: dense caching)."""
        interval: int | None = self._core.retention_interval
        return interval

    @retention_interval.setter
    def retention_interval(self, interval: int | None) -> None:
        # Set in Rust (sparse caching is decided there); a bad interval changes nothing.
        self._core.set_retention_interval(interval)

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
        hits = [[b.block_id for b in g] for g in new_computed_blocks] or None
        return self._core.num_blocks_to_allocate_groups(
            request_id,
            num_tokens,
            hits,
            total_computed_tokens,
            apply_admission_cap,
            num_tokens_main_model,
            num_encoder_tokens,
            num_local_computed_tokens,
        )

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        return self._manager._find_hit(block_hashes, max_cache_hit_length)

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """vLLM's per-group hits (each spec set on its own, for KV connectors):
        ``(blocks per group, hit tokens per group)``."""
        groups, lens = self._manager._core.find_hit_per_group(block_hashes, max_cache_hit_length)
        return self._manager._wrap(groups), tuple(lens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return self._manager._tables(request_id)

    def remove_skipped_blocks(
        self, request_id: str, processed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self._manager.remove_skipped_blocks(request_id, processed_tokens, num_prompt_tokens)

    def new_step_starts(self) -> None:
        self._core.new_step_starts()


class UnitaryKVCacheCoordinator(_HybridCoordinatorView):
    """The coordinator view of one group that is not full attention (vLLM's class name)."""


# vLLM's scheduler and connectors tell a hybrid coordinator by its class before asking it
# for hybrid-only lookups; the view answers those it implements and refuses the others by
# name, so it is registered as one (no vLLM method is inherited).
HybridKVCacheCoordinator.register(_HybridCoordinatorView)


class HybridKVCacheManager(ManagerCalls):
    """vLLM 0.33's ``KVCacheManager`` over several KV cache groups (module doc)."""

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
        groups = group_args(kv_cache_config)
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise _unsupported(
                "no decode/prefill context parallelism "
                f"(dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size})"
            )
        retention = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
        check_retention_interval(kv_cache_config, scheduler_block_size)
        if watermark < 0.0:
            raise UnsupportedVllmConfigError("watermark must be non-negative")
        eagle_groups = use_eagle or any(eagle_group_flags(kv_cache_config))
        if enable_caching and eagle_groups and scheduler_block_size < num_prefill_lookahead:
            raise UnsupportedVllmConfigError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size"
                f" (={scheduler_block_size}) >= num_speculative_tokens"
                f" (={num_prefill_lookahead})."
            )
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        try:
            self._core = _VllmManager(
                kv_cache_config.num_blocks,
                scheduler_block_size,
                enable_caching=enable_caching,
                log_removed=enable_kv_cache_events or metrics_collector is not None,
                groups=groups,
                hash_block_size=hash_block_size,
                use_eagle=use_eagle,
                max_in_flight_tokens=max_in_flight_tokens,
                max_model_len=max_model_len,
                allow_partial_hash_hits=True,
                eagle_groups=eagle_group_flags(kv_cache_config),
                spec_classes=spec_classes(kv_cache_config),
            )
        except KvIndexError as e:
            raise _unsupported(f"not every KV cache group layout; this one: {e}") from e
        if num_hash_lookahead_tokens:
            self._core.set_hash_lookahead(num_hash_lookahead_tokens)
        spec_blocks = speculative_blocks(kv_cache_config)
        if any(spec_blocks):
            self._core.set_mamba_speculative_blocks(spec_blocks)
        checkpoints = prefill_checkpoints(kv_cache_config)
        if any(a is not None for a in checkpoints):
            self._core.set_mamba_prefill_checkpoints(checkpoints)
        if metrics_collector is not None:
            self._core.log_metrics(True)
        self._core.set_retention_interval(retention)
        # The prompt length goes to Rust before caching: sparse retention reads its
        # replay boundaries from it, full-attention groups larger than the hash block
        # their prompt tail's partial-block prefix entry.
        self._registers_tails = bool(self._core.registers_prompt_tails)
        zeroing = zeroing_groups(kv_cache_config)
        if zeroing:
            self._core.set_zeroing_groups(zeroing)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self._specs = specs
        self._mamba = has_mamba(kv_cache_config)
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(specs)
        self.block_size = scheduler_block_size
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self._num_reprefillable = max(0, num_prefill_lookahead - 1)
        self._group_sizes: list[int] = list(self._core.group_block_sizes)
        self._offloads = BoundaryStateOffloads(
            align_groups(kv_cache_config, enable_caching), self._group_sizes
        )
        self._hash_block_size = self._core.hash_block_size
        self._partial_hits = bool(self._core.partial_hits)
        self._events: list[KVCacheEvent] = []
        self._loose = 0
        self.block_pool: BlockPoolView = BlockPoolView(
            self, self._core, self._hash_block_size, groups=True
        )
        self._blocks = self.block_pool.blocks
        view = _HybridCoordinatorView if len(specs) > 1 else UnitaryKVCacheCoordinator
        self.coordinator = view(self, self._core, specs)
        # vLLM narrows the flag to EAGLE groups, partial hash hits and no re-prefill.
        self.mamba_shared_prefix_checkpoint = (
            enable_mamba_shared_prefix_checkpoint
            and bool(getattr(self.coordinator, "eagle_group_ids", ()))
            and self._partial_hits
            and self._num_reprefillable == 0
        )
        self._core.set_mamba_shared_prefix_checkpoint(self.mamba_shared_prefix_checkpoint)
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(s).value, get_kv_cache_spec_sliding_window(s)) for s in specs
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in specs))

    # ------------------------------------------------------------------ stats

    # ----------------------------------------------------------------- lookups

    def _wrap(self, groups: Sequence[Any]) -> tuple[list[KVCacheBlock], ...]:
        blocks = self._blocks
        return tuple([blocks[i] for i in g.tolist()] for g in groups)

    def _find_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        n, uncached, groups = self._core.find_hit_groups(block_hashes, max_length)
        return self._wrap(groups), n, uncached

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The cached blocks of the request's longest hit (one list per group), the hit
        tokens, and the shared-prefix boundary a lagging group has not cached (or 0)."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        groups, n, uncached = self._find_hit(request.block_hashes, max_cache_hit_length)
        if (
            n > 0
            and self.enable_kv_cache_events
            and getattr(request, "kv_cache_report_mode", "incremental") == "full"
        ):
            for g, blocks in enumerate(groups):
                if not blocks:  # vLLM reports the groups that hit only
                    continue
                end = len(blocks)
                stored = [i for i in range(end) if blocks[i].block_id != 0]
                self._emit_stored(request, g, 0, end, stored)
        return self.create_kv_cache_blocks(groups), n, (n + uncached if uncached else 0)

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """The local hit a KV connector that accepts diverging hybrid hits builds on:
        ``get_computed_blocks`` plus ``hit_diverged``. With Mamba beside full attention,
        the full-attention group's own hit, each group's own blocks and whether a group
        lags behind it; when a group hits deeper than full attention (its blocks were
        evicted), the reconciled hit."""
        fa = self.coordinator.full_attention_group_id
        if not self._mamba or fa is None:
            return *self.get_computed_blocks(request, max_cache_hit_length), False
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        groups, hits = self.coordinator.find_longest_cache_hit_per_group(
            request.block_hashes, max_cache_hit_length
        )
        if any(hit > hits[fa] for hit in hits):
            return *self.get_computed_blocks(request, max_cache_hit_length), False
        num_local = hits[fa]
        return self.create_kv_cache_blocks(groups), num_local, 0, min(hits) < num_local

    def estimate_cached_tokens(self, request: Request) -> int:
        """The fewest tokens any prefix-cacheable group's table of the request holds cached
        blocks for."""
        return int(self._core.estimate_cached_tokens(request.request_id))

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
        """vLLM's ``allocate_slots``: each group's new blocks, or None."""
        if (
            num_new_tokens == 0
            and num_external_computed_tokens == 0
            and num_new_computed_tokens == 0
        ):
            raise InvalidArgumentError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        if new_computed_blocks is not None:
            hit_groups = new_computed_blocks.blocks
        else:
            hit_groups = self.empty_kv_cache_blocks.blocks
        adopt = hit_groups is not self.empty_kv_cache_blocks.blocks
        hits = [[b.block_id for b in g] for g in hit_groups] if adopt else None
        adopt = adopt or num_external_computed_tokens > 0
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local + num_external_computed_tokens, self.max_model_len)
        watermark = (
            self.watermark_blocks if has_scheduled_reqs and request.status in _ADMITTING else 0
        )
        full = min(request.num_tokens, self.max_model_len) if full_sequence_must_fit else None
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        processed = max(0, total - getattr(request, "num_in_flight_tokens", 0))
        caching = self.enable_caching and not delay_cache_blocks
        cache_tokens = min(total + num_new_tokens, request.num_tokens) if caching else None
        self._send_cache_context(request)
        new = self._core.allocate_slots_groups(
            request.request_id,
            hits,
            need_slot,
            num_local,
            num_external_computed_tokens,
            full,
            total if full is not None else None,
            processed,
            reserved_blocks,
            watermark,
            adopt,
            list(skip_zeroing_group_ids),
            request.block_hashes if caching else None,
            cache_tokens,
            self._num_reprefillable,
            main,
            num_encoder_tokens,
        )
        if self.metrics_collector is not None:
            self._replay_metrics(self.metrics_collector)
        if self._partial_hits:
            # A prompt tail's producer offers its copy before this call's cached states.
            for offer in self._core.take_cow_offers():
                self._offloads.add_offer(*offer)
        runs: Sequence[Any] = ()
        if new is not None and (self.enable_kv_cache_events or self._offloads.groups):
            runs = self._core.last_cached_runs
        if runs and self._offloads.groups:
            self._offload_runs(request.request_id, runs)
        if self.enable_kv_cache_events:
            self._emit_runs(request, runs)
        elif self.metrics_collector is not None:
            self._core.take_removed_groups()
        return None if new is None else self.create_kv_cache_blocks(self._wrap(new))

    def _offload_runs(self, request_id: str, runs: Sequence[Any]) -> None:
        tables = [t.tolist() for t in self._core.group_blocks(request_id)]
        sizes = self._group_sizes
        self._offloads.add_runs(
            request_id,
            ((r[0], r[1], r[2]) for r in runs if r[4] == sizes[r[0]] and r[1] < r[2]),
            tables,
            self._core.hash_tokens,
        )

    def _send_cache_context(self, request: Request) -> None:
        """Gives Rust the request's context before a caching step, when prompt tails or
        a retention interval read it: prompt length, shared-prefix junction, computed
        tokens before the step, tokens so far."""
        if self._registers_tails or self._core.retention_interval is not None:
            self._core.set_cache_context(
                request.num_prompt_tokens,
                request.shared_prefix_boundary,
                request.num_computed_tokens,
                request.num_tokens,
            )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache every group's full blocks up to ``num_computed_tokens``, if enabled."""
        if not self.enable_caching:
            return
        self._send_cache_context(request)
        runs = self._core.cache_groups(
            request.request_id, request.block_hashes, num_computed_tokens, self._num_reprefillable
        )
        if self._offloads.groups and runs:
            self._offload_runs(request.request_id, runs)
        if self.enable_kv_cache_events:
            self._emit_runs(request, runs)

    def free(self, request: Request) -> None:
        """Free the request's blocks, each group in reverse order (tail blocks are evicted
        first), group 0 first."""
        if self._offloads.groups:
            self._offloads.drop(request.request_id)
        self._core.free(request.request_id)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """Pop the request's tables and return their blocks, not yet freed."""
        blocks = self._blocks
        if self._offloads.groups:
            self._offloads.drop(request.request_id)
        return [blocks[i] for i in self._core.pop_blocks(request.request_id)]

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free (and null) each group's blocks that fell out of its window."""
        self._core.remove_skipped_blocks(request_id, processed_computed_tokens)
        if self.enable_kv_cache_events:
            self._drain_removed()

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Evict blocks from the prefix cache by id (held blocks keep their references)."""
        ids = list(block_ids)
        collector = self.metrics_collector
        if collector is not None:
            for i in ids:
                if 0 <= i < len(self._blocks):
                    collector.on_block_evicted(self._blocks[i])
        self._core.evict_blocks(ids)
        if self.enable_kv_cache_events:
            self._drain_removed()
        elif collector is not None:
            self._core.take_removed_groups()

    def _replay_metrics(self, collector: KVCacheMetricsCollector) -> None:
        """vLLM's metrics hooks for the blocks the last core call adopted or handed out,
        in its order."""
        blocks = self._blocks
        for b, event in self._core.take_metrics():
            block = blocks[b]
            if event == 1:
                collector.on_block_accessed(block)
                continue
            if event == 2:
                collector.on_block_evicted(block)
                continue
            if self.enable_caching:
                collector.on_block_evicted(block)
            collector.on_block_allocated(block)

    def _take_loose_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        ids = take_loose_ids(self._core, num_blocks)
        if self.metrics_collector is not None:
            self._replay_metrics(self.metrics_collector)
        if self.enable_kv_cache_events:
            self._drain_removed()
        else:
            self._core.take_removed_groups()
        blocks = self._blocks
        return [blocks[i] for i in ids]

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
        if num_cached_blocks >= num_full_blocks:
            return
        stored = cache_loose(
            self._core,
            request.block_hashes,
            [b.block_id for b in blocks],
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        )
        if self.enable_kv_cache_events:
            self._emit_stored(
                request, kv_cache_group_id, num_cached_blocks, num_full_blocks, stored
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
        if block.is_null:
            return None
        hbs = self._hash_block_size
        if block_size % hbs:
            raise InvalidArgumentError(f"block size {block_size} is not a multiple of {hbs}")
        new = register_partial_entry(
            self._core,
            request.block_hashes,
            block.block_id,
            num_tokens,
            kv_cache_group_id,
            hbs,
            replace_existing_hashes,
        )
        if self.enable_kv_cache_events:
            self._drain_removed()
            if new:
                j = num_tokens // hbs
                self._emit_stored(request, kv_cache_group_id, j - 1, j, [j - 1], hbs)
        else:
            self._core.take_removed_groups()
        key: bytes = make_block_hash_with_group_id(
            request.block_hashes[num_tokens // hbs - 1], kv_cache_group_id
        )
        return key

    def take_new_block_ids(self) -> list[int]:
        """Drain the block ids every zeroing group allocated since the last call, group by
        group (empty unless the config needs KV cache zeroing)."""
        return list(self._core.take_new_ids())

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Re-log the request's blocks from ``start_token`` (a multiple of every zeroing
        group's block size) for zeroing."""
        self._core.record_for_zeroing_groups(request_id, start_token)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in vLLM (cascade attention is gone): 0 per group."""
        return [0] * self.num_kv_cache_groups

    # ------------------------------------------------------------------ events

    def _drain_removed(self) -> None:
        self._emit_removed(self._core.take_removed_groups())

    def _emit_removed(self, removed: Iterable[tuple[bytes, int]]) -> None:
        for h, g in removed:
            self._events.append(
                BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(h)], medium=MEDIUM_GPU, group_idx=g
                )
            )

    def _emit_runs(self, request: Request, runs: Sequence[Any]) -> None:
        """The removed keys and ``BlockStored`` events of a call that cached ``runs``, in
        vLLM's order: the keys no run dropped (evictions before the caching), then per run
        the keys it dropped (promoted or replaced partial hashes) and its event."""
        removed = self._core.take_removed_groups()
        covered = [False] * len(removed)
        for run in runs:
            for k in range(run[5], run[6]):
                covered[k] = True
        self._emit_removed(r for r, c in zip(removed, covered, strict=True) if not c)
        for g, start, end, stored, bs, r0, r1 in runs:
            self._emit_removed(removed[r0:r1])
            if start < end:  # a run that only dropped keys (a transient checkpoint) stores none
                self._emit_stored(request, g, start, end, stored.tolist(), bs)

    def _emit_stored(
        self,
        request: Request,
        group: int,
        start: int,
        end: int,
        stored: Sequence[int],
        block_size: int | None = None,
    ) -> None:
        """Buffer the ``BlockStored`` of ``group``'s entries ``stored`` of ``block_size``
        tokens (default: the group's block; a prompt tail's entry is one hash block). Entry
        ``i``'s hash is the last request hash it covers."""
        hashes = request.block_hashes
        bs = self._group_sizes[group] if block_size is None else block_size
        k = bs // self._hash_block_size
        self._append_stored(
            request, group, bs, start, end, stored, lambda i: hashes[(i + 1) * k - 1]
        )

    def take_events(self) -> list[KVCacheEvent]:
        """Take the buffered KV events, each ``BlockStored`` annotated with its group's
        kind and sliding window."""
        if not self.enable_kv_cache_events:
            return []
        events = self._take_raw_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(meta):
                _vllm_manager_module.logger.warning(
                    "Group index `%s` not in KV cache metadata", event.group_idx
                )
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    # ------------------------------------------------------------------ tables

    def _tables(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return self._wrap(self._core.group_blocks(request_id))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks, one list per group."""
        return self.create_kv_cache_blocks(self._tables(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids, one list per group (0: the null block)."""
        return tuple(g.tolist() for g in self._core.group_blocks(request_id))

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Each attention group's block ids covering the request's first
        ``num_computed_tokens``; the other groups' (Mamba state, cross-attention) whole."""
        return tuple(
            ids[: _cdiv(num_computed_tokens, bs)]
            if isinstance(spec, AttentionSpec)
            and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec))
            else ids
            for ids, bs, spec in zip(
                self.get_block_ids(request_id), self._group_sizes, self._specs, strict=True
            )
        )

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        """A lookup result cut at a token count aligned to every group's block size."""
        out: list[list[KVCacheBlock]] = []
        for group, bs, spec in zip(blocks.blocks, self._group_sizes, self._specs, strict=True):
            if not spec.prefix_cacheable:
                # A group that is not prefix-cacheable never has hit blocks.
                if group:
                    raise InvalidArgumentError("a group that is not prefix-cacheable has no hits")
                out.append([])
                continue
            n = num_computed_tokens // bs
            if isinstance(spec, MambaSpec):
                # An external hit can supply the final Mamba state past the local one.
                n = min(n, len(group))
            if num_computed_tokens % bs != 0 or n > len(group):
                raise ComputedBlocksTruncationError(
                    f"cannot truncate {len(group)} blocks of {bs} tokens at {num_computed_tokens}"
                )
            out.append(list(group[:n]))
        return self.create_kv_cache_blocks(tuple(out))

    # ------------------------------------------------------- worker hand-offs

    def take_kv_cache_block_copies(self) -> tuple[list[KVCacheBlockCopy], list[KVCacheBlock]]:
        """Drains the copy-on-write copies queued by partial hash hits (a hit ending
        inside a block copies it; so does a Mamba prompt tail's producer): the copies
        and their endpoints, which hold one reference each until the caller frees
        them once the copies ran."""
        pending = [
            pair
            for m in self.coordinator.single_type_managers
            for pair in m.take_pending_cow_copies()
        ]
        copies = [
            KVCacheBlockCopy(src_block_id=s.block_id, dst_block_id=d.block_id) for s, d in pending
        ]
        return copies, [b for pair in pending for b in pair]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Drains the state blocks align-mode Mamba groups cached since the last call,
        and the copies a prompt tail's producer made:
        ``{request_id: [(group_id, block_id, boundary_tokens), ...]}``."""
        return self._offloads.take()

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """The Mamba prompt tails a finishing request produced and still holds in its
        table, ``[(group_id, block_id, boundary_tokens)]``, when nothing past the
        boundary was computed or is in flight; forgotten either way."""
        if not self._partial_hits:
            return []
        in_flight = getattr(request, "num_in_flight_tokens", 0)
        return [
            (g, b, t)
            for g, b, t in self._core.finalize_partial_tails(
                request.request_id, request.num_computed_tokens, in_flight
            )
        ]

    def new_step_starts(self) -> None:
        """A new scheduler step starts: Mamba states cached in the last one become hits."""
        self._core.new_step_starts()
