"""pytest-benchmark suite for the Python-visible hot-path calls (one scheduler step each).

Run: ``python -m pytest benches/test_bench_api.py --benchmark-enable``. Under plain
pytest (``--benchmark-disable``, the project default) each body runs once as a test.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvindex

BS = 16


@pytest.fixture(scope="module")
def system_prompt() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 50_000, 2400, dtype=np.int32)


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256_cbor", "vllm_sha256"])
def test_block_hashes_2705(benchmark, system_prompt: np.ndarray, algo: str) -> None:  # type: ignore[no-untyped-def]
    prompt = np.concatenate([system_prompt, np.arange(305, dtype=np.int32)])
    out = benchmark(kvindex.block_hashes, prompt, BS, algo=algo)
    assert out.shape[0] == len(prompt) // BS


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256_cbor"])
def test_admit_free_shared_prefix(benchmark, system_prompt: np.ndarray, algo: str) -> None:  # type: ignore[no-untyped-def]
    cache = kvindex.HashChainCache(4096, BS, algo=algo)
    prompt = np.concatenate([system_prompt, np.arange(305, dtype=np.int32)])
    cache.admit(0, prompt)
    cache.free(0)

    def step() -> int:
        adm = cache.admit(1, prompt)
        assert adm is not None
        cache.free(1)
        return adm.num_cached_tokens

    assert benchmark(step) == 2704  # 169 full blocks; the 2705th token is recomputed


def test_append_batch_16(benchmark) -> None:  # type: ignore[no-untyped-def]
    cache = kvindex.HashChainCache(65536, BS)
    for i in range(16):
        cache.admit(i, np.arange(100, dtype=np.int32) + 1000 * i)
    ids = np.arange(16, dtype=np.int64)
    tok = np.ones(16, dtype=np.int32)
    assert benchmark(cache.append_batch, ids, tok)


def test_block_tables_and_slots_16(benchmark) -> None:  # type: ignore[no-untyped-def]
    cache = kvindex.HashChainCache(4096, BS)
    for i in range(16):
        cache.admit(i, np.arange(1000, dtype=np.int32) + 7 * i)
    ids = np.arange(16, dtype=np.int64)
    out = np.zeros((16, 64), dtype=np.int32)
    ones = np.ones(16, dtype=np.int64)

    def step() -> np.ndarray:
        cache.block_tables(ids, out=out)
        return cache.slot_mapping(ids, ones)

    assert benchmark(step).shape == (16,)
