"""Lists and tuples off the hot path, numpy arrays only on it.

Hashing helpers, ``evict_blocks`` and the cluster index accept a list or tuple of ints
wherever they accept an array, with the same result; the scheduler's per-step calls
(admit, lookup, append, append_batch, free_batch, block_tables, slot_mapping, the radix
tree's match / probe / insert) raise ``DTypeError`` for a list, as the stubs say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex import DTypeError
from kvindex.cluster import ClusterIndex

TOKS = list(range(100, 120))


@pytest.mark.parametrize("seq", [TOKS, tuple(TOKS)])
def test_block_hashes_takes_lists_and_tuples(seq: Any) -> None:
    want = kvindex.block_hashes(np.asarray(TOKS, dtype=np.int64), 4)
    assert np.array_equal(kvindex.block_hashes(seq, 4), want)
    assert np.array_equal(kvindex.block_hashes(np.asarray(TOKS, dtype=np.int32), 4), want)


def test_block_hashes_list_items_are_read_as_ints() -> None:
    with pytest.raises(DTypeError):
        kvindex.block_hashes([1, 2, 1.5, 4], 4)
    with pytest.raises(DTypeError):
        kvindex.block_hashes("abcd", 4)


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_evict_blocks_takes_lists_and_tuples(design: str) -> None:
    for ids in ([1, 2], (1, 2), np.array([1, 2], dtype=np.int64)):
        c = kvindex.make_cache(design, 8, 4)
        if design == "hash_chain":
            assert isinstance(c, kvindex.HashChainCache)
            assert c.admit(1, np.arange(12, dtype=np.int32)) is not None
            c.free(1)
            assert c.evict_blocks(ids) == 2


def test_cluster_index_takes_lists_and_tuples() -> None:
    ix = ClusterIndex(4)
    w = ix.add_worker("a")
    arr = np.asarray(TOKS, dtype=np.int64)
    hashes = ix.hashes(arr)
    assert np.array_equal(ix.hashes(TOKS), hashes)
    assert np.array_equal(ix.hashes(tuple(TOKS)), hashes)
    ix.store_hashes(w, [int(h) for h in hashes[:3]])
    assert np.array_equal(ix.overlaps(TOKS), ix.overlaps(arr))
    assert ix.overlaps(TOKS).tolist() == [3]
    assert ix.overlaps_for_hashes(tuple(int(h) for h in hashes)).tolist() == [3]
    assert ix.route(TOKS, [0.0]) == ix.route(arr, np.zeros(1)) == (w, 3, 5)
    assert ix.remove_hashes(w, (int(hashes[0]),)) == 0
    ix.check_invariants()


HOT_PATH: list[tuple[str, Callable[[Any, list[int]], object]]] = [
    ("admit", lambda c, seq: c.admit(9, seq)),
    ("lookup", lambda c, seq: c.lookup(seq)),
    ("append", lambda c, seq: c.append(1, seq)),
    ("append_batch", lambda c, seq: c.append_batch(np.array([1]), seq)),
    ("append_batch ids", lambda c, seq: c.append_batch([1], np.array([5], dtype=np.int32))),
    ("free_batch", lambda c, seq: c.free_batch([1])),
    ("block_tables", lambda c, seq: c.block_tables([1])),
    ("slot_mapping", lambda c, seq: c.slot_mapping([1], np.array([1]))),
]


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
@pytest.mark.parametrize(("name", "call"), HOT_PATH, ids=[n for n, _ in HOT_PATH])
def test_hot_path_takes_arrays_only(design: str, name: str, call: Any) -> None:
    c = kvindex.make_cache(design, 16, 4)
    assert c.admit(1, np.arange(6, dtype=np.int32)) is not None
    before = (c.stats, c.num_free_blocks, c.num_tokens(1))
    with pytest.raises(DTypeError):
        call(c, [5])
    assert (c.stats, c.num_free_blocks, c.num_tokens(1)) == before
    c.check_invariants()


def test_radix_tree_hot_path_takes_arrays_only() -> None:
    t = kvindex.RadixTree(1)
    with pytest.raises(DTypeError):
        t.insert([1, 2], np.array([1, 2], dtype=np.int32))
    with pytest.raises(DTypeError):
        t.match_prefix([1, 2])
    with pytest.raises(DTypeError):
        t.probe((1, 2))
    assert t.total_size == 0
