"""``KvindexRadixCache``: SGLang 0.5.23's ``BasePrefixCache`` on kvindex's Rust radix tree.

Why this seam. SGLang offers two: ``register_radix_cache_backend`` (the whole
``BasePrefixCache``, selected with ``--radix-cache-backend``) and the tree-core registry
behind ``UnifiedRadixCache``. The scheduler never talks to a tree core: every call it makes
(``match_prefix``, ``checkpoint``, ``lock`` / ``unlock``, ``free_kv_row``, ``on_release``,
``evict`` / ``evict_for_alloc``, ``take_events``, the size queries, the ``supports_*``
flags, ``dfs_weight_order``, ``touch_prefix``) goes to the ``BasePrefixCache``, and a
tree-core backend would still pay ``UnifiedRadixCache``'s Python action pump (one
``CacheAction`` round trip per walk step) on each of them. The cache backend replaces that
whole layer, so a request costs one Rust call per operation. The tree core's extras
(HiCache, storage, SWA/Mamba components, sessions) are not part of a full-attention cache.

What it keeps from SGLang. The slots are SGLang's: ``token_to_kv_pool_allocator`` hands
them out and gets back exactly the slots SGLang's own ``RadixCache`` frees (the duplicates
an insert exposes, each evicted leaf's slots in eviction order), so a differential run of
one request stream sees the same device indices. KV events go through SGLang's own
``KVCacheEventRecorder``: the tree reports each new leaf and each evicted leaf (its own
chained page hashes name them), and the adapter replays them as SGLang's events, hashing
pages with SGLang's functions, so routers see SGLang's ``BlockStored`` / ``BlockRemoved``
(``medium`` ``GPU``) byte for byte.

Boundary costs: each hot call (``match_prefix``, ``lock`` / ``unlock``,
``path_device_indices``, ``insert``, ``evict``) is one call into ``RadixTree`` methods made
for this seam, which take and return what SGLang needs: the key's ``array('q')`` is viewed
as int64 without a copy (the tree cuts it to whole pages), a value tensor is read in place
(copied to the host once off CPU), slot arrays come back as int64 arrays that become
tensors without a copy, an eviction returns each leaf's slots (or, for SGLang's paged
allocator, its page ids) in one call; nothing runs per token in Python. What is left per
call is SGLang's own objects (``MatchResult``, ``TreeLock``, ``InsertResult``, the
allocator's frees), which any backend behind this seam builds.

Not supported (refused at construction with :class:`UnsupportedSglangFeatureError`):
hybrid SWA / Mamba models, EAGLE bigram keys, HiCache, session radix cache, T-LRU.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sglang.srt.disaggregation.kv_events import (
    BlockRemoved,
    StorageMedium,
    namespaced_block_hash,
)
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    TreeLock,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.utils import hash_str_to_int64

import kvindex
from kvindex.exceptions import KvIndexError

from .version import check_sglang_version

__all__ = ["KvindexRadixCache", "UnsupportedSglangFeatureError", "kvindex_cache_factory"]

_ROOT = 0
_INT64_MAX = (1 << 63) - 1
# The receipt every lock carries: this cache's ``dec_lock_ref`` needs none of its fields
# (SGLang reads them only in its unified tree's components).
_RECEIPT = DecLockRefParams()


class UnsupportedSglangFeatureError(KvIndexError, NotImplementedError):
    """The SGLang configuration asks for a cache feature kvindex's backend does not have."""


class _EventNode:
    """The node shape SGLang's ``KVCacheEventRecorder`` reads (key, parent, page hashes)."""

    __slots__ = ("event_hash_value", "hash_value", "key", "parent")

    def __init__(
        self,
        key: Any,
        parent: _EventNode | None,
        hash_value: list[str] | None,
        event_hash_value: list[str] | None,
    ) -> None:
        self.key = key
        self.parent = parent
        self.hash_value = hash_value
        self.event_hash_value = event_hash_value


def _unsupported(params: CacheInitParams) -> list[str]:
    found = []
    components = tuple(params.tree_components or (ComponentType.FULL,))
    if ComponentType.SWA in components or params.sliding_window_size is not None:
        found.append("hybrid sliding-window (SWA) models")
    if ComponentType.MAMBA in components:
        found.append("hybrid Mamba models")
    other = [
        c
        for c in components
        if c not in (ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA)
    ]
    if other:
        found.append("tree components " + ", ".join(str(c) for c in other))
    if params.is_eagle:
        found.append("EAGLE speculative decoding (bigram keys)")
    if params.enable_session_radix_cache:
        found.append("--enable-session-radix-cache")
    if str(params.eviction_policy).lower() not in kvindex.RADIX_POLICIES:
        found.append(f"--radix-eviction-policy {params.eviction_policy}")
    return found


class KvindexRadixCache(BasePrefixCache):
    """SGLang's radix prefix cache with kvindex's Rust tree holding the tree.

    Node handles (``req.last_node``, ``MatchResult.last_device_node``) are the tree's int
    handles; the root is ``0``.
    """

    def __init__(self, params: CacheInitParams) -> None:
        check_sglang_version()
        unsupported = _unsupported(params)
        if unsupported:
            raise UnsupportedSglangFeatureError(
                "kvindex's SGLang cache backend does not support "
                + "; ".join(unsupported)
                + ". Run SGLang without --radix-cache-backend kvindex for this model"
            )
        self.disable = bool(params.disable)
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = int(params.page_size)
        self.is_eagle = False
        self.eviction_policy = str(params.eviction_policy).lower()
        self.kv_events = KVCacheEventRecorder(
            enabled=bool(params.enable_kv_cache_events) and not self.disable,
            page_size=self.page_size,
            dynamo_format=params.dynamo_kv_event_format,
            lora_names=params.kv_event_lora_names,
        )
        if params.enable_metrics:
            self.init_metrics_collector()
        dev = getattr(self.token_to_kv_pool_allocator, "device", None)
        self.device = (
            torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        )
        self._on_cpu = self.device.type == "cpu"
        alloc = self.token_to_kv_pool_allocator
        # SGLang's paged allocator frees a page-aligned slot run as its pages
        # (``free_segment`` = ``free_page_ids(slots[::ps] // ps)``): evictions hand it the
        # tree's page ids directly. Any other allocator gets the slots.
        self._free_pages = (
            type(alloc).free_segment is PagedTokenToKVPoolAllocator.free_segment
            and isinstance(alloc, PagedTokenToKVPoolAllocator)
            and self.page_size > 1
        )
        config = dict(params.eviction_policy_config or {})
        slru_threshold = int(config.pop("protected_threshold", 2))
        if config:
            raise UnsupportedSglangFeatureError(
                f"kvindex's SGLang cache backend has no eviction policy option {sorted(config)}"
            )
        self._tree = kvindex.RadixTree(
            self.page_size,
            policy="lru" if self.disable else self.eviction_policy,
            slru_threshold=slru_threshold,
            enable_events=self.kv_events.enabled,
        )
        self._namespaces: dict[tuple[str | None, str | None], str | None] = {(None, None): None}
        self._namespace_keys: dict[str | None, tuple[str | None, str | None]] = {None: (None, None)}
        # tree page hash -> (SGLang hash_value, SGLang event_hash_value, published int64 hash)
        self._page_hashes: dict[int, tuple[str, str | None, int]] = {}
        self.root_node = _ROOT
        self.reset()

    # ----- helpers -----

    def _namespace(self, key: Any) -> str | None:
        if key.extra_key is None and key.cache_salt is None:
            return None
        pair = (key.extra_key, key.cache_salt)
        ns = self._namespaces.get(pair)
        if ns is None and pair != (None, None):
            ns = json.dumps(list(pair))
            self._namespaces[pair] = ns
            self._namespace_keys[ns] = pair
        return ns

    @staticmethod
    def _tokens(key: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The key's tokens (``limit`` applied), viewed in place when they are an ``array('q')``
        (the hot calls inline the common case: no limit, an ``array('q')``)."""
        raw = key.token_ids
        limit = key.limit
        if limit is not None and limit < len(raw):
            raw = raw[:limit]
        if type(raw) is array and raw.typecode == "q":
            return np.frombuffer(raw, np.int64)
        return np.asarray(raw, dtype=np.int64)

    def _slots_tensor(self, slots: np.ndarray[Any, Any]) -> torch.Tensor:
        """An int64 slot array as a tensor on the cache's device (no copy on CPU)."""
        t = torch.from_numpy(slots if slots.dtype == np.int64 else slots.astype(np.int64))
        return t if self._on_cpu else t.to(self.device)

    def _empty_match(self) -> MatchResult:
        return MatchResult(
            device_prefix_len=0, last_device_node=_ROOT, last_host_node=_ROOT, best_match_node=_ROOT
        )

    def _replay_events(self) -> None:
        """Turns the tree's leaf events into SGLang's, in order, through SGLang's recorder."""
        if not self.kv_events.enabled:
            return
        recorder = self.kv_events
        for event in self._tree.take_events():
            if isinstance(event, kvindex.BlockStored):
                extra = event.extra_keys
                ns = extra[0][0] if extra and extra[0] else None
                extra_key, cache_salt = self._namespace_keys[ns]
                parent: _EventNode
                if event.parent_block_hash is None:
                    parent = _EventNode(RadixKey(array("q"), None), None, [], None)
                else:
                    h, eh, _ = self._page_hashes[event.parent_block_hash]
                    grand = _EventNode(RadixKey(array("q"), None), None, [], None)
                    parent = _EventNode(
                        RadixKey(
                            array("q", [0] * self.page_size), extra_key, cache_salt=cache_salt
                        ),
                        grand,
                        [h],
                        [eh] if eh is not None else None,
                    )
                node = _EventNode(
                    RadixKey(array("q", event.token_ids), extra_key, cache_salt=cache_salt),
                    parent,
                    None,
                    None,
                )
                recorder.record_store(node)
                seed = recorder._namespace_seed(node)
                published = [
                    namespaced_block_hash(hash_str_to_int64(h), namespace_seed=seed)
                    for h in recorder._node_event_hash_values(node)
                ]
                hashes = node.hash_value or []
                event_hashes = node.event_hash_value
                for i, page_hash in enumerate(event.block_hashes):
                    self._page_hashes[page_hash] = (
                        hashes[i],
                        event_hashes[i] if event_hashes is not None else None,
                        published[i],
                    )
            elif isinstance(event, kvindex.BlockRemoved):
                removed = [self._page_hashes.pop(h)[2] for h in event.block_hashes]
                if removed:
                    recorder.enqueue(BlockRemoved(block_hashes=removed, medium=StorageMedium.GPU))

    # ----- BasePrefixCache -----

    def reset(self) -> None:
        if self.kv_events.enabled:
            self._replay_events()
        self._tree.reset()
        if self.kv_events.enabled:
            self._tree.take_events()
        self._page_hashes.clear()
        self._empty_device_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.kv_events.record_all_cleared()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        if self.disable:
            return self._empty_match()
        key = params.key
        raw = key.token_ids
        if key.limit is None and type(raw) is array and raw.typecode == "q":
            tokens = np.frombuffer(raw, np.int64)
        else:
            tokens = self._tokens(key)
        ns = None if key.extra_key is None and key.cache_salt is None else self._namespace(key)
        # The tree cuts the tokens to whole pages; a key under one page hits nothing.
        hit, node = self._tree.match_node(tokens, ns)
        # (device_prefix_len, last_device_node, last_host_node, best_match_node)
        return MatchResult(hit, node, node, node)

    def touch_prefix(self, key: Any) -> None:
        if self.disable:
            return
        self._tree.match_node(self._tokens(key), self._namespace(key))

    def insert(self, params: InsertParams) -> InsertResult:
        """Inserts ``params.key`` with ``params.value`` (one slot per token); the result's
        ``last_device_node`` is None (``checkpoint`` re-matches, as SGLang's does)."""
        if self.disable:
            return InsertResult(prefix_len=0)
        key = params.key
        value = params.value
        if value is None:
            raise UnsupportedSglangFeatureError(
                "kvindex's SGLang cache needs the KV slots to insert"
            )
        if not value.is_cpu:
            value = value.cpu()
        if not value.is_contiguous():
            value = value.contiguous()
        raw = key.token_ids
        if key.limit is None and type(raw) is array and raw.typecode == "q":
            tokens = np.frombuffer(raw, np.int64)
        else:
            tokens = self._tokens(key)
        ns = None if key.extra_key is None and key.cache_salt is None else self._namespace(key)
        priority = params.priority
        inserted_len = params.inserted_len
        # The tree cuts the key to whole pages and reads the slots those pages need
        # (full attention only: a hybrid component's arguments, swa_evicted_len and
        # mamba_state, go through the general RadixTree.insert).
        prefix_len = self._tree.insert_len(
            tokens,
            value.numpy(),
            ns,
            priority=min(int(priority), _INT64_MAX) if priority else 0,
            inserted_len=inserted_len if inserted_len > 0 else 0,
        )
        if self.kv_events.enabled:
            self._replay_events()
        return InsertResult(prefix_len=prefix_len)

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Puts the request's KV up to ``up_to`` into the tree (page-aligned; the prompt
        boundary becomes a node of its own, one priority step up), frees the request's
        copies of what was already cached, repoints its row onto the tree's slots and
        moves its lock to the node the sequence ends on."""
        if self.disable:
            return
        ps = self.page_size
        token_ids = req.full_untruncated_fill_ids[:up_to]
        kv = req.kv
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx, : len(token_ids)]
        radix_key = RadixKey(token_ids, req.extra_key, cache_salt=req.cache_salt).page_aligned(ps)
        floor = kv.swa_evict_floor
        if floor > 0:
            radix_key = radix_key[: -(-floor // ps) * ps]
        key_len = len(radix_key)
        values = row[:key_len].to(dtype=torch.int64, copy=True)
        priority = req.priority or 0
        result = self.insert(
            InsertParams(
                key=radix_key, value=values, inserted_len=kv.cache_inserted_len, priority=priority
            )
        )
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        prompt_key = RadixKey(
            token_ids[: len(req.origin_input_ids)], req.extra_key, cache_salt=req.cache_salt
        ).page_aligned(ps)
        if 0 < len(prompt_key) < key_len:
            self.insert(
                InsertParams(
                    key=prompt_key,
                    value=values[: len(prompt_key)],
                    inserted_len=len(prompt_key),
                    priority=min(priority + 1, _INT64_MAX),
                )
            )
        protected = kv.cache_protected_len
        self.token_to_kv_pool_allocator.free_segment(
            row[protected : result.prefix_len], start_pos=protected
        )

        hit, node = self._tree.match_node(self._tokens(radix_key), self._namespace(radix_key))
        if hit != key_len:
            raise KvIndexError(f"checkpoint matched {hit} of {key_len} inserted tokens")
        new_indices = self._slots_tensor(self._tree.path_slots_i64(node))
        self.req_to_token_pool.write(
            (kv.req_pool_idx, slice(protected, len(new_indices))), new_indices[protected:]
        )
        kv.cache_protected_len = len(new_indices)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable or params.num_tokens <= 0:
            return EvictResult()
        start = time.perf_counter() if self.metrics_collector is not None else 0.0
        # One free per leaf: SGLang's allocators free each evicted leaf on its own (the
        # paged one puts freed pages first), so the free list, and with it every later
        # allocation, matches SGLang's cache only leaf by leaf.
        alloc = self.token_to_kv_pool_allocator
        evicted = 0
        if self._free_pages:
            free_pages = alloc.free_page_ids
            to_torch = torch.from_numpy
            ps = self.page_size
            for pages in self._tree.evict_leaves(params.num_tokens, pages=True):
                free_pages(to_torch(pages) if self._on_cpu else to_torch(pages).to(self.device))
                evicted += len(pages) * ps
        else:
            free = alloc.free_segment
            for slots in self._tree.evict_leaves(params.num_tokens):
                free(self._slots_tensor(slots), start_pos=0)
                evicted += len(slots)
        if self.kv_events.enabled:
            self._replay_events()
        if self.metrics_collector is not None:
            self.update_eviction_metrics(evicted, start)
        return EvictResult(num_tokens_evicted=evicted)

    def lock(self, node: Any) -> TreeLock:
        """``inc_lock_ref`` without the size delta (``lock`` drops it) in one tree call."""
        if not self.disable:
            self._tree.lock(node)
        return TreeLock(node, _RECEIPT)

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None and not self.disable:
            self._tree.unlock(lock.node)

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        if self.disable:
            return IncLockRefResult(delta=0)
        before = self._tree.evictable_size
        self._tree.lock(node)
        return IncLockRefResult(delta=self._tree.evictable_size - before)

    def dec_lock_ref(self, node: Any, params: DecLockRefParams | None = None) -> DecLockRefResult:
        if self.disable:
            return DecLockRefResult(delta=0)
        before = self._tree.evictable_size
        self._tree.unlock(node)
        return DecLockRefResult(delta=self._tree.evictable_size - before)

    def path_device_indices(self, node: Any) -> torch.Tensor:
        if node == _ROOT:
            return self._empty_device_indices
        slots = torch.from_numpy(self._tree.path_slots_i64(node))
        return slots if self._on_cpu else slots.to(self.device)

    def is_root(self, node: Any) -> bool:
        return bool(node == _ROOT)

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """Request indices grouped depth first by shared cached prefix, heavier subtrees
        first (SGLang's ``dfs-weight`` policy); read off the paths' slot runs."""
        paths = [
            self._tree.path_slots(h) if h != _ROOT else np.empty(0, np.int32) for h in node_handles
        ]
        order = list(range(len(paths)))

        def build(idx: list[int], depth: int) -> list[int]:
            here = [i for i in idx if len(paths[i]) == depth]
            groups: dict[int, list[int]] = {}
            for i in idx:
                if len(paths[i]) > depth:
                    groups.setdefault(int(paths[i][depth]), []).append(i)
            out = list(here)
            for members in sorted(groups.values(), key=lambda m: -len(m)):
                common = min(len(paths[i]) for i in members)
                ref = paths[members[0]]
                d = depth + 1
                while d < common and all(paths[i][d] == ref[d] for i in members):
                    d += 1
                out.extend(build(members, d))
            return out

        return build(order, 0)

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def evictable_size(self) -> int:
        return int(self._tree.evictable_size)

    def protected_size(self) -> int:
        return int(self._tree.protected_size)

    def total_size(self) -> int:
        return int(self._tree.total_size)

    def pretty_print(self) -> None:
        print(self._tree.dump())
        print(f"#tokens: {self.total_size()}")

    def take_events(self) -> list[Any]:
        self._replay_events()
        return list(self.kv_events.take())

    def check_invariants(self) -> None:
        """The tree's internal invariants (``InvariantViolation`` if broken)."""
        self._tree.check_invariants()


def kvindex_cache_factory(ctx: Any) -> KvindexRadixCache:
    """The ``register_radix_cache_backend`` factory: builds the cache from SGLang's
    ``TreeCacheBuildContext``, refusing what the backend does not support by name."""
    unsupported = []
    if ctx.is_hybrid_swa:
        unsupported.append("hybrid sliding-window (SWA) models")
    if ctx.is_hybrid_ssm:
        unsupported.append("hybrid Mamba models")
    if ctx.enable_hierarchical_cache:
        unsupported.append("--enable-hierarchical-cache (HiCache)")
    if getattr(ctx, "is_dsa", False):
        unsupported.append("DeepSeek sparse attention")
    if unsupported:
        raise UnsupportedSglangFeatureError(
            "kvindex's SGLang cache backend does not support "
            + "; ".join(unsupported)
            + ". Run SGLang without --radix-cache-backend kvindex for this model"
        )
    return KvindexRadixCache(ctx.params)
