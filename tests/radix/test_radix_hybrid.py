"""Hybrid components of ``kvindex.RadixTree`` (SWA KV with tombstones, Mamba state
per node) against the pure-Python model of SGLang's unified radix cache
(``models.swa_radix_model``): a randomised differential (hypothesis, fixed seeds in
CI; ``KVINDEX_SOAK=1`` runs many more examples) comparing every result, every size,
each node's components and each component's LRU order after every operation, plus
property checks (no slot held twice, conservation of slots and states) and
scenario tests of the SGLang rules.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import kvindex
from models.swa_radix_model import HybridRadixModel

SOAK = os.environ.get("KVINDEX_SOAK") == "1"

LAYOUTS = [
    # (page_size, sliding_window, mamba)
    (1, 3, False),
    (1, 1, False),
    (2, 5, False),
    (1, None, True),
    (2, None, True),
    (1, 4, True),
    (2, 3, True),
]


class Driver:
    """Runs one operation stream on kvindex and the model, comparing as it goes."""

    def __init__(self, ps: int, window: int | None, mamba: bool) -> None:
        self.ps = ps
        self.kv = kvindex.RadixTree(ps, sliding_window=window, mamba=mamba)
        self.model = HybridRadixModel(ps, window, mamba)
        self.mamba = mamba
        self.free_pages = list(range(4000, 0, -1))  # never reused: a slot names one page
        self.next_state = 1
        self.locks: list[tuple[int, Any]] = []
        self.states: set[int] = set()  # states the tree holds

    def slots_for(self, pages: int) -> list[int]:
        out = []
        for _ in range(pages):
            p = self.free_pages.pop()
            out.extend(range(p * self.ps, p * self.ps + self.ps))
        return out

    def given_back(self, slots: set[int]) -> None:
        """Slots handed back to the caller are not the tree's (no slot held twice)."""
        assert not slots & set(self.kv.all_slots().tolist())

    def comp_frees(self) -> tuple[list[int], list[int], list[int], bool]:
        k = self.kv.take_component_frees()
        m = self.model.take_component_frees()
        got = (sorted(k[0].tolist()), sorted(k[1].tolist()), sorted(k[2]), k[3])
        want = (sorted(m[0]), sorted(m[1]), sorted(m[2]), m[3])
        assert got == want
        return got

    def compare(self) -> None:
        kv, model = self.kv, self.model
        kv.check_invariants()
        assert (kv.total_size, kv.evictable_size, kv.protected_size) == (
            model.total_size,
            model.evictable_size,
            model.protected_size,
        )
        se, sp, me, mp = model.sizes()
        assert (kv.swa_evictable_size, kv.swa_protected_size) == (se, sp)
        assert (kv.mamba_evictable_size, kv.mamba_protected_size) == (me, mp)
        for comp, lru in (("swa", model.swa_lru), ("mamba", model.mamba_lru)):
            got = [kv.path_slots(h).tolist() for h in kv.component_lru(comp)]
            want = [model.path_slots(n) for n in lru]
            assert got == want, comp
        # Conservation: the same slots, each once, and the same states.
        slots = kv.all_slots().tolist()
        assert len(slots) == len(set(slots))
        assert sorted(slots) == sorted(model.all_slots())
        held_states = {model.node_components(n)[2] for n in model.mamba_lru}
        assert held_states == self.states

    def insert(self, toks: list[int], evicted_frac: float) -> None:
        n = len(toks) // self.ps * self.ps
        hit, got_slots, _ = self.kv.match_prefix(np.array(toks, dtype=np.int32))
        mh, msl, _ = self.model.match_prefix(toks)
        assert hit == mh and got_slots.tolist() == list(msl)
        self.comp_frees()
        slots = got_slots.tolist() + self.slots_for((len(toks) - hit + self.ps - 1) // self.ps)
        slots = slots[: len(toks)]
        e = int(n * evicted_frac) // self.ps * self.ps
        state = None
        if self.mamba:
            state = self.next_state
            self.next_state += 1
        r = self.kv.insert(
            np.array(toks, dtype=np.int32),
            np.array(slots, dtype=np.int32),
            swa_evicted_len=e,
            mamba_state=state,
        )
        mp, mfree = self.model.insert(toks, slots, swa_evicted_len=e, mamba_state=state)
        assert r.prefix_len == mp
        assert sorted(r.to_free.tolist()) == sorted(mfree)
        _, full_only, freed_states, exist = self.comp_frees()
        self.given_back(set(r.to_free.tolist()) | set(full_only))
        if state is not None and not exist and n > 0:
            self.states.add(state)
        self.states -= set(freed_states)

    def match_lock(self, toks: list[int], lock: bool) -> None:
        a = np.array(toks, dtype=np.int32)
        assert self.kv.probe(a) == self.model.probe(toks)
        hit, slots, node = self.kv.match_prefix(a)
        mh, msl, mnode = self.model.match_prefix(toks)
        assert (hit, slots.tolist()) == (mh, list(msl))
        if node:
            assert self.kv.node_components(node) == self.model.node_components(mnode)
        self.comp_frees()
        if lock and node:
            self.kv.lock(node)
            self.model.lock(mnode)
            self.locks.append((node, mnode))
            if len(self.locks) == 1 and self.model.window:
                self.window_lock_is_minimal(mnode)

    def window_lock_is_minimal(self, mnode: Any) -> None:
        """One lock pins the SWA of the shortest node suffix covering the window, no more."""
        lens, live, cur = [], [], mnode
        while cur is not self.model.root:
            lens.append(len(cur.key))
            live.append(cur.swa_live)
            cur = cur.parent
        covered, k = 0, 0
        while k < len(lens) and covered < self.model.window:
            covered += lens[k]
            k += 1
        assert covered - lens[k - 1] < self.model.window
        pinned = sum(ln for ln, lv in zip(lens[:k], live[:k], strict=True) if lv)
        assert self.kv.swa_protected_size == pinned

    def unlock(self, i: int) -> None:
        if not self.locks:
            return
        node, mnode = self.locks.pop(i % len(self.locks))
        self.kv.unlock(node)
        self.model.unlock(mnode)

    def evict(self, kind: int, n: int) -> None:
        if kind == 0:
            got, want = self.kv.evict(n), self.model.evict(n)
        elif kind == 1:
            got, want = self.kv.evict_swa(n), self.model.evict_swa(n)
        else:
            got, want = self.kv.evict_mamba(n), self.model.evict_mamba(n)
        assert sorted(got.tolist()) == sorted(want)
        _, _, states, _ = self.comp_frees()
        self.given_back(set(got.tolist()))
        self.states -= set(states)

    def reset(self) -> None:
        if self.locks:
            return
        got, want = self.kv.reset(), self.model.reset()
        assert sorted(got.tolist()) == sorted(want)
        self.comp_frees()
        assert self.kv.total_size == 0
        self.states.clear()


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.lists(st.integers(0, 2), min_size=1, max_size=14),
            st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
        ),
        st.tuples(
            st.just("match"), st.lists(st.integers(0, 2), min_size=1, max_size=14), st.booleans()
        ),
        st.tuples(st.just("unlock"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("evict"), st.integers(0, 2), st.integers(1, 8)),
        st.tuples(st.just("reset"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@pytest.mark.parametrize(("ps", "window", "mamba"), LAYOUTS)
@seed(20261201)
@settings(
    max_examples=2000 if SOAK else 60,
    deadline=None,
    derandomize=not SOAK,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(stream=ops)
def test_hybrid_tree_matches_the_model(
    ps: int, window: int | None, mamba: bool, stream: list[Any]
) -> None:
    d = Driver(ps, window, mamba)
    for op, a, b in stream:
        if op == "insert":
            d.insert(a, b)
        elif op == "match":
            d.match_lock(a, b)
        elif op == "unlock":
            d.unlock(a)
        elif op == "evict":
            d.evict(a, b)
        else:
            d.reset()
        d.compare()
    while d.locks:
        d.unlock(0)
    d.evict(0, 10**6)
    d.compare()
    assert d.kv.total_size == 0
    assert d.kv.swa_evictable_size == d.kv.swa_protected_size == 0
    assert d.kv.mamba_evictable_size == d.kv.mamba_protected_size == 0


def test_swa_tombstones_gate_matches_only_inside_the_window() -> None:
    t = kvindex.RadixTree(1, sliding_window=2)
    s = np.arange(1, 9, dtype=np.int32)
    t.insert(s, s + 100)
    # One window (2 tokens) of SWA sits on its own leaf.
    assert t.num_nodes == 2
    assert t.evict_swa(1).tolist() == []  # the older inner node: a tombstone
    swa, full_only, states, _ = t.take_component_frees()
    assert swa.tolist() == list(range(101, 107)) and full_only.tolist() == [] and states == []
    assert t.match_prefix(s).hit_len == 8  # the last window is live
    assert t.match_prefix(s[:7]).hit_len == 0  # 1 live token after the tombstone
    # A request whose SWA is live from 4 on revives the tombstone's tail.
    r = t.insert(s, np.arange(201, 209, dtype=np.int32), swa_evicted_len=4)
    assert r.prefix_len == 8
    _, full_only, _, _ = t.take_component_frees()
    assert sorted(full_only.tolist()) == [105, 106]
    assert t.match_prefix(s[:6]).hit_len == 6
    t.check_invariants()


def test_mamba_hits_end_at_the_deepest_state() -> None:
    t = kvindex.RadixTree(1, mamba=True)
    t.insert(
        np.array([1, 2, 3, 4], dtype=np.int32), np.arange(10, 14, dtype=np.int32), mamba_state=7
    )
    t.insert(
        np.array([1, 2, 3, 4, 5, 6], dtype=np.int32),
        np.arange(20, 26, dtype=np.int32),
        mamba_state=8,
    )
    m = t.match_prefix(np.array([1, 2, 3, 4, 5], dtype=np.int32))
    assert m.hit_len == 4 and t.node_components(m.node)[2] == 7
    assert t.match_prefix(np.array([1, 2, 9], dtype=np.int32)).hit_len == 0
    r = t.insert(
        np.array([1, 2, 3, 4], dtype=np.int32), np.arange(10, 14, dtype=np.int32), mamba_state=9
    )
    assert r.prefix_len == 4 and t.take_component_frees()[3] is True  # the caller frees state 9
    t.check_invariants()


def test_bad_component_arguments_raise_and_change_nothing() -> None:
    t = kvindex.RadixTree(2, sliding_window=4, mamba=True)
    toks = np.array([1, 2, 3, 4], dtype=np.int32)
    slots = np.array([2, 3, 4, 5], dtype=np.int32)
    with pytest.raises(kvindex.InvalidArgumentError, match="swa_evicted_len"):
        t.insert(toks, slots, swa_evicted_len=1, mamba_state=1)
    with pytest.raises(kvindex.InvalidArgumentError, match="mamba_state"):
        t.insert(toks, slots)
    assert t.total_size == 0
    t.insert(toks, slots, mamba_state=1)
    with pytest.raises(kvindex.InvalidArgumentError, match="already in the tree"):
        t.insert(np.array([7, 7], dtype=np.int32), np.array([8, 9], dtype=np.int32), mamba_state=1)
    with pytest.raises(kvindex.InvalidArgumentError, match="Mamba"):
        kvindex.RadixTree(1).insert(toks, slots, mamba_state=1)
    with pytest.raises(kvindex.InvalidArgumentError):
        kvindex.RadixTree(1, sliding_window=0)
    with pytest.raises(kvindex.InvalidArgumentError, match="component"):
        t.component_lru("full")
    t.check_invariants()
    assert t.sliding_window == 4 and t.mamba is True
    assert kvindex.RadixTree(1).sliding_window is None


GPT_OSS = [("full_attention", 16, 0, ""), ("sliding_window", 16, 128, "")]
QWEN3_NEXT = [("full_attention", 16, 0, ""), ("mamba", 16, 0, "align")]


def test_group_layouts_build_hybrid_trees() -> None:
    t = kvindex.RadixTree(16, groups=GPT_OSS)
    assert (t.sliding_window, t.mamba) == (128, False)
    t = kvindex.RadixTree(16, groups=QWEN3_NEXT)
    assert (t.sliding_window, t.mamba) == (None, True)
    assert kvindex.RadixTree(16, groups=[("full_attention", 16, 0, "")]).sliding_window is None
    with pytest.raises(kvindex.InvalidArgumentError, match="block size"):
        kvindex.RadixTree(1, groups=GPT_OSS)
    with pytest.raises(kvindex.InvalidArgumentError, match="not both"):
        kvindex.RadixTree(16, groups=GPT_OSS, mamba=True)


@pytest.mark.parametrize(
    ("groups", "why"),
    [
        ([("full_attention", 16, 0, ""), ("chunked_local_attention", 16, 64, "")], "chunked local"),
        ([("full_attention", 16, 0, ""), ("sliding_window", 32, 128, "")], "different block sizes"),
        ([("sliding_window", 16, 128, "")], "no full-attention group"),
        ([("full_attention", 16, 0, ""), ("mamba", 16, 0, "none")], "align"),
    ],
)
def test_layouts_the_radix_design_cannot_serve_are_named(groups: Any, why: str) -> None:
    with pytest.raises(kvindex.InvalidArgumentError, match=why):
        kvindex.RadixTree(16, groups=groups)
    with pytest.raises(kvindex.InvalidArgumentError, match=why):
        kvindex.make_cache("radix", 64, 16, groups=groups)


def test_a_malformed_group_tuple_is_a_type_error() -> None:
    # The same (kind, block_size, size, mamba_mode) tuples the vLLM manager and explain take.
    for build in (
        lambda g: kvindex.RadixTree(16, groups=g),
        lambda g: kvindex.make_cache("radix", 64, 16, groups=g),
    ):
        with pytest.raises(kvindex.DTypeError, match="4 fields"):
            build([("full_attention", 16, 0)])


def test_make_cache_radix_takes_a_layout() -> None:
    c = kvindex.make_cache(
        "radix", 64, 16, groups=[("full_attention", 16, 0, ""), ("mla_attention", 16, 0, "")]
    )
    assert c.block_size == 16
    assert c.swa_blocks is None and c.mamba_states is None
    swa = kvindex.make_cache("radix", 64, 16, groups=GPT_OSS, swa_blocks=20)
    assert swa.swa_blocks == (20, 0, 20) and swa.mamba_states is None
    mamba = kvindex.make_cache("radix", 64, 16, groups=QWEN3_NEXT, mamba_states=3)
    assert mamba.mamba_states == (3, 0, 3) and mamba.swa_blocks is None
    with pytest.raises(kvindex.InvalidArgumentError, match="swa_blocks"):
        kvindex.make_cache("radix", 64, 16, groups=GPT_OSS, swa_blocks=64)
    with pytest.raises(kvindex.InvalidArgumentError, match="sliding-window group"):
        kvindex.make_cache("radix", 64, 16, groups=QWEN3_NEXT, swa_blocks=8)
    with pytest.raises(kvindex.InvalidArgumentError, match="Mamba group"):
        kvindex.make_cache("radix", 64, 16, mamba_states=8)
