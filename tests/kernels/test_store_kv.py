"""store_kv: slots written exactly, -1 skipped, fp8 quantised; store then prefill == dense."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import DEVICE, FP8, assert_close, quantize, query_start_loc, randn

from kvindex.kernels import paged_prefill_attention, store_kv
from kvindex.kernels.reference import dense_causal_attention


def _nan_cache(num_blocks: int, block_size: int, heads: int, dim: int, dtype: torch.dtype):
    return torch.full((num_blocks, block_size, heads, dim), float("nan"), device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "block_size", "head_dim"),
    [
        (torch.float16, torch.float16, 16, 64),
        (torch.bfloat16, torch.bfloat16, 1, 80),
        (torch.float32, torch.float32, 8, 128),
        (torch.float16, FP8, 16, 64),
        (torch.bfloat16, FP8, 32, 96),
        (torch.float32, FP8, 4, 64),
    ],
)
def test_store_writes_owned_slots_only(
    dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, n = 2, 45
    num_blocks = 1 + -(-2 * n // block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[::7] = -1  # padding tokens
    slots = slots.to(DEVICE)
    key = randn(gen, n, heads, head_dim, dtype=dtype) * 40  # fp8 saturates past 448 * scale
    value = randn(gen, n, heads, head_dim, dtype=dtype)
    # e4m3 edge cases (after / scale): zero, subnormals, ties, binade edges, saturation.
    edges = [0.0, 2.0**-9, 3 * 2.0**-10, 0.0137, 1.0625, 1.1875, 15.5, 15.9, 240.0, 460.0, 1e4]
    edges += [-e for e in edges]
    value[1, 0, : len(edges)] = torch.tensor(edges, device=DEVICE).to(dtype) * 0.01
    k_cache = _nan_cache(num_blocks, block_size, heads, head_dim, cache_dtype)
    v_cache = _nan_cache(num_blocks, block_size, heads, head_dim, cache_dtype)
    scales = {"k_scale": 0.05, "v_scale": 0.01} if cache_dtype == FP8 else {}
    store_kv(key, value, k_cache, v_cache, slots, **scales)

    flat_k = k_cache.view(-1, heads, head_dim).float()
    flat_v = v_cache.view(-1, heads, head_dim).float()
    kept = slots >= 0
    want_k = quantize(key[kept], cache_dtype, scales.get("k_scale", 1.0)).float()
    want_v = quantize(value[kept], cache_dtype, scales.get("v_scale", 1.0)).float()
    torch.testing.assert_close(flat_k[slots[kept]], want_k, atol=0, rtol=0)
    torch.testing.assert_close(flat_v[slots[kept]], want_v, atol=0, rtol=0)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots[kept]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


@pytest.mark.parametrize(
    ("dtype", "block_size", "heads", "sliding_window", "softcap"),
    [
        (torch.float32, 16, (4, 2), 0, 0.0),
        (torch.float16, 1, (3, 1), 0, 0.0),
        (torch.bfloat16, 8, (4, 4), 11, 3.0),
    ],
)
def test_store_then_prefill_equals_dense_causal_attention(
    dtype: torch.dtype,
    block_size: int,
    heads: tuple[int, int],
    sliding_window: int,
    softcap: float,
) -> None:
    """Two sequences, each stored in two chunks (prefix, then new tokens with padding)."""
    gen = torch.Generator().manual_seed(1)
    hq, hkv, dim = heads[0], heads[1], 64
    lens, prefix = [37, 20], [30, 0]
    num_blocks = 1 + sum(-(-n // block_size) for n in lens) + 2
    pages = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros((2, num_blocks), dtype=torch.int32)
    seqs = []
    for i, n in enumerate(lens):
        row = [pages.pop() for _ in range(-(-n // block_size))]
        tables[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        slot = [row[t // block_size] * block_size + t % block_size for t in range(n)]
        q, k, v = (randn(gen, n, h, dim, dtype=dtype) for h in (hq, hkv, hkv))
        seqs.append((torch.tensor(slot, dtype=torch.int64, device=DEVICE), q, k, v))
    k_cache = _nan_cache(num_blocks, block_size, hkv, dim, dtype)
    v_cache = _nan_cache(num_blocks, block_size, hkv, dim, dtype)

    def store(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        slots, k, v = (torch.cat(x) for x in zip(*parts, strict=True))
        pad = torch.full((3,), -1, dtype=torch.int64, device=DEVICE)
        junk = randn(gen, 3, hkv, dim, dtype=dtype)
        store_kv(torch.cat([k, junk]), torch.cat([v, junk]), k_cache, v_cache,
                 torch.cat([slots, pad]))  # fmt: skip

    store([(s[:p], k[:p], v[:p]) for (s, _, k, v), p in zip(seqs, prefix, strict=True)])
    store([(s[p:], k[p:], v[p:]) for (s, _, k, v), p in zip(seqs, prefix, strict=True)])

    q_new = torch.cat([q[p:] for (_, q, _, _), p in zip(seqs, prefix, strict=True)])
    q_lens = [n - p for n, p in zip(lens, prefix, strict=True)]
    opts = {"sliding_window": sliding_window, "softcap": softcap}
    out = paged_prefill_attention(
        q_new,
        k_cache,
        v_cache,
        tables.to(DEVICE),
        torch.tensor(lens, dtype=torch.int32, device=DEVICE),
        query_start_loc(q_lens),
        max(q_lens),
        **opts,
    )
    dense = torch.cat(
        [
            dense_causal_attention(q, k, v, **opts)[p:]
            for (_, q, k, v), p in zip(seqs, prefix, strict=True)
        ]
    )
    assert_close(out, dense, dtype)
