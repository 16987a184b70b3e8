"""A pure-Python model of the radix tree with hybrid components: SWA KV with
tombstones and a Mamba state per node, beside the full KV of
:class:`models.radix_model.RadixModel` (whose full-attention behaviour it keeps).

Written from the behaviour of SGLang 0.5.23's unified radix cache
(``mem_cache/unified_cache``: ``components/swa.py``, ``components/mamba.py``,
``unified_tree_core.py``), without HiCache or sessions:

- match: the deepest walked node every component's validator accepts. The SWA
  validator starts at an unbounded run; a tombstone resets it to 0 and fails,
  a live node adds its length and passes when the run reaches the window. The
  Mamba validator passes a node holding a state. Match end stamps the hit's
  nodes only (and a split edge's halves): nodes walked past it keep their
  recency. It refreshes the SWA LRU over the hit node and its live ancestors
  within ``window + page_size`` tokens (the hit node most recent) and the
  Mamba LRU over the hit node.
- split: the upper half copies the SWA liveness and lock count, takes the
  window-boundary id and enters the SWA LRU just older than the lower half;
  the Mamba state and lock stay on the lower half.
- insert (``swa_evicted_len`` = the caller's ``get_evicted_seqlen``): a new
  leaf is a tombstone before ``swa_evicted_len`` (split there) and a live leaf
  longer than the window rounded up to pages is split to keep one window below;
  a tombstone on the path ending past ``swa_evicted_len`` and past the caller's
  matched prefix is split at ``swa_evicted_len`` and revived (unlocked: the
  caller's slots replace the tree's, which are freed full-only; locked: the
  tree keeps its slots and the caller's are freed full-only). The Mamba state
  goes to the new leaf or to the node the insert ends on if it has none
  (else ``mamba_exist``); then the SWA LRU refresh of a match end.
- locks: full path lock; SWA lock up the path until the window is covered
  (tombstones included), the boundary stamped with an id the unlock walks to;
  Mamba lock on the node.
- eviction: full (unchanged) deletes unlocked leaves with their components;
  SWA takes the least recent SWA-unlocked live node, deletes it if it is an
  unlocked leaf, else tombstones it and drops its (unlocked) Mamba state;
  Mamba takes the least recent unlocked state, deleting an unlocked leaf, else
  dropping the state only.
"""

from __future__ import annotations

import heapq
from array import array
from typing import Any

from models.radix_model import ModelNode, RadixModel, as_array

__all__ = ["HybridNode", "HybridRadixModel"]


class HybridNode(ModelNode):
    __slots__ = ("mamba", "mamba_lock", "receipts", "swa_live", "swa_lock", "uuid")

    def __init__(self, nid: int, tick: int) -> None:
        super().__init__(nid, tick)
        self.swa_live = False
        self.swa_lock = 0
        self.uuid = 0
        self.receipts: list[int] = []
        self.mamba: int | None = None
        self.mamba_lock = 0


class HybridRadixModel(RadixModel):
    """:class:`RadixModel` with an SWA window and/or Mamba states (lru policy)."""

    def __init__(
        self, page_size: int = 1, sliding_window: int | None = None, mamba: bool = False
    ) -> None:
        self.window = sliding_window or 0
        self.has_mamba = mamba
        self._uuid = 1
        super().__init__(page_size, "lru")

    # ------------------------------------------------------------ state
    def reset(self) -> list[int]:
        if hasattr(self, "swa_lru"):
            for n in self.swa_lru:
                self.freed_swa.extend(n.value)
            for n in self.mamba_lru:
                assert n.mamba is not None
                self.freed_mamba.append(n.mamba)
        freed = super().reset()
        self.root = HybridNode(0, 0)
        self.root.lock_ref = 1
        self.root.priority = -(2**63)
        self.swa_lru: list[HybridNode] = []
        self.mamba_lru: list[HybridNode] = []
        if not hasattr(self, "freed_swa"):
            self.take_component_frees()
        return freed

    def take_component_frees(self) -> tuple[list[int], list[int], list[int], bool]:
        out = (
            list(getattr(self, "freed_swa", [])),
            list(getattr(self, "freed_full_only", [])),
            list(getattr(self, "freed_mamba", [])),
            bool(getattr(self, "mamba_exist", False)),
        )
        self.freed_swa: list[int] = []
        self.freed_full_only: list[int] = []
        self.freed_mamba: list[int] = []
        self.mamba_exist = False
        return out

    def _new_node(self, tick: int) -> HybridNode:
        n = HybridNode(self._next_id, tick)
        self._next_id += 1
        self.nodes[n.id] = n
        return n

    def sizes(self) -> tuple[int, int, int, int]:
        """(swa evictable, swa protected, mamba evictable, mamba protected)."""
        se = sum(len(n.key) for n in self.swa_lru if n.swa_lock == 0)
        sp = sum(len(n.key) for n in self.swa_lru if n.swa_lock > 0)
        me = sum(1 for n in self.mamba_lru if n.mamba_lock == 0)
        return se, sp - 0, me, len(self.mamba_lru) - me

    # ------------------------------------------------------------ hooks
    def _split(self, c: ModelNode, m: int, tick: int) -> ModelNode:
        assert isinstance(c, HybridNode)
        u = super()._split(c, m, tick)
        assert isinstance(u, HybridNode)
        u.swa_live, u.swa_lock, u.uuid, c.uuid = c.swa_live, c.swa_lock, c.uuid, 0
        if u.swa_live:
            self.swa_lru.insert(self.swa_lru.index(c), u)
        return u

    def _best(self, nodes: list[tuple[HybridNode, int, bool]]) -> int:
        """Index past the last node (``(node, length, partial)``) all validators accept."""
        run = float("inf")
        best = 0
        for i, (n, ln, partial) in enumerate(nodes):
            ok = True
            if self.window:
                if n.swa_live:
                    run += ln
                    ok = run >= self.window
                else:
                    run = 0
                    ok = False
            if self.has_mamba and (n.mamba is None or partial):
                ok = False
            if ok:
                best = i + 1
        return best

    def _touch(self, node: HybridNode, mamba_too: bool) -> None:
        if node is self.root:
            return
        if self.window:
            chain = []
            cur: ModelNode | None = node
            acc = 0
            while cur is not None and cur is not self.root and acc < self.window + self.page_size:
                assert isinstance(cur, HybridNode)
                if cur.swa_live:
                    chain.append(cur)
                acc += len(cur.key)
                cur = cur.parent
            for x in reversed(chain):
                self.swa_lru.remove(x)
                self.swa_lru.append(x)
        if mamba_too and node.mamba is not None:
            self.mamba_lru.remove(node)
            self.mamba_lru.append(node)

    def _revive(self, n: HybridNode) -> None:
        assert not n.swa_live
        n.swa_live = True
        self.swa_lru.append(n)

    def _tombstone(self, n: HybridNode) -> None:
        n.swa_live = False
        self.swa_lru.remove(n)
        self.freed_swa.extend(n.value)

    def _drop_state(self, n: HybridNode) -> None:
        if n.mamba is not None:
            self.freed_mamba.append(n.mamba)
            n.mamba = None
            self.mamba_lru.remove(n)

    def _delete_leaf(self, x: HybridNode) -> array[int]:
        if x.swa_live:
            self._tombstone(x)
        self._drop_state(x)
        parent = x.parent
        assert parent is not None
        del parent.children[self._child_key(x.ns, x.key, 0)]
        self.evictable_size -= len(x.key)
        self.evictable_leaves.discard(x)
        del self.nodes[x.id]
        self._update_leaf(parent)
        return x.value

    # ---------------------------------------------------------------- API
    def probe(self, tokens: Any, namespace: str | None = None) -> int:
        q = self._aligned(tokens)
        if not q:
            return 0
        path = self._walk(q, namespace)
        nodes = [(c, m, m < len(c.key)) for c, m in path]
        best = self._best(nodes)  # type: ignore[arg-type]
        return sum(m for _, m in path[:best])

    def match_prefix(
        self, tokens: Any, namespace: str | None = None
    ) -> tuple[int, array[int], ModelNode]:
        q = self._aligned(tokens)
        if not q:
            return 0, array("q"), self.root
        self.clock += 1
        tick = self.clock
        self.root.last_access = tick
        matched: list[HybridNode] = []
        for c, m in self._walk(q, namespace):
            if m < len(c.key):
                c.last_access = tick
            node = self._split(c, m, tick) if m < len(c.key) else c
            assert isinstance(node, HybridNode)
            matched.append(node)
        best = self._best([(n, len(n.key), False) for n in matched])
        matched = matched[:best]
        for n in matched:
            n.last_access = tick
        slots = array("q")
        for n in matched:
            slots.extend(n.value)
        last = matched[-1] if matched else self.root
        assert isinstance(last, HybridNode)
        self._touch(last, True)
        return len(slots), slots, last

    def insert(  # type: ignore[override]
        self,
        tokens: Any,
        slots: Any,
        namespace: str | None = None,
        priority: int = 0,
        swa_evicted_len: int = 0,
        mamba_state: int | None = None,
    ) -> tuple[int, array[int]]:
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
        pos = 0
        to_free = array("q")
        matched: list[HybridNode] = []
        for c, m in path:
            c.last_access = tick
            mine, tree_vals = slots[pos : pos + m], c.value[:m]
            if mine != tree_vals:
                to_free.extend(s for s, t in zip(mine, tree_vals, strict=True) if s != t)
            node = self._split(c, m, tick) if m < len(c.key) else c
            assert isinstance(node, HybridNode)
            node.priority = max(node.priority, priority)
            node.hit_count += 1
            matched.append(node)
            pos += m
        # SWA revival of tombstones past the evicted prefix and the caller's own prefix.
        if self.window:
            protected = 0
            for nd in matched:
                k = 0
                while k < len(nd.value) and protected < n and nd.value[k] == slots[protected]:
                    k += 1
                    protected += 1
                if k < len(nd.value):
                    break
            protected = protected // self.page_size * self.page_size
            start = 0
            for nd in list(matched):
                end = start + len(nd.key)
                if nd.swa_live or end <= protected or end <= swa_evicted_len:
                    start = end
                    continue
                live_start = max(start, swa_evicted_len)
                if live_start > start:
                    self._split(nd, live_start - start, tick)
                mine = slots[live_start:end]
                if nd.lock_ref > 0:
                    for s, t in zip(mine, nd.value, strict=True):
                        if s != t:
                            self.freed_full_only.append(s)
                            to_free.remove(s)
                else:
                    for s, t in zip(mine, nd.value, strict=True):
                        if s != t:
                            self.freed_full_only.append(t)
                            to_free.remove(s)
                    nd.value = array("q", mine)
                self._revive(nd)
                start = end
        target: HybridNode = matched[-1] if matched else self.root  # type: ignore[assignment]
        new_leaf = pos < n
        if new_leaf:
            leaf = self._new_node(tick)
            leaf.key = q[pos:]
            leaf.value = slots[pos:n]
            leaf.parent = target
            leaf.ns = namespace
            leaf.priority = priority
            leaf.hit_count = 1
            target.children[self._child_key(namespace, leaf.key, 0)] = leaf
            self.evictable_size += len(leaf.key)
            self._update_leaf(target)
            self._update_leaf(leaf)
            target = leaf
            if self.window and swa_evicted_len < n:
                live_start = max(pos, swa_evicted_len)
                if live_start > pos:
                    self._split(leaf, live_start - pos, tick)
                tail = -(-self.window // self.page_size) * self.page_size
                if n - live_start > tail:
                    u = self._split(leaf, n - live_start - tail, tick)
                    assert isinstance(u, HybridNode)
                    self._revive(u)
                self._revive(leaf)
        if self.has_mamba and target is not self.root:
            assert mamba_state is not None
            if target.mamba is not None:
                self.mamba_exist = True
                self.mamba_lru.remove(target)
                self.mamba_lru.append(target)
            else:
                target.mamba = mamba_state
                self.mamba_lru.append(target)
        self._touch(target, False)
        to_free.extend(slots[n:])
        return pos, to_free

    def lock(self, node: ModelNode) -> None:
        super().lock(node)
        if node is self.root:
            return
        assert isinstance(node, HybridNode)
        receipt = 0
        if self.window:
            covered = 0
            cur: ModelNode | None = node
            while cur is not None and cur is not self.root and covered < self.window:
                assert isinstance(cur, HybridNode)
                cur.swa_lock += 1
                covered += len(cur.key)
                if covered >= self.window:
                    if cur.uuid == 0:
                        cur.uuid = self._uuid
                        self._uuid += 1
                    receipt = cur.uuid
                cur = cur.parent
        node.receipts.append(receipt)
        if self.has_mamba:
            node.mamba_lock += 1

    def unlock(self, node: ModelNode) -> None:
        if node is self.root:
            return
        assert isinstance(node, HybridNode)
        if node.own_locks == 0:
            raise RuntimeError("unlock of a node that holds no lock of its own")
        receipt = node.receipts.pop()
        if self.has_mamba:
            node.mamba_lock -= 1
        if self.window:
            cur: ModelNode | None = node
            while cur is not None and cur is not self.root:
                assert isinstance(cur, HybridNode)
                cur.swa_lock -= 1
                assert cur.swa_lock >= 0
                if receipt and cur.uuid == receipt:
                    break
                cur = cur.parent
        super().unlock(node)

    def evict(self, num_tokens: int) -> array[int]:
        heap = [(self._key(n), n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = array("q")
        done = 0
        while done < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            assert isinstance(x, HybridNode)
            parent = x.parent
            done += len(x.key)
            freed.extend(self._delete_leaf(x))
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (self._key(parent), parent.id, parent))
        return freed

    def evict_swa(self, num_tokens: int) -> array[int]:
        freed = array("q")
        done = 0
        while done < num_tokens:
            x = next((n for n in self.swa_lru if n.swa_lock == 0), None)
            if x is None:
                break
            done += len(x.key)
            if x in self.evictable_leaves:
                freed.extend(self._delete_leaf(x))
            else:
                self._tombstone(x)
                if x.mamba_lock == 0:
                    self._drop_state(x)
        return freed

    def evict_mamba(self, num_states: int) -> array[int]:
        freed = array("q")
        done = 0
        while done < num_states:
            x = next((n for n in self.mamba_lru if n.mamba_lock == 0), None)
            if x is None:
                break
            done += 1
            if x in self.evictable_leaves:
                freed.extend(self._delete_leaf(x))
            else:
                self._drop_state(x)
        return freed

    def node_components(self, node: HybridNode) -> tuple[bool, int, int | None, int]:
        return node.swa_live, node.swa_lock, node.mamba, node.mamba_lock

    def path_key(self, node: ModelNode) -> tuple[int, ...]:
        """The token path root..node (to name nodes across implementations)."""
        parts: list[array[int]] = []
        cur: ModelNode | None = node
        while cur is not None and cur is not self.root:
            parts.append(cur.key)
            cur = cur.parent
        return tuple(t for p in reversed(parts) for t in p)
