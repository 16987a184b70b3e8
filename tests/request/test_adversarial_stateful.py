"""State machines mixing valid and invalid calls on both request-level caches, and
pickling / copying of every class.

After an invalid call (a wrong type, bool, an out-of-range int, a bad array, an
unknown or duplicate id, a surrogate string) the cache must have raised a
``KvIndexError`` subclass (or a ``TypeError``) and be exactly as before: same running
requests and tables, free blocks, cached blocks and statistics. Invariants are
checked after every step.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import kvindex
from kvindex import HashChainCache, KvIndexError, RadixPrefixCache

BAD_IDS: list[Any] = [-1, 2**64, True, 1.5, None, "1", np.array([1]), 10**30]
BAD_TOKENS: list[Any] = [
    None,
    [1, 2, 3],
    np.arange(8, dtype=np.float32),
    np.arange(8, dtype=np.uint32),
    np.arange(16, dtype=np.int32)[::2],
    np.arange(8, dtype=np.int32).reshape(2, 4),
    np.arange(8, dtype=">i8"),
]


def _snapshot(c: Any, ids: set[int]) -> tuple[Any, ...]:
    stats = dict(c.stats)
    return (
        c.num_requests,
        c.num_free_blocks,
        c.num_cached_blocks,
        c.free_blocks().tolist(),
        stats,
        {r: (c.num_tokens(r), c.request_blocks(r).tolist()) for r in sorted(ids)},
    )


class _Mixed(RuleBasedStateMachine):
    cls: type = HashChainCache

    def __init__(self) -> None:
        super().__init__()
        self.c = self.cls(24, 4, enable_events=True, max_events=64)
        self.ids: set[int] = set()
        self.next_id = 1

    def _refused(self, call: Any) -> None:
        before = _snapshot(self.c, self.ids)
        with pytest.raises((KvIndexError, TypeError)):
            call()
        assert _snapshot(self.c, self.ids) == before

    @rule(n=st.integers(1, 30), salt=st.sampled_from([None, "", "a", "a\x1fb"]))
    def admit(self, n: int, salt: str | None) -> None:
        rid = self.next_id
        self.next_id += 1
        if self.c.admit(rid, np.arange(n, dtype=np.int32) % 7, cache_salt=salt) is not None:
            self.ids.add(rid)

    @rule(data=st.data())
    def append_or_free(self, data: st.DataObject) -> None:
        if not self.ids:
            return
        rid = data.draw(st.sampled_from(sorted(self.ids)))
        if data.draw(st.booleans()):
            self.c.append(rid, np.array([3], dtype=np.int32))
        else:
            self.c.free(rid)
            self.ids.discard(rid)

    @rule(bad=st.sampled_from(BAD_IDS), which=st.integers(0, 5))
    def bad_id(self, bad: Any, which: int) -> None:
        if bad is None and which == 5:
            return  # max_blocks=None is the default
        toks = np.arange(5, dtype=np.int32)
        calls = [
            lambda: self.c.admit(bad, toks),
            lambda: self.c.free(bad),
            lambda: self.c.append(bad, toks),
            lambda: self.c.num_tokens(bad),
            lambda: self.c.ref_count(bad),
            lambda: self.c.block_tables(np.array([1], dtype=np.int64), max_blocks=bad),
        ]
        self._refused(calls[which])

    @rule(bad=st.sampled_from(BAD_TOKENS), which=st.integers(0, 2))
    def bad_tokens(self, bad: Any, which: int) -> None:
        rid = next(iter(self.ids), None)
        calls = [
            lambda: self.c.admit(self.next_id + 1000, bad),
            lambda: self.c.lookup(bad),
            lambda: self.c.append(rid if rid is not None else 0, bad),
        ]
        self._refused(calls[which])

    @rule()
    def duplicate_or_unknown(self) -> None:
        if self.ids:
            rid = min(self.ids)
            self._refused(lambda: self.c.admit(rid, np.arange(3, dtype=np.int32)))
        self._refused(lambda: self.c.free(10**9))
        self._refused(
            lambda: self.c.free_batch(np.array([*sorted(self.ids), 10**9], dtype=np.int64))
        )

    @rule()
    def bad_keys(self) -> None:
        toks = np.arange(9, dtype=np.int32)
        self._refused(lambda: self.c.admit(self.next_id + 2000, toks, cache_salt="\udc00"))
        self._refused(lambda: self.c.admit(self.next_id + 2000, toks, lora=("a",)))
        self._refused(lambda: self.c.lookup(toks, lora=("a", "\ud800")))

    @rule()
    def drain(self) -> None:
        self.c.take_events()
        assert self.c.stats["events_dropped"] >= 0

    @invariant()
    def consistent(self) -> None:
        self.c.check_invariants()
        assert self.c.num_requests == len(self.ids)


class _MixedRadix(_Mixed):
    cls = RadixPrefixCache


TestMixedHashChain = _Mixed.TestCase
TestMixedHashChain.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestMixedRadix = _MixedRadix.TestCase
TestMixedRadix.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)


def _objects() -> list[Any]:
    hc = HashChainCache(8, 4)
    adm = hc.admit(1, np.arange(5, dtype=np.int32))
    tree = kvindex.RadixTree(4)
    ins = tree.insert(np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int32))
    match = tree.match_prefix(np.arange(4, dtype=np.int32))
    return [
        hc,
        RadixPrefixCache(8, 4),
        tree,
        adm,
        ins,
        match,
        kvindex._core.EventEncoder(),
        kvindex.BlockStored([1], None, [1, 2], 2, medium="GPU", extra_keys=[("a", 1)]),
        kvindex.BlockRemoved([2**64 - 1], medium=None),
        kvindex.AllBlocksCleared(),
    ]


@pytest.mark.parametrize("op", ["pickle", "copy", "deepcopy"])
def test_every_class_pickles_or_refuses_cleanly(op: str) -> None:
    events = (kvindex.BlockStored, kvindex.BlockRemoved, kvindex.AllBlocksCleared)
    for obj in _objects():
        f = {
            "pickle": lambda o: pickle.loads(pickle.dumps(o)),
            "copy": copy.copy,
            "deepcopy": copy.deepcopy,
        }[op]
        if isinstance(obj, events):
            assert f(obj) == obj
        else:
            with pytest.raises(TypeError):
                f(obj)
