"""Stateful property test: HashChainCache against the pure-Python vLLM model.

Every step compares results (hit lengths, allocated block ids, success/failure),
and after every step the free-queue order, free count, every request's table and
chain, and ``check_invariants()``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

import kvindex
from models.hash_chain_model import HashChainModel

PREFIXES = [list(range(100, 140)), list(range(500, 520)), [7] * 30]
SALTS = st.sampled_from([None, None, "tenant-a"])
LORAS = st.sampled_from([None, None, ("sql", "/loras/sql")])


@st.composite
def prompts(draw: st.DrawFn) -> list[int]:
    base = draw(st.sampled_from(PREFIXES))
    cut = draw(st.integers(0, len(base)))
    tail = draw(st.lists(st.integers(0, 5), max_size=24))
    toks = base[:cut] + tail
    return toks if toks else [1]


class HashChainMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0

    @initialize(
        num_blocks=st.integers(2, 40),
        block_size=st.sampled_from([1, 2, 4, 16]),
    )
    def setup(self, num_blocks: int, block_size: int) -> None:
        self.cache = kvindex.HashChainCache(num_blocks, block_size, algo="vllm_sha256")
        self.model = HashChainModel(num_blocks, block_size)

    @rule(target=requests, tokens=prompts(), salt=SALTS, lora=LORAS, skip=st.booleans())
    def admit(
        self, tokens: list[int], salt: str | None, lora: tuple[str, str] | None, skip: bool
    ) -> int:
        rid = self.next_id
        self.next_id += 1
        arr = np.asarray(tokens, dtype=np.int32)
        assert self.cache.lookup(arr, cache_salt=salt, lora=lora) == self.model.lookup(
            tokens, salt, lora
        )
        if -(-len(tokens) // self.model.block_size) > self.model.num_blocks - 1:
            # Larger than the whole pool: never admissible, an error and nothing changes
            # (the invariants below compare the whole state with the untouched model).
            with pytest.raises(kvindex.RequestTooLargeError):
                self.cache.admit(rid, arr, cache_salt=salt, lora=lora, skip_reading=skip)
            return rid
        got = self.cache.admit(rid, arr, cache_salt=salt, lora=lora, skip_reading=skip)
        want = self.model.admit(rid, tokens, salt, lora, skip)
        if want is None:
            assert got is None
            return rid  # never admitted: later calls must raise UnknownRequestError
        assert got is not None
        assert got.num_cached_tokens == want[0]
        assert got.block_ids.tolist() == want[1]
        return rid

    @rule(rid=requests, tokens=st.lists(st.integers(0, 9), min_size=1, max_size=20))
    def append(self, rid: int, tokens: list[int]) -> None:
        if rid not in self.model.reqs:
            with pytest.raises(kvindex.UnknownRequestError):
                self.cache.append(rid, np.asarray(tokens, dtype=np.int64))
            return
        got = self.cache.append(rid, np.asarray(tokens, dtype=np.int64))
        assert got == self.model.append(rid, tokens)

    @rule(data=st.data())
    def append_batch(self, data: st.DataObject) -> None:
        live = sorted(self.model.reqs)
        assume(live)
        rids = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        toks = [data.draw(st.lists(st.integers(0, 9), min_size=0, max_size=6)) for _ in rids]
        offsets = np.cumsum([0] + [len(t) for t in toks]).astype(np.int64)
        flat = np.asarray([x for t in toks for x in t], dtype=np.int64)
        got = self.cache.append_batch(np.asarray(rids, dtype=np.int64), flat, offsets)
        assert got == self.model.append_batch(rids, toks)

    @rule(rid=consumes(requests))
    def free(self, rid: int) -> None:
        if rid not in self.model.reqs:
            with pytest.raises(kvindex.UnknownRequestError):
                self.cache.free(rid)
            return
        self.cache.free(rid)
        self.model.free(rid)

    @rule(data=st.data())
    def evict_blocks(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(1, self.model.num_blocks - 1), max_size=4))
        if any(self.model.ref[b] > 0 for b in ids):
            with pytest.raises(kvindex.BlockInUseError):
                self.cache.evict_blocks(np.asarray(ids, dtype=np.int64))
            return
        assert self.cache.evict_blocks(np.asarray(ids, dtype=np.int64)) == (
            self.model.evict_blocks(ids)
        )

    @precondition(lambda self: True)
    @rule()
    def reset(self) -> None:
        if self.model.reqs:
            with pytest.raises(kvindex.BlockInUseError):
                self.cache.reset()
            return
        self.cache.reset()
        self.model.reset()

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        assert self.cache.free_queue().tolist() == self.model.free_queue()
        assert self.cache.num_free_blocks == self.model.num_free
        assert self.cache.num_requests == len(self.model.reqs)
        for rid, r in self.model.reqs.items():
            assert self.cache.request_blocks(rid).tolist() == r.blocks
            assert self.cache.num_tokens(rid) == len(r.tokens)
            got = [bytes(h) for h in self.cache.request_block_hashes(rid)]
            assert got == r.hashes
        for b in range(1, self.model.num_blocks):
            assert self.cache.ref_count(b) == self.model.ref[b]
            assert self.cache.block_hash(b) == self.model.hash[b]
        stats = self.cache.stats
        assert (stats["requests"], stats["queries"], stats["hits"], stats["evictions"]) == (
            self.model.requests,
            self.model.queries,
            self.model.hits,
            self.model.evictions,
        )


HashChainMachine.TestCase.settings = settings(
    HashChainMachine.TestCase.settings, stateful_step_count=40
)
TestHashChainStateful = HashChainMachine.TestCase
