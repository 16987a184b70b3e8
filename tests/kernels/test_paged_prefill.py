"""paged_prefill_attention against the fp32 oracle, and against decode for q_len 1."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import FP8, assert_close, make_paged_kv, query_start_loc, randn

from kvindex.kernels import paged_decode_attention, paged_prefill_attention
from kvindex.kernels.reference import ref_paged_prefill

# (cached prefix, new tokens): prefixes 0..100, q_len 0..64, page-boundary cases.
BATCH = [(0, 1), (0, 64), (100, 0), (37, 5), (16, 16), (1, 63), (100, 64), (15, 2)]
SMALL_BATCH = [(0, 1), (37, 5), (100, 40), (16, 0), (15, 2)]


def _check(
    batch: list[tuple[int, int]],
    *,
    dtype: torch.dtype = torch.float16,
    cache_dtype: torch.dtype | None = None,
    block_size: int = 16,
    head_dim: int = 64,
    heads: tuple[int, int] = (4, 2),
    seed: int = 0,
    sliding_window: int = 0,
    softcap: float = 0.0,
    scales: tuple[float, float] = (1.0, 1.0),
    **layout: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_q_heads, num_kv_heads = heads
    kv = make_paged_kv(
        [p + n for p, n in batch],
        gen=gen,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        cache_dtype=cache_dtype or dtype,
        k_scale=scales[0],
        v_scale=scales[1],
        **layout,
    )
    q_lens = [n for _, n in batch]
    qsl = query_start_loc(q_lens)
    q = randn(gen, sum(q_lens), num_q_heads, head_dim, dtype=dtype)
    opts = {"sliding_window": sliding_window, "softcap": softcap, **kv.scales}
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, qsl)
    out = paged_prefill_attention(q, *tables, max(q_lens), **opts)
    ref = ref_paged_prefill(q, *tables, **opts)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(
    ("dtype", "block_size", "head_dim", "heads", "batch"),
    [
        (torch.float16, 16, 64, (4, 2), BATCH),
        (torch.bfloat16, 8, 64, (4, 2), BATCH),
        (torch.float32, 32, 64, (4, 2), SMALL_BATCH),  # fp32 tiles are smaller: slower
        (torch.float16, 1, 64, (2, 2), BATCH),  # MHA, token-level pages
        (torch.float16, 16, 80, (6, 2), BATCH),  # group of 3: 21 tokens x 3 heads per program
        (torch.bfloat16, 128, 128, (4, 1), SMALL_BATCH),  # MQA, biggest page
    ],
)
def test_prefill_matches_oracle(
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    heads: tuple[int, int],
    batch: list[tuple[int, int]],
) -> None:
    _check(batch, dtype=dtype, block_size=block_size, head_dim=head_dim, heads=heads)


def test_group_wider_than_a_program() -> None:
    # fp32 packs 32 rows: a group of 40 heads needs two head blocks of one token each.
    _check([(5, 3), (0, 2), (40, 1)], dtype=torch.float32, heads=(40, 1), seed=1)


def test_out_of_range_ids_in_unused_columns_are_never_read() -> None:
    _check(BATCH, pad_id=2**30, shared_prefix_blocks=1, seed=2)


@pytest.mark.parametrize(("sliding_window", "softcap"), [(1, 0.0), (17, 0.0), (0, 5.0), (40, 2.0)])
def test_sliding_window_and_softcap(sliding_window: int, softcap: float) -> None:
    _check(BATCH, sliding_window=sliding_window, softcap=softcap, seed=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_cache_with_scales(dtype: torch.dtype) -> None:
    _check(SMALL_BATCH, dtype=dtype, cache_dtype=FP8, scales=(0.03, 0.04), seed=4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_prefill_with_one_new_token_equals_decode(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    seq_lens = [1, 17, 70]
    kv = make_paged_kv(
        seq_lens, gen=gen, block_size=16, num_kv_heads=2, head_dim=64, cache_dtype=dtype
    )
    q = randn(gen, len(seq_lens), 6, 64, dtype=dtype)
    qsl = query_start_loc([1] * len(seq_lens))
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)
    for window in (0, 9):
        prefill = paged_prefill_attention(q, *tables, qsl, 1, sliding_window=window)
        decode = paged_decode_attention(q, *tables, num_splits=2, sliding_window=window)
        atol, rtol = (1e-6, 1e-6) if dtype == torch.float32 else (1e-3, 1e-3)
        torch.testing.assert_close(prefill, decode, atol=atol, rtol=rtol)


def test_no_new_tokens_at_all() -> None:
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv(
        [3, 9], gen=gen, block_size=8, num_kv_heads=1, head_dim=64, cache_dtype=torch.float16
    )
    q = randn(gen, 0, 2, 64, dtype=torch.float16)
    qsl = query_start_loc([0, 0])
    out = paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, qsl, 0)
    assert out.shape == (0, 2, 64)
