"""Sizes the machine cannot hold raise CapacityError (a MemoryError) instead of aborting."""

from __future__ import annotations

import pytest

import kvindex


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256_cbor"])
def test_huge_hash_chain_pool_raises_capacity_error(algo: str) -> None:
    # 2**31 - 1 blocks: the per-block hash table alone is ~68 GiB, refused up front.
    with pytest.raises(kvindex.CapacityError, match="cannot allocate") as ei:
        kvindex.HashChainCache(2**31 - 1, 16, algo=algo)
    assert isinstance(ei.value, MemoryError)
    assert isinstance(ei.value, kvindex.KvIndexError)
    # The process is fine and a normal cache still builds.
    c = kvindex.HashChainCache(64, 16, algo=algo)
    c.check_invariants()
    assert c.num_free_blocks == 63


def test_too_many_blocks_for_int32_ids_is_invalid() -> None:
    with pytest.raises(kvindex.InvalidArgumentError, match="too large"):
        kvindex.HashChainCache(2**31, 16)
