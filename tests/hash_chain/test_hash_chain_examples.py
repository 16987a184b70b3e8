"""The seed note's worked examples and vLLM's own prefix-caching scenarios, ported.

Block size 16 unless a test says otherwise. Expected block ids are those vLLM
0.33's own KVCacheManager produces (the worked examples and vLLM's own tests in the
vLLM prefix-caching reference).
"""

from __future__ import annotations

import numpy as np
import pytest

import kvindex


def toks(*ranges: range | list[int]) -> np.ndarray:
    return np.concatenate([np.asarray(list(r), dtype=np.int32) for r in ranges])


def ids(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


# ---- the seed note's worked examples ------------------------------------------------


def test_seed_80_tokens_first_30_match_hits_16() -> None:
    c = kvindex.HashChainCache(16, 16)
    c.admit(0, toks(range(80)))
    c.free(0)
    prompt = toks(range(30), range(1000, 1050))  # first 30 tokens match the cached chain
    adm = c.admit(1, prompt)
    assert adm is not None
    assert adm.num_cached_tokens == 16  # tokens 16..29 match but share a block with 30, 31
    assert adm.block_ids.tolist() == [1, 6, 7, 8, 9]
    c.check_invariants()


def test_seed_identical_80_tokens_hits_64_full_hit_rule() -> None:
    c = kvindex.HashChainCache(16, 16)
    c.admit(0, toks(range(80)))
    c.free(0)
    adm = c.admit(1, toks(range(80)))
    assert adm is not None
    assert adm.num_cached_tokens == 64  # 79 // 16 = 4 blocks: the last block is recomputed
    assert adm.block_ids.tolist() == [1, 2, 3, 4, 6]
    c.check_invariants()


def test_seed_two_prompts_sharing_100_tokens_hit_96() -> None:
    c = kvindex.HashChainCache(16, 16)
    shared = range(100)
    a = c.admit(0, toks(shared, range(5000, 5020)))
    b = c.admit(1, toks(shared, range(6000, 6020)))
    assert a is not None and b is not None
    assert a.block_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert b.num_cached_tokens == 96
    assert b.block_ids.tolist() == [1, 2, 3, 4, 5, 6, 9, 10]


def test_seed_decode_blocks_and_reverse_free_order_bs4() -> None:
    c = kvindex.HashChainCache(16, 4)
    adm = c.admit(0, toks(range(6)))
    assert adm is not None and adm.block_ids.tolist() == [1, 2]
    assert c.append(0, toks([50, 51, 52]))
    assert c.request_blocks(0).tolist() == [1, 2, 3]
    assert len(c.request_block_hashes(0)) == 2
    c.free(0)
    assert c.free_queue().tolist() == [3, *range(4, 16), 2, 1]


def test_seed_reverse_free_tails_leave_first_no_holes() -> None:
    c = kvindex.HashChainCache(8, 16)  # usable blocks 1..7
    prompt = toks(range(80))
    c.admit(0, prompt)
    c.free(0)
    assert c.free_queue().tolist() == [6, 7, 5, 4, 3, 2, 1]
    assert c.lookup(prompt) == 64
    # an unrelated 4-block request takes 6, 7 and then the chain's tail blocks 5 and 4
    adm = c.admit(1, toks(range(9000, 9064)))
    assert adm is not None and adm.block_ids.tolist() == [6, 7, 5, 4]
    # the remaining hit is a shorter prefix (blocks 1..3), never a hole
    assert c.lookup(prompt) == 48
    assert c.stats["evictions"] == 2
    c.check_invariants()


def test_seed_second_turn_hits_its_own_decoded_tokens() -> None:
    c = kvindex.HashChainCache(32, 16)
    turn1 = toks(range(20))
    c.admit(0, turn1)
    generated = toks(range(200, 212))
    for t in generated:  # one decode token per step, batch form
        assert c.append_batch(ids(0), np.asarray([t], dtype=np.int32))
    c.free(0)
    turn2 = toks(range(20), range(200, 212), range(300, 310))  # 42 tokens
    adm = c.admit(1, turn2)
    assert adm is not None and adm.num_cached_tokens == 32


def test_resend_block_aligned_prompt_duplicates_and_events() -> None:
    c = kvindex.HashChainCache(16, 16, enable_events=True)
    c.admit(0, toks(range(80)))
    c.free(0)
    adm = c.admit(1, toks(range(80)))
    assert adm is not None and adm.block_ids.tolist() == [1, 2, 3, 4, 6]
    h5 = c.block_hash(5)
    assert h5 is not None and c.block_hash(6) == h5  # two physical copies of one hash
    ev = c.take_events()
    stored = [e for e in ev if isinstance(e, kvindex.BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [5, 1]
    assert stored[1].parent_block_hash == stored[0].block_hashes[3]
    c.free(1)
    # evict everything cached: 6 physical blocks, 5 distinct hashes
    c.admit(2, toks(range(7000, 7000 + 15 * 16)))
    removed = [e for e in c.take_events() if isinstance(e, kvindex.BlockRemoved)]
    hashes = [h for e in removed for h in e.block_hashes]
    assert len(hashes) == 6 and len(set(hashes)) == 5


# ---- vLLM's own scenarios (tests/v1/core/test_prefix_caching.py), pool of 11 blocks ---


@pytest.mark.parametrize("algo", ["vllm_sha256", "vllm_sha256_cbor", "xxh3_128"])
def test_prefill(algo: str) -> None:
    c = kvindex.HashChainCache(11, 16, algo=algo)
    common = list(range(48))
    a = c.admit(0, toks(common, range(7)))
    assert a is not None and a.num_cached_tokens == 0 and a.block_ids.tolist() == [1, 2, 3, 4]
    for b in (1, 2, 3):
        assert c.block_hash(b) is not None and c.ref_count(b) == 1
    assert c.block_hash(4) is None  # partial block is not hashed
    b = c.admit(1, toks(common, range(100, 105)))
    assert b is not None and b.num_cached_tokens == 48 and b.block_ids.tolist() == [1, 2, 3, 5]
    assert [c.ref_count(x) for x in (1, 2, 3)] == [2, 2, 2]
    assert c.num_free_blocks == 5
    c.free(0)
    c.free(1)
    assert c.free_queue().tolist() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    d = c.admit(2, toks(common, range(200, 206)))
    assert d is not None and d.block_ids.tolist() == [1, 2, 3, 5]
    assert c.num_free_blocks == 6
    c.free(2)
    miss = c.admit(3, toks(range(1000, 1160)))
    assert miss is not None
    assert miss.block_ids.tolist() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert c.num_free_blocks == 0 and c.free_queue().tolist() == []
    c.check_invariants()


def test_prefill_skip_reading_still_writes() -> None:  # vLLM test_prefill_plp
    c = kvindex.HashChainCache(11, 16)
    prompt = toks(range(55))
    a = c.admit(0, prompt, skip_reading=True)
    assert a is not None and a.num_cached_tokens == 0
    b = c.admit(1, prompt)
    assert b is not None and b.num_cached_tokens == 48  # a's blocks were cached
    e = c.admit(2, prompt, skip_reading=True)
    assert e is not None and e.num_cached_tokens == 0
    assert set(e.block_ids.tolist()).isdisjoint(a.block_ids.tolist())
    assert c.request_block_hashes(2).tobytes() == c.request_block_hashes(0).tobytes()
    c.check_invariants()


def test_decode() -> None:
    c = kvindex.HashChainCache(11, 16)
    c.admit(0, toks(range(55)))  # 3 full + 7-token partial
    assert c.append(0, toks([8] * 4))  # stays inside the partial block
    assert c.request_blocks(0).tolist() == [1, 2, 3, 4] and c.block_hash(4) is None
    assert c.append(0, toks([9] * 19))  # fills block 4 and spills into a new one
    assert c.request_blocks(0).tolist() == [1, 2, 3, 4, 5]
    assert c.block_hash(4) is not None and c.block_hash(5) is None
    c.check_invariants()


def test_evict() -> None:
    c = kvindex.HashChainCache(11, 16)
    c.admit(0, toks(range(5 * 16 + 7)))
    c.admit(1, toks(range(1000, 1000 + 3 * 16)))
    c.free(0)
    assert c.free_queue().tolist() == [6, 10, 5, 4, 3, 2, 1]
    c.free(1)
    assert c.free_queue().tolist() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    adm = c.admit(2, toks(range(2 * 16 + 3)))
    assert adm is not None and adm.block_ids.tolist() == [1, 2, 6]
    assert adm.num_cached_tokens == 32 and c.num_free_blocks == 7


def test_hash_block_correct_reuse() -> None:
    c = kvindex.HashChainCache(2, 16)  # one usable block
    c.admit(0, toks(range(16)))
    c.free(0)
    assert c.block_hash(1) is not None
    c.admit(1, toks([5] * 15))  # reuses block 1 as a partial block
    assert c.block_hash(1) is None


def test_computed_blocks_not_evicted() -> None:
    c = kvindex.HashChainCache(3, 16)  # two usable blocks
    c.admit(0, toks(range(16)))
    c.admit(1, toks(range(100, 116)))
    c.free(0)
    c.free(1)
    adm = c.admit(2, toks(range(16), [1, 2, 3]))
    assert adm is not None and adm.num_cached_tokens == 16
    assert adm.block_ids.tolist() == [1, 2]  # block 2 evicted, never the hit block 1


def test_not_enough_free_blocks_changes_nothing() -> None:
    c = kvindex.HashChainCache(11, 16)
    c.admit(0, toks(range(48)))
    c.free(0)
    c.admit(1, toks(range(1000, 1000 + 5 * 16)))  # takes 4..8 from the head
    before = (c.free_queue().tolist(), [c.ref_count(b) for b in range(11)], c.stats)
    assert c.admit(2, toks(range(48), range(2000, 2000 + 4 * 16))) is None
    after = (c.free_queue().tolist(), [c.ref_count(b) for b in range(11)], c.stats)
    assert before == after
    c.check_invariants()


def test_cache_key_salting() -> None:
    c = kvindex.HashChainCache(32, 16)
    prompt = toks(range(60))
    c.admit(0, prompt, cache_salt="salt1")
    assert c.lookup(prompt, cache_salt="salt1") == 48
    assert c.lookup(prompt, cache_salt="salt2") == 0
    assert c.lookup(prompt) == 0
    c.admit(1, prompt)
    assert c.lookup(prompt, cache_salt="salt1") == 48 and c.lookup(prompt) == 48


def test_lora_isolation() -> None:
    c = kvindex.HashChainCache(32, 16)
    prompt = toks(range(60))
    c.admit(0, prompt, lora=("sql", "/p/sql"))
    assert c.lookup(prompt, lora=("sql", "/p/sql")) == 48
    assert c.lookup(prompt, lora=("sql", "/p/other")) == 0
    assert c.lookup(prompt) == 0


def test_mm_prefix_caching() -> None:
    c = kvindex.HashChainCache(32, 16)
    prompt = toks(range(64))
    mm = [("img-a", 5, 20), ("img-b", 40, 4)]
    c.admit(0, prompt, mm_items=mm)
    assert c.lookup(prompt, mm_items=mm) == 48
    # a different second image changes blocks from block 2 (tokens 32..47) on
    assert c.lookup(prompt, mm_items=[("img-a", 5, 20), ("img-c", 40, 4)]) == 32
    # a different first image changes everything
    assert c.lookup(prompt, mm_items=[("img-z", 5, 20), ("img-b", 40, 4)]) == 0
    # same images, different text after them: blocks 0..2 still hit
    other = toks(range(48), range(900, 916))
    assert c.lookup(other, mm_items=mm) == 48


def test_reset_prefix_cache() -> None:
    c = kvindex.HashChainCache(11, 16, enable_events=True)
    c.admit(0, toks(range(40)))
    with pytest.raises(kvindex.BlockInUseError):
        c.reset()
    c.free(0)
    c.reset()
    assert c.num_cached_blocks == 0
    assert all(c.block_hash(b) is None for b in range(11))
    assert isinstance(c.take_events()[-1], kvindex.AllBlocksCleared)


def test_evict_one_duplicate_copy_keeps_hash_hittable() -> None:
    c = kvindex.HashChainCache(16, 16)
    c.admit(0, toks(range(32)))
    c.free(0)
    c.admit(1, toks(range(32)))  # block 1 hit, block 2's hash recached in a new block
    c.free(1)
    dup = [b for b in range(1, 16) if c.block_hash(b) == c.block_hash(2) and b != 2]
    assert len(dup) == 1
    assert c.evict_blocks(ids(2)) == 1
    assert c.lookup(toks(range(33))) == 32  # the other copy still serves it
    assert c.evict_blocks(ids(dup[0])) == 1
    assert c.lookup(toks(range(33))) == 16
    c.check_invariants()


def test_kv_cache_events_with_lora_and_salt() -> None:
    c = kvindex.HashChainCache(16, 4, enable_events=True)
    c.admit(0, toks(range(10)), lora=("sql", "/p"), cache_salt="s")
    (e,) = c.take_events()
    assert isinstance(e, kvindex.BlockStored)
    assert len(e.block_hashes) == 2 and e.parent_block_hash is None
    assert e.token_ids == list(range(8)) and e.block_size == 4 and e.lora_name == "sql"
    assert e.extra_keys == [("sql", "s"), ("sql",)]
    assert c.take_events() == []
    assert c.append(0, toks([1, 2]))
    (e2,) = c.take_events()
    assert isinstance(e2, kvindex.BlockStored)
    assert e2.parent_block_hash == e.block_hashes[-1]
    full = c.request_block_hashes(0)
    assert e2.block_hashes == [int.from_bytes(bytes(full[2][-8:]), "big")]


def test_block_tables_and_slot_mapping() -> None:
    c = kvindex.HashChainCache(16, 4)
    c.admit(0, toks(range(6)))
    c.admit(1, toks(range(100, 113)))
    bt = c.block_tables(ids(0, 1))
    assert bt.dtype == np.int32 and bt.tolist() == [[1, 2, 0, 0], [3, 4, 5, 6]]
    sm = c.slot_mapping(ids(0, 1), np.asarray([6, 1], dtype=np.int64))
    assert sm.dtype == np.int64
    assert sm.tolist() == [4, 5, 6, 7, 8, 9, 6 * 4 + 0]
    out = np.full((2, 6), -1, dtype=np.int32)
    assert c.block_tables(ids(0, 1), out=out) is out
    assert out.tolist() == [[1, 2, 0, 0, 0, 0], [3, 4, 5, 6, 0, 0]]


def test_free_batch_and_usage() -> None:
    c = kvindex.HashChainCache(11, 16)
    c.admit(0, toks(range(20)))
    c.admit(1, toks(range(50, 70)))
    assert c.usage == pytest.approx(0.4)
    c.free_batch(ids(1, 0))
    assert c.num_requests == 0 and c.num_free_blocks == 10 and c.usage == 0.0


def test_common_prefix_blocks() -> None:
    """Blocks shared by every running request, counted as the seed note counts them."""
    c = kvindex.HashChainCache(64, 16)
    assert c.num_common_prefix_blocks == 0  # no running request
    system = range(64)  # 4 full blocks shared by everyone
    c.admit(0, toks(system, range(1000, 1040)))
    assert c.num_common_prefix_blocks == 7  # one request shares all its blocks with itself
    c.admit(1, toks(system, range(2000, 2020)))
    c.admit(2, toks(range(16), range(3000, 3050)))  # diverges after block 0
    assert c.num_common_prefix_blocks == 1
    c.free(2)
    assert c.num_common_prefix_blocks == 4
    c.admit(3, toks(range(500, 540)))  # diverges at block 0
    assert c.num_common_prefix_blocks == 0
    c.free_batch(ids(0, 1, 3))
    assert c.num_common_prefix_blocks == 0


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256"])
def test_refused_admission_retry_reuses_nothing_wrong(algo: str) -> None:
    c = kvindex.HashChainCache(6, 4, algo=algo)
    c.admit(0, toks(range(16)))  # 4 of 5 usable blocks
    big = toks(range(100, 110))
    assert c.admit(1, big) is None  # needs 3 blocks, 1 free: refused, hashes kept
    other = toks(range(200, 210))
    c.free(0)
    c.check_invariants()
    # the same id with another prompt must not reuse the kept hashes
    adm = c.admit(1, other)
    assert adm is not None
    expect = kvindex.block_hashes(other, 4, algo=algo)
    assert c.request_block_hashes(1).tobytes() == expect.tobytes()
    c.free(1)
    assert c.admit(2, big, cache_salt="s") is not None
    c.free(2)
    c.admit(3, toks(range(300, 316)))
    assert c.admit(4, big) is None
    c.free(3)
    adm = c.admit(4, big)  # the retry of the same prompt
    assert adm is not None
    assert c.request_block_hashes(4).tobytes() == kvindex.block_hashes(big, 4, algo=algo).tobytes()
    c.check_invariants()


def test_event_repr_is_python_style() -> None:
    c = kvindex.HashChainCache(16, 4, enable_events=True)
    c.admit(1, np.arange(9, dtype=np.int32))
    c.append(1, np.arange(3, dtype=np.int32))
    first, second = c.take_events()
    assert "parent_block_hash=None" in repr(first) and "lora_name=None" in repr(first)
    assert "Some(" not in repr(second)
    assert f"parent_block_hash={first.block_hashes[-1]}" in repr(second)
