"""KV cache zeroing, retention intervals and blocks held by no request for
:class:`~kvindex.integrations.vllm.hybrid.HybridKVCacheManager`: the vLLM-facing half of
the Rust manager's zeroing logs, sparse sliding-window caching and loose blocks.

- Zeroing (``needs_kv_cache_zeroing``): every attention group logs the ids of the blocks
  it allocates, drained group by group (vLLM's ``take_new_block_ids``) or re-logged from a
  token position (``record_blocks_for_zeroing``).
- Retention (``prefix_cache_retention_interval``): vLLM's validation at construction, then
  each caching step tells the Rust manager the request's prompt length and shared-prefix
  junction, which decide the sliding-window tails it keeps.
- ``block_pool.get_new_blocks`` / ``cache_full_blocks`` / ``cache_partial_block``: blocks
  taken off the free queue for no request, a caller's block list cached for one group, and
  a partial-block prefix entry registered on one block, with their events.
- EAGLE groups (``is_eagle_group``): the per-group flags the Rust layout applies.
- Cross-attention groups: their single-type manager view, registered as vLLM's
  ``CrossAttentionManager`` (the scheduler and tests tell it by class).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.core.single_type_kv_cache_manager import CrossAttentionManager
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    CircularBufferSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)

from kvindex._core import _VllmManager
from kvindex.exceptions import InvalidArgumentError

from .blocks import GroupManagerView

__all__ = [
    "CrossAttentionManagerView",
    "cache_loose",
    "check_retention_interval",
    "register_partial_entry",
    "eagle_group_flags",
    "take_loose_ids",
    "zeroing_groups",
]


def check_retention_interval(kv_cache_config: KVCacheConfig, scheduler_block_size: int) -> None:
    """vLLM's construction-time check of ``prefix_cache_retention_interval`` (None: dense;
    0: latest only; a positive multiple of the scheduler block size): raises
    :class:`~kvindex.exceptions.InvalidArgumentError` (a ``ValueError``) with vLLM's
    message otherwise."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None:
        return
    windowed = any(
        isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec))
        for g in kv_cache_config.kv_cache_groups
    )
    if not windowed:
        if interval == 0:
            return
        raise InvalidArgumentError(
            "prefix_cache_retention_interval is set but this model has no sliding-window or "
            "Mamba KV cache group, so retention has no effect. Set it to 0 (it only applies "
            "to sliding-window and Mamba attention)."
        )
    if interval < 0 or interval % scheduler_block_size != 0:
        raise InvalidArgumentError(
            f"prefix_cache_retention_interval ({interval}) must be non-negative and a "
            f"multiple of scheduler_block_size ({scheduler_block_size})."
        )


def eagle_group_flags(kv_cache_config: KVCacheConfig) -> list[bool]:
    """Each group's ``is_eagle_group`` flag, in group order: with EAGLE on, the flagged
    groups drop the EAGLE block (every group when none is flagged), as vLLM's coordinator
    decides and kvindex's layout applies per spec set."""
    return [bool(getattr(g, "is_eagle_group", False)) for g in kv_cache_config.kv_cache_groups]


def spec_classes(kv_cache_config: KVCacheConfig) -> list[int]:
    """Per group, the first group whose spec equals its own (vLLM's spec equality, dtype
    and head shape included): vLLM's coordinator puts two groups in one spec set only when
    their specs are equal, and so does kvindex's layout with these classes."""
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    return [next(j for j in range(i + 1) if specs[j] == specs[i]) for i in range(len(specs))]


def zeroing_groups(kv_cache_config: KVCacheConfig) -> list[int]:
    """The groups whose new blocks the worker zeroes: attention groups, when the config
    needs KV cache zeroing (none otherwise)."""
    if not getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return []
    return [
        g
        for g, group in enumerate(kv_cache_config.kv_cache_groups)
        if isinstance(group.kv_cache_spec, AttentionSpec)
        and not isinstance(group.kv_cache_spec, CircularBufferSpec)
    ]


def take_loose_ids(core: _VllmManager, num_blocks: int) -> list[int]:
    """``num_blocks`` free block ids held by no request (vLLM's ``get_new_blocks``)."""
    if num_blocks > core.num_free_blocks:
        raise InvalidArgumentError(f"Cannot get {num_blocks} free blocks from the pool")
    return core.take_loose(num_blocks)


def cache_loose(
    core: _VllmManager,
    block_hashes: Sequence[bytes],
    block_ids: Sequence[int],
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    group: int,
    block_mask: Sequence[bool] | None,
) -> list[int]:
    """vLLM's ``block_pool.cache_full_blocks`` over a caller's blocks: the table indices
    cached (null and masked-out blocks skipped)."""
    sizes = core.group_block_sizes
    if not 0 <= group < len(sizes):
        raise InvalidArgumentError(f"KV cache group {group} out of range")
    if block_size != sizes[group]:
        raise InvalidArgumentError(
            f"block_size {block_size} is not group {group}'s block size {sizes[group]}"
        )
    ids: list[Any] = list(block_ids)
    if block_mask is not None:
        span = num_full_blocks - num_cached_blocks
        if len(block_mask) != span:
            raise InvalidArgumentError(f"block_mask has {len(block_mask)} entries, not {span}")
        for i, keep in enumerate(block_mask):
            if not keep and num_cached_blocks + i < len(ids):
                ids[num_cached_blocks + i] = 0
    return core.cache_loose(ids, group, num_cached_blocks, num_full_blocks, block_hashes)


class CrossAttentionManagerView(GroupManagerView):
    """A cross-attention group's view: its table holds blocks for the encoder tokens
    scheduled (the Rust manager decides); registered as vLLM's ``CrossAttentionManager``."""


CrossAttentionManager.register(CrossAttentionManagerView)


def register_partial_entry(
    core: _VllmManager,
    block_hashes: Sequence[bytes],
    block_id: int,
    num_tokens: int,
    group: int,
    hash_block_size: int,
    replace: bool,
) -> bool:
    """vLLM's ``BlockPool.cache_partial_block``: block ``block_id`` takes the entry of the
    request's first ``num_tokens`` tokens in ``group`` — as its own hash when it has none,
    else beside it. Every key it had is dropped first (logged) with ``replace``, or when its
    own hash covers fewer tokens. Returns whether the entry is new (its ``BlockStored`` is
    due). Raises :class:`~kvindex.exceptions.InvalidArgumentError` (state unchanged) for a
    boundary that is not a hash boundary of the request, the null block, or an entry beside
    a longer hash in a group that keeps none."""
    units = num_tokens // hash_block_size
    if num_tokens <= 0 or num_tokens % hash_block_size or units > len(block_hashes):
        raise InvalidArgumentError(
            f"{num_tokens} tokens is not a hash boundary of the request's "
            f"{len(block_hashes)} hashes of {hash_block_size} tokens"
        )
    if block_id == 0:
        raise InvalidArgumentError("the null block takes no prefix-cache entry")
    h = bytes(block_hashes[units - 1])
    already = core.holds_key(h, group, block_id)
    tokens = core.hash_tokens(block_id)
    drop = replace or (not already and tokens is not None and tokens < num_tokens)
    if not drop and not already and tokens is not None and tokens > num_tokens:
        # The entry goes beside the block's own hash: only prompt-tail groups keep such keys.
        if not core.restore_cached_key(h, group, block_id, False, num_tokens):
            raise InvalidArgumentError(
                f"group {group} keeps no partial-block entry beside a block's own hash"
            )
        return True
    if drop and tokens is not None:
        core.evict_blocks([block_id])
    if not drop and already:
        return False
    if not core.restore_cached_key(h, group, block_id, True, num_tokens):
        raise InvalidArgumentError(f"group {group} is not prefix-cacheable")
    return True
