"""Every head-dim class and page size (powers of two or not) against the fp32 oracle."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import FP8, assert_close, make_paged_kv, query_start_loc, randn

from kvindex.kernels import paged_decode_attention, paged_prefill_attention
from kvindex.kernels.reference import ref_paged_decode, ref_paged_prefill


def _decode_and_prefill(
    head_dim: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float16,
    cache_dtype: torch.dtype | None = None,
    heads: tuple[int, int] = (4, 2),
    seq_lens: tuple[int, ...] = (1, 15, 40),
    num_splits: int = 2,
    seed: int = 0,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    scales = (0.03, 0.05) if cache_dtype == FP8 else (1.0, 1.0)
    kv = make_paged_kv(list(seq_lens), gen=gen, block_size=block_size, num_kv_heads=hkv,
                       head_dim=head_dim, cache_dtype=cache_dtype or dtype, k_scale=scales[0],
                       v_scale=scales[1], spare_blocks=1, extra_columns=1)  # fmt: skip
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)
    q = randn(gen, len(seq_lens), hq, head_dim, dtype=dtype)
    out = paged_decode_attention(q, *tables, num_splits=num_splits, **kv.scales)
    assert_close(out, ref_paged_decode(q, *tables, **kv.scales), dtype)

    q_lens = [min(n, 3) for n in seq_lens]
    qsl = query_start_loc(q_lens)
    q = randn(gen, sum(q_lens), hq, head_dim, dtype=dtype)
    out = paged_prefill_attention(q, *tables, qsl, max(q_lens), **kv.scales)
    assert_close(out, ref_paged_prefill(q, *tables, qsl, **kv.scales), dtype)


@pytest.mark.parametrize(
    ("head_dim", "dtype", "cache_dtype"),
    [
        (32, torch.float16, None),
        (112, torch.bfloat16, None),
        (120, torch.float16, None),  # not a multiple of 16
        (192, torch.float16, FP8),  # MLA-style q/k width, 256-wide tile
        (256, torch.bfloat16, None),  # Gemma
        (256, torch.float32, None),
    ],
)
def test_head_dims(head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype | None) -> None:
    _decode_and_prefill(head_dim, 16, dtype=dtype, cache_dtype=cache_dtype, seed=head_dim)


@pytest.mark.parametrize(
    ("block_size", "seq_lens"),
    [
        (3, (1, 5, 40)),  # pages smaller than any tile, not a power of two
        (12, (11, 12, 13, 50)),  # around a 12-token page boundary
        (48, (47, 49, 100)),
        (544, (1, 543, 545)),  # hybrid-model page size, larger than a tile
        (1000, (5, 1001)),
    ],
)
def test_page_sizes_that_are_not_powers_of_two(block_size: int, seq_lens: tuple[int, ...]) -> None:
    _decode_and_prefill(64, block_size, seq_lens=seq_lens, heads=(2, 1), seed=block_size)


def test_largest_power_of_two_page_with_mqa() -> None:
    _decode_and_prefill(64, 1024, heads=(6, 1), seq_lens=(1, 1025), num_splits=3)
