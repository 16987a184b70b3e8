"""Strided layouts, empty sequences, split-KV edge cases and the launch grids.

A kernel that addressed V with K's strides, or wrote outside ``out``'s view, passed every
test with contiguous tensors; these tests give each tensor its own strides.
"""

from __future__ import annotations

import torch
from paged_testlib import DEVICE, assert_close, make_paged_kv, query_start_loc, randn

from kvindex.kernels import paged_decode_attention, paged_prefill_attention, store_kv
from kvindex.kernels._launch import (
    MAX_SPLITS,
    default_num_splits,
    plan_decode,
    plan_prefill,
)
from kvindex.kernels.reference import ref_paged_decode, ref_paged_prefill

F16 = torch.float16


def _kv(seq_lens: list[int], seed: int, heads: int = 2, block: int = 8, dim: int = 64) -> object:
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(seq_lens, gen=gen, block_size=block, num_kv_heads=heads, head_dim=dim,
                       cache_dtype=F16, spare_blocks=1)  # fmt: skip
    return gen, kv


def test_strided_q_out_and_caches() -> None:
    """q sliced from a fused QKV tensor, out inside a NaN buffer, K/V with other strides."""
    gen, kv = _kv([5, 30, 17], seed=11)
    hq, hkv, dim = 4, 2, 64
    # K and V as views of one allocation ([blocks, 2, page, heads, dim]) ...
    nb, page = kv.k_cache.shape[:2]
    fused_kv = torch.full((nb, 2, page, hkv, dim), float("nan"), dtype=F16, device=DEVICE)
    fused_kv[:, 0] = kv.k_cache
    fused_kv[:, 1] = kv.v_cache
    k_view, v_view = fused_kv[:, 0], fused_kv[:, 1]
    # ... and V with strides of its own: a head-padded buffer (one spare head per slot).
    v_padded = torch.full((nb, page, hkv + 1, dim), float("nan"), dtype=F16, device=DEVICE)
    v_padded[:, :, :hkv] = kv.v_cache
    v_other = v_padded[:, :, :hkv]
    assert k_view.stride() != v_other.stride()
    tables = (kv.block_tables, kv.seq_lens)
    qkv = randn(gen, 3, hq + 2 * hkv, dim, dtype=F16)
    q = qkv[:, :hq]
    ref = ref_paged_decode(q, kv.k_cache, kv.v_cache, *tables)
    for k_cache, v_cache in ((k_view, v_view), (k_view, v_other), (kv.k_cache, v_other)):
        for splits in (1, 3):
            big = torch.full((3, hq + 3, dim), float("nan"), dtype=F16, device=DEVICE)
            out = big[:, 2 : 2 + hq]
            paged_decode_attention(q, k_cache, v_cache, *tables, out=out, num_splits=splits)
            assert_close(out, ref, F16)
            assert big[:, :2].isnan().all() and big[:, 2 + hq :].isnan().all()

    q_lens = [2, 0, 3]
    qsl = query_start_loc(q_lens)
    qkv = randn(gen, 5, hq + 2 * hkv, dim, dtype=F16)
    q = qkv[:, hkv : hkv + hq]
    ref = ref_paged_prefill(q, kv.k_cache, kv.v_cache, *tables, qsl)
    big = torch.full((5, hq + 1, dim), float("nan"), dtype=F16, device=DEVICE)
    out = big[:, 1:]
    paged_prefill_attention(q, k_view, v_other, *tables, qsl, 3, out=out, num_splits=2)
    assert_close(out, ref, F16)
    assert big[:, 0].isnan().all()


def test_store_kv_into_views_with_different_strides() -> None:
    gen = torch.Generator().manual_seed(12)
    nb, page, hkv, dim = 4, 8, 2, 64
    fused = torch.full((nb, 2, page, hkv + 1, dim), float("nan"), dtype=F16, device=DEVICE)
    k_cache, v_cache = fused[:, 0, :, :hkv], fused[:, 1, :, 1:]
    qkv = randn(gen, 5, 3 * hkv, dim, dtype=F16)
    key, value = qkv[:, hkv : 2 * hkv], qkv[:, 2 * hkv :]
    slots = torch.tensor([9, -1, 10, 31, 0], dtype=torch.int64, device=DEVICE)
    store_kv(key, value, k_cache, v_cache, slots)
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // page, slot % page], key[i])
            assert torch.equal(v_cache[slot // page, slot % page], value[i])
    written = sum(s >= 0 for s in slots.tolist())
    assert (~fused[:, 0, :, :hkv].isnan()).all(-1).sum() == written * hkv
    assert fused[:, 0, :, hkv].isnan().all() and fused[:, 1, :, 0].isnan().all()


def test_length_zero_sequences_in_decode_give_zeros() -> None:
    gen, kv = _kv([0, 20, 0, 9], seed=13)
    q = randn(gen, 4, 4, 64, dtype=F16)
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)
    ref = ref_paged_decode(q, *tables)
    for splits in (1, 4):
        out = paged_decode_attention(q, *tables, num_splits=splits)
        assert_close(out, ref, F16)
        assert (out[0] == 0).all() and (out[2] == 0).all()


def test_large_logits_with_many_splits() -> None:
    """Scores in the hundreds: the split merge must rescale by each split's own max."""
    gen, kv = _kv([1, 200], seed=14, heads=1)
    q = randn(gen, 2, 2, 64) * 40.0
    k, v = kv.k_cache.float(), kv.v_cache.float()
    tables = (kv.block_tables, kv.seq_lens)
    ref = ref_paged_decode(q, k, v, *tables)
    for splits in (MAX_SPLITS, 7):
        out = paged_decode_attention(q, k, v, *tables, num_splits=splits)
        assert_close(out, ref, torch.float32)


def test_multi_token_queries_use_split_kv() -> None:
    """Speculative-decode-style queries (4 tokens after a long prefix) split the keys."""
    gen, kv = _kv([150, 6, 90], seed=15)
    q_lens = [4, 4, 2]
    qsl = query_start_loc(q_lens)
    q = randn(gen, sum(q_lens), 4, 64, dtype=F16)
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, qsl)
    out = paged_prefill_attention(q, *tables, 4, num_splits=5)
    assert_close(out, ref_paged_prefill(q, *tables), F16)
    q, k, v, tables, lens, qsl = _meta_batch([4] * 8, width=2048)
    launches = plan_prefill(q, k, v, tables, lens, qsl, 4, torch.empty_like(q),
                            interpreted=False, **OPTS)  # fmt: skip
    assert launches[0].grid[2] > 1, "short queries after a long table split by default"


def _meta_batch(q_lens: list[int], hq: int = 32, hkv: int = 8, width: int = 4) -> tuple:
    meta = torch.device("meta")
    seqs, tokens = len(q_lens), sum(q_lens)
    q = torch.empty((tokens, hq, 128), dtype=torch.bfloat16, device=meta)
    cache = torch.empty((64, 16, hkv, 128), dtype=torch.bfloat16, device=meta)
    tables = torch.empty((seqs, width), dtype=torch.int32, device=meta)
    lens = torch.empty((seqs,), dtype=torch.int32, device=meta)
    qsl = torch.empty((seqs + 1,), dtype=torch.int32, device=meta)
    return q, cache, cache, tables, lens, qsl


OPTS = {"scale": 0.1, "sliding_window": 0, "softcap": 0.0, "k_scale": 1.0, "v_scale": 1.0}


def test_prefill_grid_launches_only_programs_with_work() -> None:
    q_lens = [2048] + [1] * 255
    q, k, v, tables, lens, qsl = _meta_batch(q_lens)
    (launch,) = plan_prefill(q, k, v, tables, lens, qsl, 2048, torch.empty_like(q),
                             interpreted=False, **OPTS)  # fmt: skip
    rows = launch.constexprs["BLOCK_M"]
    tokens_per_prog = rows // min(4, rows)
    needed = -(-2048 // tokens_per_prog) + 255
    # Axis 0 covers the batch; at most one idle program per sequence.
    assert needed <= launch.grid[0] <= needed + 256
    assert launch.grid[1:] == (8, 1)


def test_prefill_grid_takes_more_than_65535_sequences() -> None:
    q, k, v, tables, lens, qsl = _meta_batch([1] * 70_000)
    (launch,) = plan_prefill(q, k, v, tables, lens, qsl, 1, torch.empty_like(q),
                             interpreted=False, **OPTS)  # fmt: skip
    assert launch.grid[1] <= 65_535 and launch.grid[2] <= 65_535
    assert launch.grid[0] >= 70_000


def _fill(programs: int, splits: int, slots: int) -> float:
    total = programs * splits
    return total / (-(-total // slots) * slots)


def test_split_count_fills_the_waves() -> None:
    sms = 132
    # batch 8 x 8 KV heads at 32K: 64 programs, 4 per SM -> 8 splits fill 512 of 528 slots;
    # 16 splits of 2,048 keys fill two waves as well and balance mixed lengths better.
    assert default_num_splits(64, 32768, 4, sms, 32) == 16
    # batch 32 at 8K: 256 programs -> 2 splits (one full wave), not 1 (half a wave); then
    # 4 splits of 2,048 keys (two full waves).
    assert default_num_splits(256, 8192, 4, sms, 32) == 4
    # 2K tables: no split below 2,048 keys beyond what fills the waves.
    assert default_num_splits(512, 2048, 4, sms, 32) == 1
    # One sequence at 64K: 8 programs take up to MAX_SPLITS splits to fill the GPU.
    assert default_num_splits(8, 65536, 4, sms, 64) > 32
    for programs in (1, 8, 64, 100, 264, 1000, 5000):
        for per_sm in (1, 2, 4):
            splits = default_num_splits(programs, 1 << 20, per_sm, sms, 32)
            assert 1 <= splits <= MAX_SPLITS
            best = max(_fill(programs, s, sms * per_sm) for s in range(1, MAX_SPLITS + 1))
            assert _fill(programs, splits, sms * per_sm) >= best - 0.05
    assert default_num_splits(1, 300, 4, sms, 32) == 2  # short tables split little
    q = torch.empty((8, 32, 128), dtype=torch.bfloat16, device="meta")
    cache = torch.empty((64, 16, 8, 128), dtype=torch.bfloat16, device="meta")
    tables = torch.empty((8, 2048), dtype=torch.int32, device="meta")
    lens = torch.empty((8,), dtype=torch.int32, device="meta")
    launches = plan_decode(q, cache, cache, tables, lens, torch.empty_like(q),
                           num_splits=None, interpreted=False, **OPTS)  # fmt: skip
    grid = launches[0].grid
    assert 2048 * 16 // grid[2] >= 2048  # splits of at least 2,048 keys
    assert _fill(grid[0] * grid[1], grid[2], DEFAULT_SLOTS) >= 0.95


DEFAULT_SLOTS = 132 * 4  # meta tensors: DEFAULT_SMS x the bf16 D=128 decode config's 4
