"""A pure-Python radix tree with the semantics of ``kvindex.RadixTree``.

Written from the SGLang reference (``RadixCache``: dict children keyed by the
first token / first page, per-token values, lock refs walking to the root,
eviction from a heap rebuilt per call over the evictable leaves) under a
logical clock, so it is deterministic. It is the oracle of the stateful tests
and the pure-Python baseline of ``benches/bench_radix.py``.

Keys and values are ``array('q')`` (as SGLang's ``RadixKey`` holds
``array('q')`` token ids), so slicing and comparing runs at C speed; inputs may
be lists, arrays or numpy arrays. Differences from SGLang kept on purpose (they
are kvindex's semantics too): unlocking a node that holds no lock of its own
raises, and ``insert`` returns the caller's slots the tree did not take
(``to_free``).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from typing import Any


def as_array(xs: Any) -> array[int]:
    """``xs`` as ``array('q')`` (no copy when it already is one)."""
    if isinstance(xs, array) and xs.typecode == "q":
        return xs
    if hasattr(xs, "tolist"):
        xs = xs.tolist()
    return array("q", xs)


__all__ = ["ModelNode", "RadixModel", "lcp"]


def lcp(a: Sequence[int], b: Sequence[int], a0: int = 0, b0: int = 0) -> int:
    """Common prefix length of ``a[a0:]`` and ``b[b0:]`` (galloping slice compares)."""
    n = min(len(a) - a0, len(b) - b0)
    i = 0
    w = 64
    while i < n:
        e = min(i + w, n)
        if a[a0 + i : a0 + e] == b[b0 + i : b0 + e]:
            i = e
            w *= 2
            continue
        lo, hi = i, e - 1  # answer in [i, e-1]: a[..lo] equal, a[hi] differs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[a0 + lo : a0 + mid] == b[b0 + lo : b0 + mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo
    return n


class ModelNode:
    __slots__ = (
        "children",
        "created",
        "hit_count",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "ns",
        "own_locks",
        "parent",
        "priority",
        "value",
    )

    def __init__(self, nid: int, tick: int) -> None:
        self.id = nid
        self.key: array[int] = array("q")
        self.value: array[int] = array("q")
        self.parent: ModelNode | None = None
        self.children: dict[Any, ModelNode] = {}
        self.ns: str | None = None
        self.lock_ref = 0
        self.own_locks = 0
        self.last_access = tick
        self.created = tick
        self.hit_count = 0
        self.priority = 0


class RadixModel:
    """Pure-Python radix tree: ``match_prefix`` / ``insert`` / ``lock`` /
    ``unlock`` / ``evict`` / ``reset`` with kvindex's return shapes."""

    POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")

    def __init__(self, page_size: int = 1, policy: str = "lru", slru_threshold: int = 2) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if policy not in self.POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.page_size = page_size
        self.policy = policy
        self.slru_threshold = slru_threshold
        self.clock = 0
        self._next_id = 1
        self.reset()

    # ------------------------------------------------------------ helpers
    def reset(self) -> list[int]:
        """Drops every node; returns the slots the tree held."""
        freed = self.all_slots() if hasattr(self, "root") else []
        self.root = ModelNode(0, 0)
        self.root.lock_ref = 1
        self.root.priority = -(2**63)
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[ModelNode] = set()
        self.nodes: dict[int, ModelNode] = {}
        return freed

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def _child_key(self, ns: str | None, toks: Sequence[int], at: int) -> Any:
        if self.page_size == 1:
            return (ns, toks[at])
        return (ns, tuple(toks[at : at + self.page_size]))

    def _new_node(self, tick: int) -> ModelNode:
        n = ModelNode(self._next_id, tick)
        self._next_id += 1
        self.nodes[n.id] = n
        return n

    def _update_leaf(self, n: ModelNode) -> None:
        if n is not self.root and n.lock_ref == 0 and not n.children:
            self.evictable_leaves.add(n)
        else:
            self.evictable_leaves.discard(n)

    def _key(self, n: ModelNode) -> tuple[int, int]:
        p = self.policy
        if p == "lru":
            return (n.last_access, 0)
        if p == "lfu":
            return (n.hit_count, n.last_access)
        if p == "fifo":
            return (n.created, 0)
        if p == "mru":
            return (-n.last_access, 0)
        if p == "filo":
            return (-n.created, 0)
        if p == "priority":
            return (n.priority, n.last_access)
        return (int(n.hit_count >= self.slru_threshold), n.last_access)

    def _walk(self, q: Sequence[int], ns: str | None) -> list[tuple[ModelNode, int]]:
        """Visited children and their matched lengths (the last may be partial)."""
        ps = self.page_size
        path: list[tuple[ModelNode, int]] = []
        node = self.root
        pos = 0
        while pos < len(q):
            child = node.children.get(self._child_key(ns, q, pos))
            if child is None:
                break
            m = lcp(child.key, q, 0, pos) // ps * ps
            path.append((child, m))
            pos += m
            if m < len(child.key):
                break
            node = child
        return path

    def _split(self, c: ModelNode, m: int, tick: int) -> ModelNode:
        u = self._new_node(tick)
        u.key, c.key = c.key[:m], c.key[m:]
        u.value, c.value = c.value[:m], c.value[m:]
        u.parent = c.parent
        u.ns = c.ns
        u.lock_ref = c.lock_ref
        u.hit_count = c.hit_count
        u.priority = c.priority
        assert c.parent is not None
        c.parent.children[self._child_key(u.ns, u.key, 0)] = u
        u.children[self._child_key(c.ns, c.key, 0)] = c
        c.parent = u
        return u

    def _aligned(self, tokens: Any) -> array[int]:
        toks = as_array(tokens)
        n = len(toks) // self.page_size * self.page_size
        return toks if n == len(toks) else toks[:n]

    # ---------------------------------------------------------------- API
    def probe(self, tokens: Any, namespace: str | None = None) -> int:
        q = self._aligned(tokens)
        return sum(m for _, m in self._walk(q, namespace)) if q else 0

    def match_prefix(
        self, tokens: Any, namespace: str | None = None
    ) -> tuple[int, array[int], ModelNode]:
        """(hit length, matched slots, last node); splits a partially matched edge."""
        q = self._aligned(tokens)
        if not q:
            return 0, array("q"), self.root
        self.clock += 1
        tick = self.clock
        self.root.last_access = tick
        node = self.root
        slots = array("q")
        for c, m in self._walk(q, namespace):
            c.last_access = tick
            node = self._split(c, m, tick) if m < len(c.key) else c
            slots.extend(node.value)
        return len(slots), slots, node

    def insert(
        self,
        tokens: Any,
        slots: Any,
        namespace: str | None = None,
        priority: int = 0,
    ) -> tuple[int, array[int]]:
        """(prefix length already present, slots the caller must free)."""
        assert len(tokens) == len(slots)
        q = self._aligned(tokens)
        slots = as_array(slots)
        n = len(q)
        if not q:
            return 0, slots
        path = self._walk(q, namespace)
        self.clock += 1
        tick = self.clock
        self.root.last_access = tick
        self.root.priority = max(self.root.priority, priority)
        node = self.root
        pos = 0
        to_free = array("q")
        for c, m in path:
            c.last_access = tick
            mine, tree_vals = slots[pos : pos + m], c.value[:m]
            if mine != tree_vals:
                to_free.extend(s for s, t in zip(mine, tree_vals, strict=True) if s != t)
            node = self._split(c, m, tick) if m < len(c.key) else c
            node.priority = max(node.priority, priority)
            node.hit_count += 1
            pos += m
        if pos < n:
            leaf = self._new_node(tick)
            leaf.key = q[pos:]
            leaf.value = slots[pos:n]
            leaf.parent = node
            leaf.ns = namespace
            leaf.priority = priority
            leaf.hit_count = 1
            node.children[self._child_key(namespace, leaf.key, 0)] = leaf
            self.evictable_size += len(leaf.key)
            self._update_leaf(node)
            self._update_leaf(leaf)
        to_free.extend(slots[n:])
        return pos, to_free

    def lock(self, node: ModelNode) -> None:
        if node is self.root:
            return
        node.own_locks += 1
        cur: ModelNode | None = node
        while cur is not None and cur is not self.root:
            if cur.lock_ref == 0:
                self.evictable_size -= len(cur.key)
                self.protected_size += len(cur.key)
            cur.lock_ref += 1
            self._update_leaf(cur)
            cur = cur.parent

    def unlock(self, node: ModelNode) -> None:
        if node is self.root:
            return
        if node.own_locks == 0:
            raise RuntimeError("unlock of a node that holds no lock of its own")
        node.own_locks -= 1
        cur: ModelNode | None = node
        while cur is not None and cur is not self.root:
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self.evictable_size += len(cur.key)
                self.protected_size -= len(cur.key)
            self._update_leaf(cur)
            cur = cur.parent

    def evict(self, num_tokens: int) -> array[int]:
        """Frees whole unlocked leaves, lowest key first (cascading); returns their slots."""
        heap = [(self._key(n), n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = array("q")
        done = 0
        while done < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            freed.extend(x.value)
            done += len(x.key)
            parent = x.parent
            assert parent is not None
            del parent.children[self._child_key(x.ns, x.key, 0)]
            self.evictable_size -= len(x.key)
            self.evictable_leaves.discard(x)
            del self.nodes[x.id]
            self._update_leaf(parent)
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (self._key(parent), parent.id, parent))
        return freed

    def path_slots(self, node: ModelNode) -> list[int]:
        parts: list[array[int]] = []
        cur: ModelNode | None = node
        while cur is not None and cur is not self.root:
            parts.append(cur.value)
            cur = cur.parent
        return [s for p in reversed(parts) for s in p]

    def all_slots(self) -> list[int]:
        return [s for n in self.nodes.values() for s in n.value]

    def sequences(self) -> list[tuple[str | None, list[int]]]:
        """Every leaf's full token path with its namespace, sorted."""
        out = []
        for n in self.nodes.values():
            if not n.children:
                toks = array("q")
                cur: ModelNode | None = n
                while cur is not None and cur is not self.root:
                    toks = cur.key + toks
                    cur = cur.parent
                out.append((n.ns, list(toks)))
        return sorted(out, key=lambda x: (x[0] or "", x[0] is not None, x[1]))


class RadixCacheModel:
    """Pure-Python model of ``kvindex.RadixPrefixCache`` (page pool + tree).

    Mirrors the Rust cache step by step, including the FIFO order in which
    pages return to the pool, so block ids can be compared exactly.
    """

    def __init__(self, num_blocks: int, page_size: int, policy: str = "lru") -> None:
        self.ps = page_size
        self.num_blocks = num_blocks
        self.tree = RadixModel(page_size, policy)
        self.free: list[int] = list(range(1, num_blocks))
        self.refs: dict[int, int] = {}
        # rid -> [tokens, ns, pages, node, cached]
        self.reqs: dict[int, list[Any]] = {}
        self.hits = 0
        self.queries = 0

    # -------------------------------------------------------------- pool
    def _incref(self, pages: Sequence[int]) -> None:
        for p in pages:
            assert self.refs.get(p, 0) > 0
            self.refs[p] += 1

    def _decref(self, pages: Sequence[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                del self.refs[p]
                self.free.append(p)

    def _alloc(self, n: int, out: list[int]) -> None:
        for _ in range(n):
            p = self.free.pop(0)
            self.refs[p] = 1
            out.append(p)

    def _pages(self, slots: Sequence[int]) -> list[int]:
        return [s // self.ps for s in slots[:: self.ps]]

    def _slots(self, pages: Sequence[int]) -> list[int]:
        return [p * self.ps + k for p in pages for k in range(self.ps)]

    def _ensure_free(self, need: int) -> None:
        if len(self.free) < need:
            freed = self.tree.evict((need - len(self.free)) * self.ps)
            self._decref(self._pages(freed))
        assert len(self.free) >= need

    @property
    def num_free_blocks(self) -> int:
        return len(self.free) + self.tree.evictable_size // self.ps

    # --------------------------------------------------------------- API
    def _cap(self, n: int) -> int:
        return (n - 1) // self.ps * self.ps

    def lookup(self, tokens: Sequence[int], ns: str | None) -> int:
        return self.tree.probe(as_array(tokens)[: self._cap(len(tokens))], ns)

    def admit(self, rid: int, tokens: list[int], ns: str | None, skip: bool) -> int | None:
        assert rid not in self.reqs and tokens
        n = len(tokens)
        cap = 0 if skip else self._cap(n)
        q = as_array(tokens[:cap])
        path = self.tree._walk(q, ns) if q else []
        hit = sum(m for _, m in path)
        lockable = sum(m for c, m in path if c.lock_ref == 0)
        need = -(-n // self.ps) - hit // self.ps
        if need > len(self.free) + (self.tree.evictable_size - lockable) // self.ps:
            return None
        h, slots, node = self.tree.match_prefix(q, ns)
        assert h == hit
        self.tree.lock(node)
        pages = self._pages(slots)
        self._incref(pages)
        self._ensure_free(need)
        self._alloc(need, pages)
        self.reqs[rid] = [list(tokens), ns, pages, node, h]
        self.hits += h
        self.queries += n
        return h

    def append(self, rid: int, tokens: list[int]) -> bool:
        r = self.reqs[rid]
        need = -(-(len(r[0]) + len(tokens)) // self.ps) - len(r[2])
        if need > self.num_free_blocks:
            return False
        self._ensure_free(need)
        r[0].extend(tokens)
        self._alloc(need, r[2])
        return True

    def _insert(self, r: list[Any]) -> int:
        toks, ns, pages = r[0], r[1], r[2]
        full = len(toks) // self.ps
        prefix, _ = self.tree.insert(toks[: full * self.ps], self._slots(pages[:full]), ns)
        self._incref(pages[prefix // self.ps : full])
        return full * self.ps

    def checkpoint(self, rid: int) -> None:
        r = self.reqs[rid]
        # No page filled since the last insert: no insert (no hit counted, no stamp).
        if len(r[0]) // self.ps * self.ps <= r[4]:
            return
        full_tokens = self._insert(r)
        if full_tokens > r[4]:
            h, slots, node = self.tree.match_prefix(r[0][:full_tokens], r[1])
            assert h == full_tokens
            for i, theirs in enumerate(self._pages(slots)):
                if r[2][i] != theirs:
                    self._incref([theirs])
                    self._decref([r[2][i]])
                    r[2][i] = theirs
            self.tree.lock(node)
            self.tree.unlock(r[3])
            r[3] = node
            r[4] = full_tokens

    def free_request(self, rid: int) -> None:
        r = self.reqs.pop(rid)
        self._insert(r)
        self.tree.unlock(r[3])
        self._decref(r[2])

    def evict(self, num_tokens: int) -> int:
        freed = self.tree.evict(num_tokens)
        self._decref(self._pages(freed))
        return len(freed)

    def reset(self) -> None:
        assert not self.reqs
        freed = self.tree.reset()
        self._decref(sorted(self._pages(freed)))
