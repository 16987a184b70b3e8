"""kvindex's radix tree with the Mamba component (``RadixTree(P, mamba=True)``, and with
``sliding_window=W`` too) against SGLang 0.5.23's own ``UnifiedRadixCache`` with
``tree_components=(FULL, MAMBA)`` (and ``(FULL, SWA, MAMBA)``) on CPU, over SGLang's own
pools: ``HybridReqToTokenPool`` (its ``MambaPool`` and ``MambaSlotAllocator``) with a
``HybridLinearKVPool`` + ``TokenToKVPoolAllocator`` (``PagedTokenToKVPoolAllocator``
and the Mamba extra buffer for pages over 1), or, with SWA, ``SWAKVPool`` +
``SWATokenToKVPoolAllocator`` (page 1: its ``alloc`` takes no pages); Python tree core.

One randomised stream of inserts (each with a fresh Mamba state from SGLang's allocator,
and with SWA a random SWA-evicted prefix), matches, full / Mamba (/ SWA) evictions and
locks, driven on both trees; after every operation the hits, the slots matched, the
Mamba state of the hit node, ``mamba_exist``, the evicted counts (tokens and states),
both trees' full / Mamba (/ SWA) evictable and protected sizes, each component's
recency list (nodes, least recent first, with their states), and SGLang's allocators
(full, SWA, Mamba slots held; the states its tree holds) against kvindex's tree (its
tokens, the states its frees leave held) must agree.

Frees: SGLang's unified insert frees the caller's duplicate KV itself, kvindex returns
them (``to_free``); an insert whose end node already holds a state reports
``mamba_exist`` on both and the caller (here, once, on SGLang's Mamba allocator) frees
its state, as SGLang's ``cleanup_after_caching_req`` does. The Mamba states kvindex
frees (``take_component_frees``) must be exactly those SGLang's cache handed back to its
Mamba allocator.

Not compared: the match's ``mamba_branching_seqlen`` (a scheduling hint from the full
walk and the Mamba checkpoint grid, which kvindex's tree does not report) and
``mamba_max_states_per_path`` (a server option, off by default, kvindex has no cap).
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import numpy as np
import pytest
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.environ import envs
from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang_driver import release_newest_lock, swa_allocator, token_allocator

import kvindex

SIZE, SIZE_SWA, MAMBA_SIZE = 400, 400, 40
MAMBA = ComponentType.MAMBA


def key(tokens: list[int]) -> RadixKey:
    return RadixKey(array("q", tokens), None)


class Pair:
    """The two trees and SGLang's allocators, with what kvindex says is held."""

    def __init__(self, window: int | None, page: int) -> None:
        args = ServerArgs(model_path="dummy", page_size=page)
        # The dummy model config has no Mamba chunk size (SGLang's test kit presets it).
        args._mamba_cache_chunk_size = 64
        set_global_server_args_for_scheduler(args)
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(
                tp_world_size=1,
                intermediate_size=16,
                n_groups=1,
                num_heads=1,
                head_dim=16,
                state_size=1,
                conv_kernel=2,
            )
            cache_params = Mamba2CacheParams(shape=shape, layers=[0])
        self.rtp = HybridReqToTokenPool(
            size=4,
            mamba_size=MAMBA_SIZE,
            mamba_spec_state_size=4,
            max_context_len=512,
            device="cpu",
            enable_memory_saver=False,
            cache_params=cache_params,
            mamba_layer_ids=[0],
            # Pages over 1 need SGLang's extra (ping-pong) state buffer.
            enable_mamba_extra_buffer=page > 1,
            speculative_num_draft_tokens=3,
        )
        self.mamba_alloc = self.rtp.mamba_allocator
        self.swa = window is not None
        # SGLang's SWA allocator hands out slots one token at a time only (its alloc
        # asserts page_size == 1; paged SWA goes through a request's alloc_extend).
        assert page == 1 or not self.swa
        if window is None:
            kv_pool = HybridLinearKVPool(
                size=SIZE,
                dtype=torch.bfloat16,
                page_size=page,
                head_num=1,
                head_dim=1,
                full_attention_layer_ids=[1],
                device="cpu",
                enable_memory_saver=False,
                mamba_pool=self.rtp.mamba_pool,
            )
            self.alloc: Any = token_allocator(SIZE, page, kv_pool)
            components = (ComponentType.FULL, MAMBA)
        else:
            self.alloc = swa_allocator(SIZE, SIZE_SWA, page)
            components = (ComponentType.FULL, ComponentType.SWA, MAMBA)
        params = CacheInitParams(
            req_to_token_pool=self.rtp,
            token_to_kv_pool_allocator=self.alloc,
            page_size=page,
            disable=False,
            sliding_window_size=window,
            tree_components=components,
            enable_mamba_extra_buffer=page > 1,
        )
        self.sgl = UnifiedRadixCache(params=params)
        assert self.sgl.tree_components == components
        self.kv = kvindex.RadixTree(page, sliding_window=window, mamba=True)
        self.full: set[int] = set()  # slots held, per the frees kvindex hands back
        self.states: set[int] = set()  # Mamba states held, per kvindex's frees
        self.locks: list[tuple[int, Any, Any]] = []

    def full_available(self) -> int:
        if self.swa:
            return self.alloc.full_available_size()
        return self.alloc.available_size()

    def drain(self) -> tuple[list[int], bool]:
        """kvindex's component frees since the last drain: (Mamba states, mamba_exist)."""
        _, full_only, mamba, exist = self.kv.take_component_frees()
        self.full -= set(full_only.tolist())
        assert len(set(mamba)) == len(mamba) and set(mamba) <= self.states
        self.states -= set(mamba)
        return list(mamba), exist

    def compare(self) -> None:
        self.kv.check_invariants()
        kv, sgl = self.kv, self.sgl
        assert (kv.evictable_size, kv.protected_size) == (
            sgl.full_evictable_size(),
            sgl.full_protected_size(),
        )
        assert (kv.mamba_evictable_size, kv.mamba_protected_size) == (
            sgl.mamba_evictable_size(),
            sgl.mamba_protected_size(),
        )
        # The driver keeps no slot or state after an operation (the tree takes it or it
        # is freed), so SGLang's allocators hold exactly what kvindex's tree holds.
        assert SIZE - self.full_available() == kv.total_size == len(self.full)
        assert MAMBA_SIZE - self.mamba_alloc.available_size() == len(self.states)
        assert set(sgl.all_mamba_values_flatten().tolist()) == self.states
        assert kv.mamba_evictable_size + kv.mamba_protected_size == len(self.states)
        assert self.lru("mamba") == self.sgl_lru(MAMBA)
        if self.swa:
            assert self.lru("swa") == self.sgl_lru(ComponentType.SWA)
            assert (kv.swa_evictable_size, kv.swa_protected_size) == (
                sgl.swa_evictable_size(),
                sgl.swa_protected_size(),
            )
            live = kv.swa_evictable_size + kv.swa_protected_size
            assert SIZE_SWA - self.alloc.swa_available_size() == live

    def lru(self, component: str) -> list[tuple[tuple[int, ...], int | None]]:
        """kvindex's recency list of a component, least recent first: each node named by
        the slots of its path (both trees split alike, and slots are unique), with its
        Mamba state."""
        return [
            (tuple(self.kv.path_slots(h).tolist()), self.kv.node_components(h)[2])
            for h in self.kv.component_lru(component)
        ]

    def sgl_lru(self, component: ComponentType) -> list[tuple[tuple[int, ...], int | None]]:
        """SGLang's recency list of a component (its head is the most recent end)."""
        lru = self.sgl.tree_core.lru_lists[component]
        pt, out, node = lru._pt, [], lru.tail.lru_prev[lru._pt]
        while node is not lru.head:
            state = node.component_data[MAMBA].value
            path = tuple(self.sgl.path_device_indices(node.id).tolist())
            out.append((path, None if state is None else int(state[0])))
            node = node.lru_prev[pt]
        return out

    def insert(self, tokens: list[int], swa_evicted: int) -> None:
        n = len(tokens)
        if self.full_available() < n or self.mamba_alloc.available_size() < 1:
            return
        if self.swa and self.alloc.swa_available_size() < n:
            return
        value = self.alloc.alloc(n)
        assert value is not None
        mamba_value = self.mamba_alloc.alloc(1)
        assert mamba_value is not None
        state = int(mamba_value[0])
        slots = value.numpy().astype(np.int32)
        self.full |= set(slots.tolist())
        self.states.add(state)
        component_evicted = {}
        if self.swa:
            # The caller freed the SWA KV of its first swa_evicted tokens already.
            if swa_evicted:
                self.alloc.free_swa(value[:swa_evicted])
            component_evicted = {ComponentType.SWA: swa_evicted}
        r = self.kv.insert(
            np.array(tokens, dtype=np.int32),
            slots,
            swa_evicted_len=swa_evicted,
            mamba_state=state,
        )
        s = self.sgl.insert(
            InsertParams(
                key=key(tokens),
                value=value,
                mamba_value=mamba_value,
                component_evicted_seqlens=component_evicted,
            )
        )
        assert r.prefix_len == s.prefix_len
        freed_states, exist = self.drain()
        assert not freed_states  # an insert frees no state of the tree's
        assert exist == s.mamba_exist
        self.full -= set(r.to_free.tolist())
        if exist:
            # The end node keeps its own state: the caller frees the one it brought.
            self.states.discard(state)
            self.mamba_alloc.free(mamba_value)

    def match(self, tokens: list[int], lock: bool) -> None:
        m = self.kv.match_prefix(np.array(tokens, dtype=np.int32))
        s = self.sgl.match_prefix(MatchPrefixParams(key=key(tokens)))
        assert m.hit_len == s.device_prefix_len
        assert m.slots.tolist() == self.sgl.path_device_indices(s.last_device_node).tolist()
        # The hit node's Mamba state (the one a request would copy on write).
        sgl_state = self.sgl.tree_core.get_component_device_value(s.best_match_node, MAMBA)
        kv_state = self.kv.node_components(m.node)[2] if m.node else None
        assert kv_state == (None if sgl_state is None else int(sgl_state[0]))
        if lock and m.hit_len:
            self.kv.lock(m.node)
            receipt = self.sgl.inc_lock_ref(s.last_device_node)
            self.locks.append((m.node, s.last_device_node, receipt))

    def unlock(self, i: int) -> None:
        release_newest_lock(self.locks, i, self.kv, self.sgl)

    def evict(self, n: int, kind: str) -> None:
        if kind == "mamba":
            freed = self.kv.evict_mamba(n)
            e = self.sgl.evict(EvictParams(num_tokens=0, mamba_num=n))
        elif kind == "swa":
            freed = self.kv.evict_swa(n)
            e = self.sgl.evict(EvictParams(num_tokens=0, swa_num_tokens=n))
        else:
            freed = self.kv.evict(n)
            e = self.sgl.evict(EvictParams(num_tokens=n))
        assert len(freed) == e.num_tokens_evicted
        self.full -= set(freed.tolist())
        states, _ = self.drain()
        assert len(states) == e.mamba_num_evicted


def run_stream(
    seed: int,
    window: int | None,
    *,
    swa_evictions: bool = False,
    page: int = 1,
    ops: int = 250,
) -> None:
    """One stream; ``window``: the SWA component's (None: FULL + MAMBA only); with
    ``page`` over 1 inserts are whole pages (SGLang's caller cuts them so)."""
    rng = random.Random(seed * 31 + (window or 0) + 1000 * page)
    pair = Pair(window, page)
    prefixes = [[rng.randrange(3) for _ in range(24)] for _ in range(3)]

    inserted: list[list[int]] = []

    def seq() -> list[int]:
        # Half the time a sequence inserted before (a state sits at its end unless
        # evicted since), cut or extended, so matches hit and inserts meet states.
        if inserted and rng.random() < 0.5:
            p = rng.choice(inserted)
            p = p[: rng.randrange(1, len(p) + 1)] if rng.random() < 0.3 else p
        else:
            p = prefixes[rng.randrange(3)][: rng.randrange(1, 24)]
        return p + [rng.randrange(3) for _ in range(rng.choice((0, 0, rng.randrange(8))))]

    for _ in range(ops):
        op = rng.random()
        if op < 0.35:
            t = seq()
            t = t[: len(t) // page * page]
            if t:
                inserted.append(t)
                evicted = rng.randrange(len(t) // page + 1) * page
                pair.insert(t, evicted if window is not None else 0)
        elif op < 0.65:
            pair.match(seq(), lock=rng.random() < 0.3)
        elif op < 0.75 and pair.locks:
            pair.unlock(rng.randrange(len(pair.locks)))
        else:
            r = rng.random()
            if swa_evictions:
                kind = "full" if r < 0.35 else "mamba" if r < 0.65 else "swa"
            else:
                kind = "full" if r < 0.5 else "mamba"
            pair.evict(rng.randrange(1, 12) if kind != "mamba" else rng.randrange(1, 4), kind)
        pair.compare()
    while pair.locks:
        pair.unlock(0)
    pair.compare()


@pytest.mark.parametrize("seed", range(6))
def test_mamba_tree_matches_sglang(seed: int) -> None:
    """(FULL, MAMBA): inserts with states (new leaf, a stateless end node, or
    ``mamba_exist``), matches (the hit is the deepest node with a state), Mamba locks,
    full and Mamba evictions: every result, size and held state agrees with SGLang."""
    run_stream(seed, None)


@pytest.mark.parametrize("page", [2, 4])
@pytest.mark.parametrize("seed", range(3))
def test_paged_mamba_tree_matches_sglang(page: int, seed: int) -> None:
    """(FULL, MAMBA) with pages over one (SGLang's Mamba extra buffer, paged allocator):
    inserts of whole pages, page-cut matches; everything agrees with SGLang."""
    run_stream(seed, None, page=page)


@pytest.mark.parametrize(
    ("window", "seed", "swa_evictions"),
    [(1, 0, False), (3, 1, False), (8, 2, False), (3, 3, True), (8, 4, True)],
)
def test_swa_mamba_tree_matches_sglang(window: int, seed: int, swa_evictions: bool) -> None:
    """(FULL, SWA, MAMBA): inserts bring an SWA-evicted prefix and a state; matches need
    both validators; SWA evictions tombstone inner nodes (dropping their states) and
    delete leaves; every result, size and held state agrees with SGLang."""
    run_stream(seed, window, swa_evictions=swa_evictions)
