"""paged_decode_attention against the fp32 oracle (interpreter on CPU, compiled on CUDA)."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import FP8, assert_close, make_paged_kv, randn

from kvindex.kernels import paged_decode_attention
from kvindex.kernels.reference import ref_paged_decode

RAGGED = [1, 15, 16, 17, 70]  # around the 16-token page boundary, and a multi-tile one


def _check(
    seq_lens: list[int],
    *,
    dtype: torch.dtype = torch.float16,
    cache_dtype: torch.dtype | None = None,
    block_size: int = 16,
    head_dim: int = 64,
    heads: tuple[int, int] = (4, 2),
    seed: int = 0,
    num_splits: int | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    scales: tuple[float, float] = (1.0, 1.0),
    **layout: int,
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    num_q_heads, num_kv_heads = heads
    kv = make_paged_kv(
        seq_lens,
        gen=gen,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        cache_dtype=cache_dtype or dtype,
        k_scale=scales[0],
        v_scale=scales[1],
        **layout,
    )
    q = randn(gen, len(seq_lens), num_q_heads, head_dim, dtype=dtype)
    opts = {"sliding_window": sliding_window, "softcap": softcap, **kv.scales}
    out = paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, num_splits=num_splits, **opts
    )
    ref = ref_paged_decode(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, **opts)
    assert_close(out, ref, dtype)
    return out


@pytest.mark.parametrize(
    ("dtype", "block_size", "head_dim", "heads"),
    [
        (torch.float16, 16, 64, (8, 2)),
        (torch.bfloat16, 16, 64, (8, 2)),
        (torch.float32, 16, 64, (8, 2)),
        (torch.float16, 1, 64, (2, 2)),  # MHA, token-level pages (radix cache)
        (torch.bfloat16, 8, 80, (6, 2)),  # group of 3, head_dim padded to 128
        (torch.float32, 32, 128, (4, 1)),  # MQA
        (torch.float16, 16, 128, (12, 4)),  # group of 3
        (torch.float16, 128, 96, (2, 1)),  # biggest page
        (torch.float16, 8, 64, (36, 2)),  # group of 18 > 16 rows: two head blocks
    ],
)
def test_decode_matches_oracle(
    dtype: torch.dtype, block_size: int, head_dim: int, heads: tuple[int, int]
) -> None:
    _check(RAGGED, dtype=dtype, block_size=block_size, head_dim=head_dim, heads=heads)


@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_split_kv_including_empty_splits(num_splits: int) -> None:
    # 7 splits of a 3-tile sequence leave splits without keys; short ones get 1 tile.
    _check([1, 70, 150], num_splits=num_splits, seed=1)


def test_default_split_count_matches_oracle() -> None:
    _check([3, 130], block_size=8, extra_columns=300, seed=2)  # wide table: heuristic splits


def test_sequences_sharing_prefix_blocks() -> None:
    out = _check([40, 33, 64, 70], shared_prefix_blocks=2, num_splits=2, seed=3)
    assert torch.isfinite(out).all()


def test_out_of_range_ids_in_unused_columns_are_never_read() -> None:
    _check(RAGGED, pad_id=2**30, num_splits=3, seed=4)


@pytest.mark.parametrize(
    ("sliding_window", "softcap", "num_splits"),
    [(1, 0.0, 1), (33, 0.0, 3), (0, 5.0, 1), (20, 2.0, 2), (500, 0.0, 2)],
)
def test_sliding_window_and_softcap(sliding_window: int, softcap: float, num_splits: int) -> None:
    _check(
        [1, 17, 150],
        sliding_window=sliding_window,
        softcap=softcap,
        num_splits=num_splits,
        seed=5,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fp8_cache_with_scales(dtype: torch.dtype) -> None:
    _check([1, 16, 70], dtype=dtype, cache_dtype=FP8, scales=(0.02, 0.05), num_splits=2, seed=6)


def test_out_argument_is_filled_and_returned() -> None:
    gen = torch.Generator().manual_seed(7)
    kv = make_paged_kv(
        [5, 40], gen=gen, block_size=16, num_kv_heads=1, head_dim=64, cache_dtype=torch.float32
    )
    q = randn(gen, 2, 2, 64)
    out = torch.full_like(q, float("nan"))
    got = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, out=out)
    assert got is out
    ref = ref_paged_decode(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)
    assert_close(out, ref, torch.float32)
