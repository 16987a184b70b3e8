"""``RadixTree``'s methods for SGLang's ``BasePrefixCache`` seam (``match_node``,
``path_slots_i64``, ``insert_len``, ``evict_leaves``) against the general methods they
shorten (``match_prefix``, ``path_slots``, ``insert``, ``evict``): two trees driven by the
same random stream answer alike, and bad input raises a ``KvIndexError`` with the tree
unchanged."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kvindex
from kvindex.exceptions import InvalidArgumentError, KvIndexError, StaleHandleError


class _Slots:
    """Page-aligned slot runs handed out and taken back (an allocator's free list)."""

    def __init__(self, ps: int, pages: int) -> None:
        self.ps = ps
        self.free = list(range(1, pages))

    def take(self, n: int) -> np.ndarray:
        pages = [self.free.pop() for _ in range(-(-n // self.ps))]
        out = np.concatenate(
            [np.arange(p * self.ps, (p + 1) * self.ps, dtype=np.int64) for p in pages]
            or [np.empty(0, np.int64)]
        )
        return out[:n]

    def give(self, slots: np.ndarray) -> None:
        self.free.extend(sorted({int(s) // self.ps for s in slots}))


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("seed", range(3))
def test_seam_methods_answer_as_the_general_ones(ps: int, seed: int) -> None:
    rng = random.Random(seed)
    old = kvindex.RadixTree(ps, policy="lru")
    new = kvindex.RadixTree(ps, policy="lru")
    a, b = _Slots(ps, 4096), _Slots(ps, 4096)
    systems = [[rng.randrange(50) for _ in range(rng.randrange(1, 5) * 16)] for _ in range(4)]
    locks: list[tuple[int, int]] = []
    for _ in range(300):
        op = rng.random()
        tokens = np.array(
            rng.choice(systems) + [rng.randrange(50) for _ in range(rng.randrange(0, 40))],
            dtype=np.int64,
        )
        ns = rng.choice([None, None, "lora"])
        if op < 0.45:
            m = old.match_prefix(tokens, ns)
            hit, node = new.match_node(tokens, ns)
            assert hit == m.hit_len
            assert (node == 0) == (m.node == 0)
            got = new.path_slots_i64(node)
            assert got.dtype == np.int64
            assert got.tolist() == old.path_slots(m.node).astype(np.int64).tolist()
            if rng.random() < 0.5:
                old.lock(m.node)
                new.lock(node)
                locks.append((m.node, node))
            # Insert the whole sequence with the hit's slots, as SGLang's scheduler does.
            full = len(tokens) // ps * ps
            fresh_a, fresh_b = a.take(full - hit), b.take(full - hit)
            va = np.concatenate((m.slots.astype(np.int64), fresh_a))
            vb = np.concatenate((got[:hit], fresh_b))
            assert va.tolist() == vb.tolist()
            extra = rng.randrange(0, 3)  # slots past the whole pages are ignored
            r = old.insert(tokens[:full], va, ns)
            prefix = new.insert_len(
                tokens, np.concatenate((vb, np.arange(extra, dtype=np.int64) + 10**6)), ns
            )
            assert prefix == r.prefix_len
            a.give(va[hit:prefix])
            b.give(vb[hit:prefix])
        elif op < 0.7 and locks:
            lo, ln = locks.pop(rng.randrange(len(locks)))
            old.unlock(lo)
            new.unlock(ln)
        else:
            n = rng.randrange(1, 200)
            pages = rng.random() < 0.5
            leaves = new.evict_leaves(n, pages=pages)
            done = 0
            for leaf in leaves:
                want = old.evict(1)
                assert leaf.dtype == np.int64
                if pages:
                    assert leaf.tolist() == (want[::ps] // ps).astype(np.int64).tolist()
                    b.give(leaf * ps)
                    done += len(leaf) * ps
                else:
                    assert leaf.tolist() == want.astype(np.int64).tolist()
                    b.give(leaf)
                    done += len(leaf)
                a.give(want)
            if done < n:
                assert len(old.evict(1)) == 0  # nothing evictable was left
        assert old.total_size == new.total_size
        assert old.evictable_size == new.evictable_size
        assert old.protected_size == new.protected_size
        new.check_invariants()


def test_seam_methods_refuse_bad_input_unchanged() -> None:
    t = kvindex.RadixTree(16)
    tokens = np.arange(40, dtype=np.int64)
    assert t.insert_len(tokens, np.arange(32, dtype=np.int64)) == 0  # 2 whole pages
    before = t.dump()
    bad = [
        lambda: t.insert_len(np.arange(100, 164, dtype=np.int64), np.arange(48, dtype=np.int64)),
        lambda: t.insert_len(np.arange(100, 132), np.arange(64, 96, dtype=np.int64) + 1),
        lambda: t.insert_len(np.arange(100, 132), np.arange(0, 32, dtype=np.int64)),
        lambda: t.insert_len(np.arange(100, 132), np.arange(64, 96, dtype=np.int64) + 2**40),
        lambda: t.insert_len(np.arange(100, 132), np.arange(64, 96), priority=2**70),
        lambda: t.insert_len(np.arange(100, 132), [1, 2]),
        lambda: t.match_node([1, 2, 3]),
        lambda: t.evict_leaves(-1),
        lambda: t.evict_leaves(2**70),
        lambda: t.path_slots_i64(-5),
    ]
    for call in bad:
        with pytest.raises(KvIndexError):
            call()
        assert t.dump() == before
    hit, node = t.match_node(tokens)
    assert hit == 32
    t.reset()
    with pytest.raises(StaleHandleError):
        t.path_slots_i64(node)
    with pytest.raises(InvalidArgumentError):
        t.path_slots_i64(-1)
    assert t.match_node(np.arange(5, dtype=np.int64)) == (0, 0)
    assert t.evict_leaves(10) == []
