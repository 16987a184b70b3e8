"""Radix entry points and their arrays: every bad token or slot array is
refused with ``DTypeError`` and changes nothing; slot runs are validated exactly as a
Python reference says, at power-of-two and other page sizes; inputs are read in place
(read-only and int64 arrays work) and outputs are fresh arrays the caller owns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvindex
from bad_arrays import BAD_ARRAYS, BASE
from kvindex import DTypeError, InvalidArgumentError, KvIndexError

PS = 4
TOKS = BASE.astype(np.int32)  # 12 tokens = 3 pages
SLOTS = np.arange(200, 212, dtype=np.int32)


def busy_tree() -> kvindex.RadixCache:
    t = kvindex.RadixCache(PS)
    t.insert(np.arange(50, 66, dtype=np.int32), np.arange(0, 16, dtype=np.int32))
    m = t.match_prefix(np.arange(50, 58, dtype=np.int32))
    t.lock(m.node)
    return t


def busy_cache() -> kvindex.RadixPrefixCache:
    c = kvindex.RadixPrefixCache(64, PS)
    assert c.admit(1, np.arange(50, 66, dtype=np.int32)) is not None
    return c


def tree_state(t: kvindex.RadixCache) -> tuple[object, ...]:
    return (t.dump(), t.total_size, t.evictable_size, t.protected_size, t.clock)


def cache_state(c: kvindex.RadixPrefixCache) -> tuple[object, ...]:
    return (c.dump(), c.num_free_blocks, c.num_tokens(1), c.request_blocks(1).tolist())


TREE_ENTRIES: dict[str, Callable[[kvindex.RadixCache, object], object]] = {
    "match_prefix": lambda t, a: t.match_prefix(a),
    "probe": lambda t, a: t.probe(a),
    "insert_tokens": lambda t, a: t.insert(a, SLOTS),
    "insert_slots": lambda t, a: t.insert(TOKS, a),
}

CACHE_ENTRIES: dict[str, Callable[[kvindex.RadixPrefixCache, object], object]] = {
    "admit": lambda c, a: c.admit(2, a),
    "lookup": lambda c, a: c.lookup(a),
    "append": lambda c, a: c.append(1, a),
    "append_batch": lambda c, a: c.append_batch(np.array([1], dtype=np.int64), a),
}


def assert_dtype_error(fn: Callable[[], object]) -> None:
    with pytest.raises(DTypeError) as info:
        fn()
    assert isinstance(info.value, TypeError) and isinstance(info.value, KvIndexError)
    assert str(info.value)


TARGETS: dict[str, tuple[Callable[[], Any], Callable[[Any], object], dict[str, Any]]] = {
    "tree": (busy_tree, tree_state, TREE_ENTRIES),
    "cache": (busy_cache, cache_state, CACHE_ENTRIES),
}


@pytest.mark.parametrize(
    ("kind", "entry"), [(k, e) for k, (_, _, entries) in TARGETS.items() for e in sorted(entries)]
)
@pytest.mark.parametrize("bad", sorted(BAD_ARRAYS))
def test_refuses_bad_arrays(kind: str, entry: str, bad: str) -> None:
    make, state, entries = TARGETS[kind]
    obj = make()
    before = state(obj)
    assert_dtype_error(lambda: entries[entry](obj, BAD_ARRAYS[bad]))
    assert state(obj) == before
    obj.check_invariants()


# ------------------------------------------------------------- slot-run validation


def reference_error(slots: list[int], ps: int) -> str | None:
    """What insert must say about ``slots``: None (valid), "non-negative", or
    "page-aligned run" (some page, the partial tail included, is not ``b, b+1, ...``
    from a multiple ``b`` of ``ps``)."""
    if any(s < 0 for s in slots):
        return "non-negative"
    for i in range(0, len(slots), ps):
        run = slots[i : i + ps]
        if run[0] % ps or run != list(range(run[0], run[0] + len(run))):
            return "page-aligned run"
    return None


@st.composite
def slot_case(draw: st.DrawFn) -> tuple[int, list[int]]:
    ps = draw(st.sampled_from([2, 3, 4, 8, 12, 16, 32, 64, 100]))
    n_pages = draw(st.integers(1, 6))
    tail = draw(st.integers(0, ps - 1))
    pages = draw(
        st.lists(st.integers(0, 500), min_size=n_pages + 1, max_size=n_pages + 1, unique=True)
    )
    slots: list[int] = []
    for p in pages[:n_pages]:
        slots += range(p * ps, p * ps + ps)
    slots += range(pages[-1] * ps, pages[-1] * ps + tail)
    for _ in range(draw(st.integers(0, 2))):  # perturb: shift, break a run, negate
        i = draw(st.integers(0, len(slots) - 1))
        v = draw(st.sampled_from([slots[i] + 1, slots[i] - 1, -slots[i] - 1, -(2**31)]))
        slots[i] = max(-(2**31), min(2**31 - 1, v))
    return ps, slots


@settings(max_examples=300, deadline=None)
@given(slot_case())
def test_slot_runs_match_reference(case: tuple[int, list[int]]) -> None:
    ps, slots = case
    t = kvindex.RadixCache(ps)
    toks = np.arange(len(slots), dtype=np.int32)
    expect = reference_error(slots, ps)
    if expect is None:
        r = t.insert(toks, np.array(slots, dtype=np.int32))
        full = len(slots) // ps * ps
        assert r.prefix_len == 0
        assert r.to_free.tolist() == slots[full:], "the unaligned tail goes back to the caller"
        assert t.total_size == full
        assert t.all_slots().tolist() == slots[:full]
    else:
        before = tree_state(t)
        with pytest.raises(InvalidArgumentError, match=expect):
            t.insert(toks, np.array(slots, dtype=np.int32))
        assert tree_state(t) == before
    t.check_invariants()


# ------------------------------------------------------------- in place / fresh


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_readonly_and_int64_inputs(ps: int) -> None:
    toks = np.arange(1000, 1000 + 40 * ps, dtype=np.int32)
    slots = np.arange(40 * ps, dtype=np.int32)
    toks.flags.writeable = False
    slots.flags.writeable = False
    t = kvindex.RadixCache(ps)
    assert t.insert(toks, slots).prefix_len == 0
    m64 = t.match_prefix(toks.astype(np.int64))
    m32 = t.match_prefix(toks)
    assert m64.hit_len == m32.hit_len == len(toks)
    assert m64.slots.tolist() == m32.slots.tolist() == slots.tolist()
    # a view into a larger buffer is read at its own offset
    big = np.concatenate([np.array([7, 7, 7], np.int32), toks])
    assert t.probe(big[3:]) == len(toks)
    t.check_invariants()


def test_outputs_are_fresh_and_owned() -> None:
    t = kvindex.RadixCache(16)
    toks = np.arange(3000, 3000 + 16 * 50, dtype=np.int32)
    slots = np.arange(16 * 50, dtype=np.int32)
    t.insert(toks, slots)
    a = t.match_prefix(toks).slots
    b = t.match_prefix(toks).slots
    assert a.dtype == np.int32 and a.flags.c_contiguous and a.flags.writeable
    assert a.flags.owndata or a.base is not None
    assert not np.shares_memory(a, b) and not np.shares_memory(a, slots)
    a[:] = -1  # the caller's to change; the tree is not affected
    assert b.tolist() == slots.tolist()
    assert t.match_prefix(toks).slots.tolist() == slots.tolist()
    toks_copy = toks.copy()
    toks[:] = 0  # nor is it by later writes to the inputs
    assert t.probe(toks_copy) == len(toks_copy)
    assert t.probe(toks) == 0
    t.check_invariants()


def test_empty_arrays() -> None:
    for ps in (1, 4):
        t = kvindex.RadixCache(ps)
        for dt in (np.int32, np.int64):
            e = np.array([], dtype=dt)
            m = t.match_prefix(e)
            assert m.hit_len == 0 and m.slots.tolist() == [] and m.slots.dtype == np.int32
            r = t.insert(e, e.astype(np.int32))
            assert r.prefix_len == 0 and r.to_free.tolist() == []
        t.check_invariants()
