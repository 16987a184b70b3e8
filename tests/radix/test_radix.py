"""Radix tree: seed examples, SGLang's own scenarios (the test list in the SGLang radix
cache reference, ported), eviction policies, KV events, bad input, slot ownership, and the
request-level ``RadixPrefixCache``."""

from __future__ import annotations

import numpy as np
import pytest

import kvindex
from kvindex import (
    DTypeError,
    InvalidArgumentError,
    KvIndexError,
    LockError,
    StaleHandleError,
)
from models.radix_model import lcp


def a32(xs: object) -> np.ndarray:
    return np.asarray(xs, dtype=np.int32)


def tree(page_size: int = 1, **kw: object) -> kvindex.RadixCache:
    return kvindex.RadixCache(page_size, **kw)  # type: ignore[arg-type]


def ins(t: kvindex.RadixCache, toks: list[int], slots: list[int], ns: str | None = None) -> int:
    r = t.insert(a32(toks), a32(slots), ns)
    t.check_invariants()
    return r.prefix_len


def snapshot(t: kvindex.RadixCache) -> tuple[object, ...]:
    return (t.dump(), t.total_size, t.evictable_size, t.protected_size, t.clock)


# ----------------------------------------------------------------- seed examples


def test_seed_shared_prefix_splits_into_three_nodes() -> None:
    t = tree()
    A, B, C, D, E, F, X, Y, Z = range(1, 10)
    assert ins(t, [A, B, C, D, E, F], [10, 11, 12, 13, 14, 15]) == 0
    assert ins(t, [A, B, C, X, Y, Z], [20, 21, 22, 23, 24, 25]) == 3
    assert t.num_nodes == 3
    lines = [ln.strip() for ln in t.dump().splitlines()[2:]]
    assert [ln.split()[1:3] for ln in lines] == [
        ["len=3", "[1"],
        ["len=3", "[4"],
        ["len=3", "[7"],
    ]
    assert t.dump().splitlines()[3].startswith("    "), "children hang below [A B C]"
    m = t.match_prefix(a32([A, B, C, X, Y, Z]))
    assert m.hit_len == 6
    assert m.slots.tolist() == [10, 11, 12, 23, 24, 25]


@pytest.mark.parametrize(("page_size", "hit"), [(1, 100), (16, 96)])
def test_seed_two_prompts_share_100_tokens(page_size: int, hit: int) -> None:
    t = tree(page_size)
    shared = list(range(1000, 1100))
    p1 = shared + list(range(5000, 5028))
    p2 = shared + list(range(7000, 7028))
    t.insert(a32(p1), a32(range(len(p1))))
    m = t.match_prefix(a32(p2))
    assert m.hit_len == hit
    assert m.slots.tolist() == list(range(hit))
    t.check_invariants()


def test_seed_lru_order_and_locked_path_survives() -> None:
    t = tree()
    ins(t, [1, 1, 1], [0, 1, 2])
    ins(t, [2, 2, 2], [3, 4, 5])
    ins(t, [3, 3, 3], [6, 7, 8])
    t.match_prefix(a32([1, 1, 1]))
    t.match_prefix(a32([3, 3]))
    # recency now: [2 2 2] < [1 1 1] < [3 3 3] (the last match split [3 3 3])
    assert t.evict(1).tolist() == [3, 4, 5]
    assert t.evict(1).tolist() == [0, 1, 2]
    # A locked path survives; its unlocked parent chain stays matchable.
    ins(t, [5, 5, 5, 6, 6], [20, 21, 22, 23, 24])
    ins(t, [5, 5, 5, 7, 7], [30, 31, 32, 33, 34])
    m = t.match_prefix(a32([5, 5, 5, 6, 6]))
    t.lock(m.node)
    assert t.protected_size == 5
    freed = t.evict(10**9)
    assert sorted(freed.tolist()) == [6, 7, 8, 33, 34]
    assert t.match_prefix(a32([5, 5, 5, 6, 6, 9])).hit_len == 5
    assert t.total_size == 5
    t.unlock(m.node)
    assert t.evict(3).tolist() == [23, 24, 20, 21, 22], "cascade: leaf, then its parent"
    assert t.total_size == 0
    t.check_invariants()


# ------------------------------------------- SGLang's own test scenarios


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("events", [False, True])
def test_init_and_reset(page_size: int, events: bool) -> None:
    t = tree(page_size, enable_events=events)
    assert (t.page_size, t.total_size, t.evictable_size, t.protected_size) == (page_size, 0, 0, 0)
    t.insert(a32(range(8)), a32(range(8)))
    assert t.total_size == 8
    freed = t.reset()
    assert sorted(freed.tolist()) == list(range(8))
    assert (t.total_size, t.evictable_size, t.protected_size, t.num_nodes) == (0, 0, 0, 0)
    t.check_invariants()


def test_basic_insert_match_and_sizes() -> None:
    t = tree()
    r = t.insert(a32([1, 2, 3]), a32([10, 20, 30]))
    assert r.prefix_len == 0 and r.to_free.tolist() == []
    assert (t.total_size, t.evictable_size) == (3, 3)
    assert t.match_prefix(a32([1, 2, 3])).slots.tolist() == [10, 20, 30]
    assert t.match_prefix(a32([1, 2])).slots.tolist() == [10, 20]
    t.insert(a32([4, 5]), a32([40, 50]))
    assert t.total_size == 5
    assert len(t) == 5
    assert sorted(t.all_slots().tolist()) == [10, 20, 30, 40, 50]
    t.check_invariants()


def test_namespace_isolation() -> None:
    t = tree()
    ins(t, [1, 2, 3], [10, 20, 30], "key1")
    ins(t, [1, 2, 3], [11, 21, 31], "key2")
    ins(t, [1, 2, 3], [12, 22, 32], None)
    assert t.match_prefix(a32([1, 2, 3]), "key1").slots.tolist() == [10, 20, 30]
    assert t.match_prefix(a32([1, 2, 3]), "key2").slots.tolist() == [11, 21, 31]
    assert t.match_prefix(a32([1, 2, 3])).slots.tolist() == [12, 22, 32]
    assert t.match_prefix(a32([1, 2, 3]), "unknown").hit_len == 0
    assert t.match_prefix(a32([1, 2, 3]), "").hit_len == 0
    assert t.num_nodes == 3


def test_lock_moves_sizes_and_unlock_restores() -> None:
    t = tree()
    ins(t, [1, 2, 3], [10, 20, 30])
    m = t.match_prefix(a32([1, 2, 3]))
    t.lock(m.node)
    assert (t.evictable_size, t.protected_size) == (0, 3)
    assert t.lock_ref(m.node) == 1
    t.unlock(m.node)
    assert (t.evictable_size, t.protected_size) == (3, 0)
    # Locking the root (a miss) is a no-op.
    miss = t.match_prefix(a32([9, 9]))
    assert miss.node == 0
    t.lock(miss.node)
    t.unlock(miss.node)
    t.check_invariants()


def test_evict_frees_at_least_requested() -> None:
    t = tree()
    ins(t, [1, 2], [10, 20])
    ins(t, [3, 4], [30, 40])
    freed = t.evict(2)
    assert len(freed) >= 2
    assert t.total_size == 4 - len(freed)
    # evict(1) on a 2-token leaf frees the whole leaf (overshoot).
    assert len(t.evict(1)) == 2
    assert len(t.evict(5)) == 0
    t.check_invariants()


@pytest.mark.parametrize(("page_size", "n"), [(1, 5), (2, 5), (4, 6)])
def test_page_alignment(page_size: int, n: int) -> None:
    t = tree(page_size)
    toks = list(range(1, n + 1))
    r = t.insert(a32(toks), a32(range(n)))
    aligned = n // page_size * page_size
    assert r.to_free.tolist() == list(range(aligned, n)), "the unaligned tail is the caller's"
    m = t.match_prefix(a32(toks))
    assert m.hit_len % page_size == 0
    assert m.hit_len == aligned
    # A query shorter than one page hits 0 and touches nothing.
    if page_size > 1:
        before = snapshot(t)
        assert t.match_prefix(a32(toks[: page_size - 1])).hit_len == 0
        assert snapshot(t) == before


@pytest.mark.parametrize("page_size", [1, 2])
def test_splits(page_size: int) -> None:
    t = tree(page_size)
    v1 = list(range(100, 108))
    t.insert(a32(range(1, 9)), a32(v1))
    r = t.insert(a32([1, 2, 9, 10]), a32([200, 201, 202, 203]))
    assert r.prefix_len == 2
    assert r.to_free.tolist() == [200, 201]
    assert t.total_size == 10
    m = t.match_prefix(a32([1, 2, 3, 4, 999, 1000]))
    assert m.slots.tolist() == v1[:4]
    assert t.total_size == 10
    assert t.match_prefix(a32(range(1, 9))).slots.tolist() == v1
    assert t.match_prefix(a32([1, 2, 3, 4, 5, 6, 777, 888])).slots.tolist() == v1[:6]
    assert t.match_prefix(a32([1, 2, 9, 10])).slots.tolist() == [100, 101, 202, 203]
    t.check_invariants()


def test_dump_and_repr() -> None:
    t = tree(4)
    t.insert(a32(range(40)), a32(range(40)), "ns")
    d = t.dump()
    assert "len=40" in d and 'ns="ns"' in d and "..." in d
    assert "RadixTree(page_size=4" in repr(t)


def test_key_matching_like_radix_key() -> None:
    assert lcp([1, 2, 3, 4, 5], [1, 2, 3, 9, 9]) == 3
    assert lcp([1, 2], [3, 4]) == 0
    assert lcp(list(range(200)), list(range(200)) + [5]) == 200
    t = tree(4)
    t.insert(a32([1, 2, 3, 4, 5, 6, 7, 8]), a32(range(8)))
    assert t.match_prefix(a32([1, 2, 3, 4, 5, 6, 0, 0])).hit_len == 4
    t2 = tree()
    t2.insert(a32(range(300)), a32(range(300)))
    for cut in (0, 1, 63, 64, 65, 129, 299):
        q = list(range(300))
        q[cut] = -1
        assert t2.probe(a32(q)) == cut


def test_insert_prefix_of_edge_and_identical_reinsert() -> None:
    t = tree()
    ins(t, [1, 2, 3], [10, 20, 30])
    r = t.insert(a32([1, 2]), a32([10, 20]))
    assert (r.prefix_len, r.to_free.tolist()) == (2, [])
    assert t.num_nodes == 2, "inserting a strict prefix splits the edge"
    r = t.insert(a32([1, 2, 3]), a32([10, 20, 30]))
    assert (r.prefix_len, t.num_nodes, t.total_size) == (3, 2, 3)


# ----------------------------------------------------------------- policies


def _order(policy: str) -> list[int]:
    t = tree(policy=policy)
    ins(t, [1, 1], [10, 11])  # created first
    ins(t, [2, 2], [20, 21])
    ins(t, [3, 3], [30, 31])  # created last
    t.insert(a32([2, 2]), a32([20, 21]))  # [2 2]: 2 inserts
    t.match_prefix(a32([1, 1]))  # [1 1]: most recent
    return [int(t.evict(1)[0]) // 10 for _ in range(3)]


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("lru", [3, 2, 1]),
        ("mru", [1, 2, 3]),
        ("fifo", [1, 2, 3]),
        ("filo", [3, 2, 1]),
        ("lfu", [3, 1, 2]),
        ("slru", [3, 1, 2]),
    ],
)
def test_policy_orders(policy: str, order: list[int]) -> None:
    assert _order(policy) == order


def test_priority_policy_max_along_path() -> None:
    t = tree(policy="priority")
    t.insert(a32([1, 1]), a32([1, 2]), priority=5)
    t.insert(a32([2, 2]), a32([3, 4]), priority=-1)
    t.insert(a32([3, 3]), a32([5, 6]), priority=5)
    t.insert(a32([2, 2, 9]), a32([3, 4, 7]), priority=9)  # raises [2 2]'s priority
    assert t.evict(2).tolist() == [1, 2]
    assert t.evict(2).tolist() == [5, 6]
    assert t.evict(5).tolist() == [7, 3, 4]


def test_policies_listed() -> None:
    assert set(kvindex.RADIX_POLICIES) == {"lru", "lfu", "fifo", "mru", "filo", "priority", "slru"}


# ------------------------------------------------------------------- events


def test_events_page_hashes() -> None:
    t = tree(4, enable_events=True)
    t.insert(a32([1, 2, 3, 4, 1, 2, 3, 4]), a32(range(8)))
    (ev,) = t.take_events()
    assert isinstance(ev, kvindex.BlockStored)
    assert len(ev.block_hashes) == 2, "8 tokens at page size 4: 2 page hashes"
    assert ev.block_hashes[0] != ev.block_hashes[1], "a repeated page hashes differently"
    assert ev.parent_block_hash is None and ev.block_size == 4 and len(ev.token_ids) == 8
    # Split at the page boundary: the new branch's parent is the upper node's one page.
    t.insert(a32([1, 2, 3, 4, 9, 9, 9, 9]), a32(range(8, 16)))
    (ev2,) = t.take_events()
    assert ev2.parent_block_hash == ev.block_hashes[0]
    assert ev2.token_ids == [9, 9, 9, 9]
    # Namespaces seed the chain.
    t.insert(a32([1, 2, 3, 4]), a32(range(16, 20)), "k")
    (ev3,) = t.take_events()
    assert ev3.block_hashes[0] != ev.block_hashes[0]
    assert ev3.extra_keys == [("k",)]
    freed = t.evict(10**6)
    assert len(freed) == 16
    removed = t.take_events()
    assert all(isinstance(e, kvindex.BlockRemoved) and e.block_hashes for e in removed)
    assert sum(len(e.block_hashes) for e in removed) == 4
    t.reset()
    assert [type(e).__name__ for e in t.take_events()] == ["AllBlocksCleared"]


def test_events_off_by_default() -> None:
    t = tree()
    t.insert(a32([1, 2]), a32([1, 2]))
    assert t.take_events() == []


def fold(held: dict[int, int], events: list[object]) -> list[int]:
    """A subscriber's hash set after ``events`` (announcements counted), sorted."""
    for e in events:
        if isinstance(e, kvindex.BlockStored):
            for h in e.block_hashes:
                held[h] = held.get(h, 0) + 1
        elif isinstance(e, kvindex.BlockRemoved):
            for h in e.block_hashes:
                held[h] -= 1
                if not held[h]:
                    del held[h]
        else:
            held.clear()
    return sorted(held)


def test_cached_page_hashes_are_what_the_events_announced() -> None:
    t = tree(2, enable_events=True)
    held: dict[int, int] = {}

    def same() -> None:
        got = t.cached_page_hashes()
        assert got.dtype == np.uint64 and got.ndim == 1
        assert got.tolist() == fold(held, t.take_events())
        assert got.tolist() == sorted(set(got.tolist()))

    assert t.cached_page_hashes().tolist() == []
    ins(t, [1, 2, 3, 4, 5, 6], range(6))
    same()
    t.match_prefix(a32([1, 2, 3, 4, 9]))  # splits an edge: the set is unchanged
    same()
    ins(t, [1, 2, 3, 4, 7, 8], range(10, 16))
    ins(t, [1, 2], range(20, 22), "ns")
    same()
    assert len(t.cached_page_hashes()) == t.total_size // 2 == 5
    before = snapshot(t)
    t.cached_page_hashes()
    assert snapshot(t) == before and t.take_events() == [], "read-only"
    t.evict(2)
    same()
    t.reset()
    same()
    assert t.cached_page_hashes().tolist() == []


def test_prefix_cache_page_hashes_follow_its_events() -> None:
    c = kvindex.RadixPrefixCache(16, 4, enable_events=True)
    held: dict[int, int] = {}
    rng = np.random.default_rng(3)
    base = rng.integers(0, 50, 40).astype(np.int32)
    running: list[int] = []
    for rid in range(40):
        n = int(rng.integers(5, 20))
        p = np.concatenate([base[: int(rng.integers(0, 20))], rng.integers(0, 50, n)])
        if c.admit(rid, p.astype(np.int32)) is not None:
            c.checkpoint(rid)  # a running request's pages enter the tree
            c.append(rid, a32([1, 2, 3]))
            running.append(rid)
        if len(running) > 1 or (running and rid % 4 == 0):
            c.free(running.pop(0))
        assert c.cached_page_hashes().tolist() == fold(held, c.take_events())
    assert c.stats["evictions"] > 0
    c.check_invariants()


@pytest.mark.parametrize("design", ["tree", "cache"])
def test_cached_page_hashes_need_events(design: str) -> None:
    c: kvindex.RadixCache | kvindex.RadixPrefixCache
    if design == "tree":
        c = tree(1)
        c.insert(a32([1, 2]), a32([1, 2]))
    else:
        c = kvindex.RadixPrefixCache(8, 1)
        c.admit(1, a32([1, 2, 3]))
        c.free(1)
    before = c.dump()
    with pytest.raises(InvalidArgumentError, match="enable_events"):
        c.cached_page_hashes()
    assert c.dump() == before


# ---------------------------------------------------------------- bad input


def test_bad_page_size_and_policy() -> None:
    for ps in (0, -1):
        with pytest.raises(InvalidArgumentError):
            tree(ps)
    with pytest.raises(InvalidArgumentError, match="policy"):
        tree(policy="random")
    with pytest.raises(InvalidArgumentError):
        kvindex.RadixPrefixCache(10, 0)


@pytest.fixture
def busy_tree() -> kvindex.RadixCache:
    t = tree(4, enable_events=True)
    t.insert(a32(range(16)), a32(range(16)))
    t.insert(a32(list(range(8)) + [50] * 8), a32(range(16, 32)))
    m = t.match_prefix(a32(range(12)))
    t.lock(m.node)
    t.take_events()
    return t


@pytest.mark.parametrize(
    ("tokens", "slots", "exc"),
    [
        (np.arange(8, dtype=np.float64), np.arange(100, 108, dtype=np.int32), DTypeError),
        (np.arange(8, dtype=np.int16), np.arange(100, 108, dtype=np.int32), DTypeError),
        (
            np.arange(16, dtype=np.int32).reshape(2, 8),
            np.arange(100, 116, dtype=np.int32),
            DTypeError,
        ),
        (np.arange(16, dtype=np.int32)[::2], np.arange(100, 108, dtype=np.int32), DTypeError),
        ([1, 2, 3, 4], np.arange(100, 104, dtype=np.int32), DTypeError),
        (np.arange(8, dtype=np.int32), np.arange(100, 107, dtype=np.int32), InvalidArgumentError),
        (np.arange(8, dtype=np.int32), np.arange(100, 109, dtype=np.int32), InvalidArgumentError),
        (np.arange(8, dtype=np.int32), np.arange(100, 108, dtype=np.float32), DTypeError),
        (
            np.arange(8, dtype=np.int32),
            np.array([100, 101, 102, 103, -1, 5, 6, 7], np.int32),
            InvalidArgumentError,
        ),
        (
            np.array([1, 2, 3, 2**40], np.int64),
            np.arange(100, 104, dtype=np.int32),
            InvalidArgumentError,
        ),
        # page_size 4: each page's slots must be a page-aligned run
        (
            np.arange(100, 108, dtype=np.int32),
            np.arange(101, 109, dtype=np.int32),
            InvalidArgumentError,
        ),
        (
            np.arange(100, 108, dtype=np.int32),
            np.array([100, 101, 102, 104, 104, 105, 106, 107], np.int32),
            InvalidArgumentError,
        ),
        # a slot the tree already holds, or one passed twice
        (
            np.arange(100, 108, dtype=np.int32),
            np.arange(0, 8, dtype=np.int32),
            InvalidArgumentError,
        ),
        (
            np.arange(100, 108, dtype=np.int32),
            np.array([200, 201, 202, 203, 200, 201, 202, 203], np.int32),
            InvalidArgumentError,
        ),
        (
            np.arange(100, 110, dtype=np.int32),
            np.array([*range(200, 208), 204, 205], np.int32),
            InvalidArgumentError,
        ),
    ],
)
def test_bad_insert_leaves_state_unchanged(
    busy_tree: kvindex.RadixCache, tokens: object, slots: object, exc: type[Exception]
) -> None:
    before = snapshot(busy_tree)
    with pytest.raises(exc) as info:
        busy_tree.insert(tokens, slots)
    assert isinstance(info.value, KvIndexError)
    assert snapshot(busy_tree) == before
    assert busy_tree.take_events() == []
    busy_tree.check_invariants()


def test_bad_match_input(busy_tree: kvindex.RadixCache) -> None:
    before = snapshot(busy_tree)
    for bad in (np.zeros(4, np.float32), np.zeros((2, 4), np.int32), [1, 2, 3, 4], None):
        with pytest.raises(DTypeError):
            busy_tree.match_prefix(bad)
    with pytest.raises(TypeError):
        busy_tree.match_prefix(a32([1, 2, 3, 4]), 5)
    assert snapshot(busy_tree) == before


def test_stale_and_unknown_handles() -> None:
    t = tree()
    ins(t, [1, 2, 3], [1, 2, 3])
    m = t.match_prefix(a32([1, 2, 3]))
    t.evict(10)
    for op in (t.lock, t.unlock, t.lock_ref, t.path_slots):
        with pytest.raises(StaleHandleError) as info:
            op(m.node)
        assert isinstance(info.value, KeyError)
    ins(t, [4, 5], [4, 5])
    m2 = t.match_prefix(a32([4, 5]))
    assert m2.node != m.node, "a reused arena slot gets a new generation"
    with pytest.raises(StaleHandleError):
        t.lock(m.node)
    t.reset()
    with pytest.raises(StaleHandleError):
        t.lock(m2.node)
    for bad in (123456, 2**40 + 1):
        with pytest.raises(StaleHandleError):
            t.lock(bad)
    with pytest.raises(InvalidArgumentError):
        t.lock(-1)
    with pytest.raises(DTypeError):
        t.lock("node")
    t.check_invariants()


def test_double_unlock_refused_state_unchanged() -> None:
    t = tree()
    ins(t, [1, 2, 3, 4], [1, 2, 3, 4])
    m = t.match_prefix(a32([1, 2, 3, 4]))
    t.lock(m.node)
    upper = t.match_prefix(a32([1, 2, 9])).node  # splits; the upper half is locked via its child
    t.unlock(m.node)
    before = snapshot(t)
    with pytest.raises(LockError) as info:
        t.unlock(m.node)
    assert isinstance(info.value, RuntimeError)
    t.lock(m.node)
    with pytest.raises(LockError):
        t.unlock(upper)  # locked only through its descendant
    t.unlock(m.node)
    assert snapshot(t)[1:4] == before[1:4]
    t.check_invariants()


# ---------------------------------------------------- slot ownership (no leak)


class StrictAllocator:
    """Slots 0..n; raises on double free or on freeing a slot never handed out."""

    def __init__(self, n: int) -> None:
        self.free_slots = list(range(n))[::-1]
        self.used: set[int] = set()

    def alloc(self, k: int) -> list[int]:
        out = [self.free_slots.pop() for _ in range(k)]
        self.used.update(out)
        return out

    def free(self, slots: object) -> None:
        for s in np.asarray(slots).tolist():
            if s not in self.used:
                raise AssertionError(f"double free of slot {s}")
            self.used.remove(s)
            self.free_slots.append(s)


def test_duplicates_freed_exactly_once_no_leak() -> None:
    rng = np.random.default_rng(7)
    alloc = StrictAllocator(4000)
    t = tree()
    bases = [rng.integers(0, 50, 40).tolist() for _ in range(4)]
    held: list[tuple[list[int], list[int], int]] = []
    for step in range(300):
        if held and (rng.random() < 0.5 or len(held) > 6):
            toks, slots, node = held.pop(int(rng.integers(len(held))))
            r = t.insert(a32(toks), a32(slots))
            alloc.free(r.to_free)
            t.unlock(node)
        else:
            base = bases[int(rng.integers(4))]
            toks = (
                base[: int(rng.integers(0, 40))]
                + rng.integers(0, 50, int(rng.integers(1, 10))).tolist()
            )
            m = t.match_prefix(a32(toks))
            t.lock(m.node)
            slots = m.slots.tolist() + alloc.alloc(len(toks) - m.hit_len)
            held.append((toks, slots, m.node))
        if step % 7 == 0:
            alloc.free(t.evict(int(rng.integers(0, 30))))
        t.check_invariants()
        running = [s for _, slots, node in held for s in slots]
        tree_slots = t.all_slots().tolist()
        assert len(set(tree_slots)) == len(tree_slots)
        own = set(running) - set(tree_slots)
        assert own | set(tree_slots) == alloc.used, "every used slot is the tree's or a request's"
    for toks, slots, node in held:
        alloc.free(t.insert(a32(toks), a32(slots)).to_free)
        t.unlock(node)
    alloc.free(t.reset())
    assert alloc.used == set(), "no leak"


# ---------------------------------------------------- request-level cache


def test_prefix_cache_lifecycle_page_16() -> None:
    c = kvindex.RadixPrefixCache(64, 16, enable_events=True)
    prompt = a32(range(100, 140))  # 40 tokens: 2 full pages + 8
    adm = c.admit(1, prompt)
    assert adm is not None and adm.num_cached_tokens == 0
    n, blocks = adm
    assert len(blocks) == 3 and 0 not in blocks.tolist(), "page 0 is the null page"
    assert c.append(1, a32([1, 2, 3]))
    assert c.num_tokens(1) == 43
    sm = c.slot_mapping(np.array([1], np.int64), np.array([3], np.int64))
    assert sm.tolist() == [int(blocks[2]) * 16 + k for k in (8, 9, 10)]
    c.free(1)
    c.check_invariants()
    assert c.cached_tokens == 32
    assert c.lookup(prompt) == 32
    adm2 = c.admit(2, a32(list(range(100, 140)) + [1, 2, 3, 4]))
    assert adm2 is not None and adm2.num_cached_tokens == 32
    assert adm2.block_ids[:2].tolist() == blocks[:2].tolist()
    bt = c.block_tables(np.array([2, 2], np.int64), max_blocks=5)
    assert bt.shape == (2, 5) and bt[0, 3:].tolist() == [0, 0]
    assert c.stats["hits"] == 32
    assert any(isinstance(e, kvindex.BlockStored) for e in c.take_events())
    c.free(2)
    c.check_invariants()


def test_prefix_cache_lookup_int64_checks_every_token_past_its_hit() -> None:
    # An int64 prompt is compared in place; ids inside the hit equal int32 keys, and
    # every id after it (past the hit cap too) is still range checked.
    c = kvindex.RadixPrefixCache(64, 4)
    prompt = a32(range(100, 133))
    assert c.admit(1, prompt) is not None
    c.free(1)
    wide = prompt.astype(np.int64)
    assert c.lookup(wide) == c.lookup(prompt) == 32
    for at in (5, 31, 32):  # inside the cached pages, in the last page, the last token
        bad = wide.copy()
        bad[at] = 2**31 + at
        with pytest.raises(InvalidArgumentError, match=f"token id {2**31 + at} does not fit"):
            c.lookup(bad)
        # The token rule is checked before the key spec, as admission checks it.
        with pytest.raises(InvalidArgumentError, match="does not fit in int32"):
            c.lookup(bad, mm_items=[("h", 0, 1)])
    assert c.lookup(wide, cache_salt="s") == 0
    c.check_invariants()


def test_prefix_cache_token_level_and_eviction() -> None:
    c = kvindex.RadixPrefixCache(101, 1)  # 100 usable slots, token-level tables
    p = a32(range(60))
    c.admit(1, p)
    c.free(1)
    assert c.num_free_blocks == 100 and c.num_unused_blocks == 40
    q = a32(list(range(30)) + list(range(500, 560)))  # hits 30, needs 60 more
    adm = c.admit(2, q)
    assert adm is not None and adm.num_cached_tokens == 30
    assert len(adm.block_ids) == 90
    c.check_invariants()
    assert c.admit(3, a32(range(900, 920))) is None, "the locked hit cannot be evicted"
    c.check_invariants()
    c.free(2)
    c.check_invariants()


def test_prefix_cache_checkpoint_and_errors() -> None:
    c = kvindex.RadixPrefixCache(32, 4)
    p = a32(range(9))
    c.admit(1, p)
    assert c.lookup(p) == 0
    c.checkpoint(1)
    assert c.lookup(p) == 8 and c.num_cached_tokens(1) == 8
    with pytest.raises(kvindex.DuplicateRequestError):
        c.admit(1, p)
    with pytest.raises(InvalidArgumentError, match="mm_items"):
        c.admit(2, p, mm_items=[("img", 0, 4)])
    with pytest.raises(InvalidArgumentError):
        c.admit(2, a32([]))
    with pytest.raises(kvindex.UnknownRequestError):
        c.free(9)
    with pytest.raises(kvindex.BlockInUseError):
        c.reset()
    c.free(1)
    with pytest.raises(kvindex.UnknownRequestError):
        c.free(1)
    c.reset()
    assert c.cached_tokens == 0 and c.num_unused_blocks == 31
    c.check_invariants()


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_protocol_and_factory(design: str) -> None:
    c = kvindex.make_cache(design, 32, 4)
    assert isinstance(c, kvindex.PrefixCache)
    assert c.block_size == 4 and c.num_blocks == 32
    adm = c.admit(7, a32(range(10)))
    assert adm is not None
    assert c.append_batch(np.array([7], np.int64), a32([1]))
    assert c.request_blocks(7).tolist() == c.block_tables(np.array([7], np.int64))[0].tolist()
    c.free_batch(np.array([7], np.int64))
    assert c.num_requests == 0
    c.check_invariants()
    with pytest.raises(InvalidArgumentError):
        kvindex.make_cache("btree", 32, 4)


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_common_prefix_blocks_both_designs(design: str) -> None:
    """Both designs count the blocks every running request shares, from block 0."""
    c = kvindex.make_cache(design, 64, 16)
    assert c.num_common_prefix_blocks == 0  # nothing runs
    system = np.arange(64, dtype=np.int32)  # 4 full blocks
    c.admit(0, np.concatenate([system, np.arange(1000, 1040, dtype=np.int32)]))
    assert c.num_common_prefix_blocks == 7  # a lone request shares all its blocks
    c.free(0)
    c.admit(1, np.concatenate([system, np.arange(2000, 2040, dtype=np.int32)]))
    c.admit(2, np.concatenate([system, np.arange(3000, 3020, dtype=np.int32)]))
    assert c.num_common_prefix_blocks == 4  # the system prompt, cached by request 0
    c.admit(3, np.arange(500, 540, dtype=np.int32))  # diverges at block 0
    assert c.num_common_prefix_blocks == 0
    c.free_batch(np.array([1, 2, 3], dtype=np.int64))
    assert c.num_common_prefix_blocks == 0
    c.check_invariants()
