"""kvindex's hybrid radix tree (``RadixTree(1, sliding_window=W)``) against SGLang 0.5.23's
own ``UnifiedRadixCache`` with the full and SWA components, on CPU (SWAKVPool +
SWATokenToKVPoolAllocator, the Python tree core): one randomised stream of inserts (with
the caller's SWA-evicted prefix), matches, full and SWA evictions and locks, driven on
both; after every operation the hits, the slots matched, the evicted token counts, both
trees' full / SWA evictable and protected sizes, and SGLang's allocator (full and SWA
slots held) against kvindex's tree (its tokens, its live SWA tokens, and the slots its
frees leave held) must agree. SGLang's unified
insert frees the caller's duplicates itself; kvindex returns them (``to_free``), so the
caller here frees nothing on SGLang's side.

The minimal CPU path: ``CacheInitParams(tree_components=(FULL, SWA),
sliding_window_size=W)`` over ``SWAKVPool(size, size_swa, ...)`` and
``SWATokenToKVPoolAllocator(..., kvcache=pool)``, page size 1, nothing CUDA-only.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import numpy as np
import pytest
from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang_driver import release_newest_lock, swa_allocator

import kvindex

SIZE, SIZE_SWA = 400, 400


def key(tokens: list[int]) -> RadixKey:
    return RadixKey(array("q", tokens), None)


class Pair:
    """The two trees and SGLang's allocator, with the slots kvindex says are held."""

    def __init__(self, window: int) -> None:
        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
        rtp = ReqToTokenPool(size=4, max_context_len=512, device="cpu", enable_memory_saver=False)
        self.alloc = swa_allocator(SIZE, SIZE_SWA, 1)
        params = CacheInitParams(
            req_to_token_pool=rtp,
            token_to_kv_pool_allocator=self.alloc,
            page_size=1,
            disable=False,
            sliding_window_size=window,
            tree_components=(ComponentType.FULL, ComponentType.SWA),
        )
        self.sgl = UnifiedRadixCache(params=params)
        self.kv = kvindex.RadixTree(1, sliding_window=window)
        self.full: set[int] = set()  # slots held, per the frees kvindex hands back
        self.locks: list[tuple[int, Any, Any]] = []

    def drain(self) -> None:
        _, full_only, _, _ = self.kv.take_component_frees()
        self.full -= set(full_only.tolist())

    def freed(self, slots: np.ndarray) -> None:
        self.full -= set(slots.tolist())

    def compare(self) -> None:
        self.kv.check_invariants()
        kv, sgl = self.kv, self.sgl
        assert (kv.evictable_size, kv.protected_size) == (
            sgl.full_evictable_size(),
            sgl.full_protected_size(),
        )
        assert (kv.swa_evictable_size, kv.swa_protected_size) == (
            sgl.swa_evictable_size(),
            sgl.swa_protected_size(),
        )
        # The driver keeps no slot after an insert (the tree takes it or it is freed),
        # so SGLang's allocator holds exactly what kvindex's tree holds.
        assert SIZE - self.alloc.full_available_size() == kv.total_size == len(self.full)
        live = kv.swa_evictable_size + kv.swa_protected_size
        assert SIZE_SWA - self.alloc.swa_available_size() == live

    def insert(self, tokens: list[int], swa_evicted: int) -> None:
        n = len(tokens)
        if self.alloc.full_available_size() < n or self.alloc.swa_available_size() < n:
            return
        value = self.alloc.alloc(n)
        assert value is not None
        slots = value.numpy().astype(np.int32)
        self.full |= set(slots.tolist())
        # The caller freed the SWA KV of its first swa_evicted tokens already.
        if swa_evicted:
            self.alloc.free_swa(value[:swa_evicted])
        r = self.kv.insert(np.array(tokens, dtype=np.int32), slots, swa_evicted_len=swa_evicted)
        s = self.sgl.insert(
            InsertParams(
                key=key(tokens),
                value=value,
                component_evicted_seqlens={ComponentType.SWA: swa_evicted},
            )
        )
        assert r.prefix_len == s.prefix_len
        self.drain()
        # What the tree did not take goes back: kvindex hands it to the caller, SGLang's
        # unified insert frees it itself (a cache action); the counts must agree.
        self.freed(r.to_free)

    def match(self, tokens: list[int], lock: bool) -> None:
        m = self.kv.match_prefix(np.array(tokens, dtype=np.int32))
        s = self.sgl.match_prefix(MatchPrefixParams(key=key(tokens)))
        assert m.hit_len == s.device_prefix_len
        assert m.slots.tolist() == self.sgl.path_device_indices(s.last_device_node).tolist()
        if lock and m.hit_len:
            self.kv.lock(m.node)
            receipt = self.sgl.inc_lock_ref(s.last_device_node)
            self.locks.append((m.node, s.last_device_node, receipt))

    def unlock(self, i: int) -> None:
        release_newest_lock(self.locks, i, self.kv, self.sgl)

    def evict(self, n: int, swa: bool) -> None:
        if swa:
            freed = self.kv.evict_swa(n)
            e = self.sgl.evict(EvictParams(swa_num_tokens=n))
        else:
            freed = self.kv.evict(n)
            e = self.sgl.evict(EvictParams(num_tokens=n))
            assert len(freed) == e.num_tokens_evicted
        self.freed(freed)
        self.drain()


def run_stream(window: int, seed: int, *, tombstones: bool, swa_evictions: bool) -> None:
    """One stream; ``tombstones``: inserts bring a random SWA-evicted prefix (else 0)."""
    rng = random.Random(seed * 31 + window)
    pair = Pair(window)
    prefixes = [[rng.randrange(3) for _ in range(24)] for _ in range(3)]

    def seq() -> list[int]:
        p = prefixes[rng.randrange(3)][: rng.randrange(1, 24)]
        return p + [rng.randrange(3) for _ in range(rng.randrange(0, 8))]

    for _ in range(250):
        op = rng.random()
        if op < 0.35:
            t = seq()
            evicted = rng.randrange(len(t) + 1)
            pair.insert(t, evicted if tombstones else 0)
        elif op < 0.65:
            pair.match(seq(), lock=rng.random() < 0.3)
        elif op < 0.75 and pair.locks:
            pair.unlock(rng.randrange(len(pair.locks)))
        else:
            pair.evict(rng.randrange(1, 12), swa=swa_evictions and rng.random() < 0.5)
        pair.compare()
    while pair.locks:
        pair.unlock(0)
    pair.compare()


@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("seed", range(4))
def test_swa_tree_matches_sglang_without_inserted_tombstones(window: int, seed: int) -> None:
    """Inserts (no SWA-evicted prefix), matches with the window validator, SWA window
    locks and full evictions: every result and size agrees with SGLang's tree."""
    run_stream(window, seed, tombstones=False, swa_evictions=False)


@pytest.mark.parametrize(
    ("window", "seed", "tombstones", "swa_evictions"),
    [(1, 0, True, False), (3, 0, True, False), (8, 0, True, False), (3, 3, False, False)]
    + [(3, 0, True, True)],
)
def test_swa_tree_matches_sglang_with_tombstones_and_swa_evictions(
    window: int, seed: int, tombstones: bool, swa_evictions: bool
) -> None:
    """Streams whose inserts bring an SWA-evicted prefix (tombstones; a match then hits
    short of its walk and refreshes the hit's nodes only), one with SWA evictions, and one
    where a node holds two locks whose SWA segments differ (a split came between them)."""
    run_stream(window, seed, tombstones=tombstones, swa_evictions=swa_evictions)


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("seed", range(1, 4))
def test_swa_tree_matches_sglang_with_swa_evictions(window: int, seed: int) -> None:
    """Inserted tombstones, SWA evictions (tombstoning inner nodes, deleting leaves) and
    full evictions mixed: every result and size agrees with SGLang's tree."""
    run_stream(window, seed, tombstones=True, swa_evictions=True)
