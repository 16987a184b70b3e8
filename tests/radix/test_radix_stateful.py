"""Stateful property tests of the radix tree and the request-level radix cache.

``RadixTreeMachine`` drives ``kvindex.RadixCache`` and the pure-Python
``RadixModel`` through the same match / insert / lock / unlock / evict / reset
operations and request lifecycles (match, lock, allocate, insert at finish,
free duplicates, unlock), with random namespaces, policies and page sizes 1,
4 and 16. Every step compares hit lengths, slots, prefix lengths, duplicates
and evicted slots (in order) with the model and hit lengths with a plain
dict-of-sequences oracle; after every step ``check_invariants()`` runs and
slot accounting holds: every page is exactly one of free / in the tree / held
by a running request.

``RadixRequestMachine`` does the same for ``kvindex.RadixPrefixCache`` against
``RadixCacheModel`` (block ids compared exactly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import kvindex
from models.radix_model import RadixCacheModel, RadixModel, lcp

BASES = [list(range(100, 148)), [7] * 40, list(range(300, 310)) * 4]
NAMESPACES = st.sampled_from([None, None, "a", "b"])


@st.composite
def sequences(draw: st.DrawFn, max_tail: int = 24) -> list[int]:
    base = draw(st.sampled_from(BASES))
    cut = draw(st.integers(0, len(base)))
    tail = draw(st.lists(st.integers(0, 4), max_size=max_tail))
    return base[:cut] + tail


def a32(xs: list[int]) -> np.ndarray:
    return np.asarray(xs, dtype=np.int32)


class PageAllocator:
    """Pages of ``ps`` slots; raises on a double free."""

    def __init__(self, num_pages: int, ps: int) -> None:
        self.ps = ps
        self.free: set[int] = set(range(num_pages))
        self.num_pages = num_pages

    def alloc_slots(self, n: int) -> list[int]:
        pages = sorted(self.free)[: -(-n // self.ps)]
        assert len(pages) * self.ps >= n, "test pool exhausted"
        self.free.difference_update(pages)
        return [p * self.ps + k for p in pages for k in range(self.ps)][:n]

    def free_slots(self, slots: Any) -> None:
        for p in {int(s) // self.ps for s in np.asarray(slots).tolist()}:
            assert p not in self.free, f"double free of page {p}"
            self.free.add(p)


class RadixTreeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # [rust handle, model node, locks taken through the lock rule]
        self.handles: list[list[Any]] = []
        # (tokens, namespace, slots, rust handle, model node, hit length)
        self.running: list[tuple[list[int], str | None, list[int], int, Any, int]] = []

    @initialize(
        page_size=st.sampled_from([1, 4, 16]),
        policy=st.sampled_from(kvindex.RADIX_POLICIES),
        events=st.booleans(),
    )
    def setup(self, page_size: int, policy: str, events: bool) -> None:
        self.ps = page_size
        self.tree = kvindex.RadixCache(page_size, policy=policy, enable_events=events)
        self.model = RadixModel(page_size, policy)
        self.alloc = PageAllocator(4096, page_size)
        self.inserted: dict[str | None, list[list[int]]] = {}

    # ------------------------------------------------------------ helpers
    def _oracle_hit(self, toks: list[int], ns: str | None) -> int:
        ps = self.ps
        q = toks[: len(toks) // ps * ps]
        seqs = [s for n, s in self.model.sequences() if n == ns]
        return max((lcp(s, q) // ps * ps for s in seqs), default=0)

    def _match(self, toks: list[int], ns: str | None) -> tuple[Any, Any]:
        want_hit = self._oracle_hit(toks, ns)
        got = self.tree.match_prefix(a32(toks), ns)
        h, slots, node = self.model.match_prefix(toks, ns)
        assert got.hit_len == h == want_hit
        assert got.slots.tolist() == list(slots)
        assert got.slots.dtype == np.int32
        if node is not self.model.root:
            assert self.tree.path_slots(got.node).tolist() == self.model.path_slots(node)
        else:
            assert got.node == 0
        return got, node

    def _insert(self, toks: list[int], slots: list[int], ns: str | None, prio: int = 0) -> None:
        got = self.tree.insert(a32(toks), a32(slots), ns, priority=prio)
        p, to_free = self.model.insert(toks, slots, ns, prio)
        assert got.prefix_len == p
        assert got.to_free.tolist() == list(to_free)
        self.alloc.free_slots(got.to_free)

    # -------------------------------------------------------------- rules
    @rule(toks=sequences(), ns=NAMESPACES)
    def match(self, toks: list[int], ns: str | None) -> None:
        got, node = self._match(toks, ns)
        if got.node != 0 and len(self.handles) < 12:
            self.handles.append([got.node, node, 0])

    @rule(toks=sequences(), ns=NAMESPACES, prio=st.integers(-2, 2))
    def insert_fresh(self, toks: list[int], ns: str | None, prio: int) -> None:
        self._insert(toks, self.alloc.alloc_slots(len(toks)), ns, prio)

    @rule(toks=sequences(), ns=NAMESPACES)
    def start_request(self, toks: list[int], ns: str | None) -> None:
        got, node = self._match(toks, ns)
        self.tree.lock(got.node)
        self.model.lock(node)
        own = self.alloc.alloc_slots(len(toks) - got.hit_len)
        self.running.append((toks, ns, got.slots.tolist() + own, got.node, node, got.hit_len))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 20), extra=st.lists(st.integers(0, 4), max_size=20))
    def finish_request(self, i: int, extra: list[int]) -> None:
        toks, ns, slots, handle, node, hit = self.running.pop(i % len(self.running))
        if extra:
            # Decode tokens extend the request: re-home its own slots so each
            # page stays one aligned run.
            self.alloc.free_slots(slots[hit:])
            toks = toks + extra
            slots = slots[:hit] + self.alloc.alloc_slots(len(toks) - hit)
        self._insert(toks, slots, ns)
        self.tree.unlock(handle)
        self.model.unlock(node)

    @rule(i=st.integers(0, 20))
    def lock(self, i: int) -> None:
        if not self.handles:
            return
        entry = self.handles[i % len(self.handles)]
        h, node, _ = entry
        if node.id not in self.model.nodes:
            with pytest.raises(kvindex.StaleHandleError):
                self.tree.lock(h)
            return
        self.tree.lock(h)
        self.model.lock(node)
        entry[2] += 1

    @rule(i=st.integers(0, 20))
    def unlock(self, i: int) -> None:
        if not self.handles:
            return
        entry = self.handles[i % len(self.handles)]
        h, node, mine = entry
        if node.id not in self.model.nodes:
            with pytest.raises(kvindex.StaleHandleError):
                self.tree.unlock(h)
        elif mine > 0:
            self.tree.unlock(h)
            self.model.unlock(node)
            entry[2] -= 1
        elif node.own_locks == 0:
            with pytest.raises(kvindex.LockError):
                self.tree.unlock(h)
        # else: the node's locks belong to running requests

    @rule(n=st.integers(0, 80))
    def evict(self, n: int) -> None:
        got = self.tree.evict(n)
        want = self.model.evict(n)
        assert got.tolist() == list(want)
        self.alloc.free_slots(got)

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self) -> None:
        got = self.tree.reset()
        want = self.model.reset()
        assert sorted(got.tolist()) == sorted(want)
        self.alloc.free_slots(got)
        for h, _, _ in self.handles:
            with pytest.raises(kvindex.StaleHandleError):
                self.tree.lock(h)
        self.handles.clear()

    # ---------------------------------------------------------- invariants
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "tree"):
            return
        self.tree.check_invariants()
        t, m = self.tree, self.model
        assert (t.total_size, t.evictable_size, t.protected_size) == (
            m.total_size,
            m.evictable_size,
            m.protected_size,
        )
        ps = self.ps
        tree_pages = [s // ps for s in t.all_slots().tolist()[::ps]]
        assert len(set(tree_pages)) == len(tree_pages)
        assert sorted(t.all_slots().tolist()) == sorted(m.all_slots())
        held: list[int] = []
        for _, _, slots, _, _, _ in self.running:
            held.extend({s // ps for s in slots} - set(tree_pages))
        assert len(set(held)) == len(held), "a page held by two requests"
        free = self.alloc.free
        assert not (free & set(tree_pages)) and not (free & set(held))
        assert len(free) + len(tree_pages) + len(held) == self.alloc.num_pages, "slot leak"


TestRadixTree = RadixTreeMachine.TestCase
TestRadixTree.settings = settings(stateful_step_count=40)


class RadixRequestMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.ids: list[int] = []

    @initialize(
        num_blocks=st.integers(3, 48),
        page_size=st.sampled_from([1, 4, 16]),
        policy=st.sampled_from(["lru", "lfu", "fifo", "priority", "slru"]),
    )
    def setup(self, num_blocks: int, page_size: int, policy: str) -> None:
        self.ps = page_size
        self.cache = kvindex.RadixPrefixCache(num_blocks, page_size, policy=policy)
        self.model = RadixCacheModel(num_blocks, page_size, policy)

    @rule(toks=sequences(max_tail=40), salt=st.sampled_from([None, None, "t"]), skip=st.booleans())
    def admit(self, toks: list[int], salt: str | None, skip: bool) -> None:
        if not toks:
            toks = [1]
        rid = self.next_id
        self.next_id += 1
        ns = None if salt is None else f"lora=\x1f\x1esalt={salt}"
        assert self.cache.lookup(a32(toks), cache_salt=salt) == self.model.lookup(toks, ns)
        if -(-len(toks) // self.model.ps) > self.model.num_blocks - 1:
            # Larger than the whole pool: never admissible, an error and nothing changes
            # (the invariants compare the whole state with the untouched model).
            with pytest.raises(kvindex.RequestTooLargeError):
                self.cache.admit(rid, a32(toks), cache_salt=salt, skip_reading=skip)
            return
        got = self.cache.admit(rid, a32(toks), cache_salt=salt, skip_reading=skip)
        want = self.model.admit(rid, toks, ns, skip)
        if want is None:
            assert got is None
            return
        assert got is not None
        assert got.num_cached_tokens == want
        assert got.block_ids.tolist() == self.model.reqs[rid][2]
        self.ids.append(rid)

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 20), toks=st.lists(st.integers(0, 4), min_size=1, max_size=20))
    def append(self, i: int, toks: list[int]) -> None:
        rid = self.ids[i % len(self.ids)]
        assert self.cache.append(rid, a32(toks)) == self.model.append(rid, toks)
        assert self.cache.request_blocks(rid).tolist() == self.model.reqs[rid][2]

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 20))
    def checkpoint(self, i: int) -> None:
        rid = self.ids[i % len(self.ids)]
        self.cache.checkpoint(rid)
        self.model.checkpoint(rid)
        assert self.cache.request_blocks(rid).tolist() == self.model.reqs[rid][2]
        assert self.cache.num_cached_tokens(rid) == self.model.reqs[rid][4]

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 20))
    def free(self, i: int) -> None:
        rid = self.ids.pop(i % len(self.ids))
        self.cache.free(rid)
        self.model.free_request(rid)
        with pytest.raises(kvindex.UnknownRequestError):
            self.cache.free(rid)

    @rule(n=st.integers(0, 64))
    def evict(self, n: int) -> None:
        assert self.cache.evict(n) == self.model.evict(n)

    @precondition(lambda self: not self.ids)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.model.reset()

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        c, m = self.cache, self.model
        c.check_invariants()
        assert c.free_blocks().tolist() == m.free
        assert c.num_free_blocks == m.num_free_blocks
        assert c.cached_tokens == m.tree.total_size
        assert c.stats["hits"] == m.hits and c.stats["queries"] == m.queries
        # Slot accounting: every page is exactly one of free / tree / running-only.
        free = set(c.free_blocks().tolist())
        tree = c.cached_blocks().tolist()
        held = set()
        for rid in self.ids:
            held |= set(c.request_blocks(rid).tolist())
        held -= set(tree)
        assert len(set(tree)) == len(tree)
        assert not (free & set(tree)) and not (free & held)
        assert len(free) + len(tree) + len(held) == c.num_blocks - 1
        if self.ids:
            ids = np.asarray(self.ids, dtype=np.int64)
            bt = c.block_tables(ids)
            for row, rid in zip(bt, self.ids, strict=True):
                blocks = m.reqs[rid][2]
                assert row[: len(blocks)].tolist() == blocks
                assert not row[len(blocks) :].any()


TestRadixRequests = RadixRequestMachine.TestCase
TestRadixRequests.settings = settings(stateful_step_count=40)
