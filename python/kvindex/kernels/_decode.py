# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Jit code for paged decode attention: a split-KV (flash-decoding) pass and its reduce.

Only ``@triton.jit`` functions live here; :mod:`kvindex.kernels.attention` validates the
arguments, picks the block sizes and launches them.

One program of :func:`_paged_decode_kernel` handles one sequence, up to ``BLOCK_H`` query
heads that share one KV head (the GQA group is packed into the rows of ``tl.dot``), and one
split of that sequence's visible keys. The visible keys ``[kv_lo, seq_len)`` are cut into
``TILE_N``-aligned tiles and the tiles are shared out evenly between ``num_splits``
programs; a split may get no tile (it then reports ``lse = -inf``). Every key is gathered
through the block table on its own, so ``TILE_N`` does not depend on the page size.

With ``num_splits == 1`` the split pass writes the output directly; otherwise it writes
normalised partial outputs and base-2 log-sum-exps, which :func:`_decode_reduce_kernel`
merges.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit(
    do_not_specialize=[
        "stride_bt_seq",
        "num_q_heads",
        "group_size",
        "head_blocks",
        "block_shift",
        "num_splits",
        "sliding_window",
    ]
)
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    num_q_heads,
    group_size,
    head_blocks,
    head_dim,
    block_shift,
    num_splits,
    score_scale,
    softcap,
    sliding_window,
    v_scale,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    seq64 = seq.to(tl.int64)
    kv_head = pid_h // head_blocks

    offs_h = (pid_h % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < group_size
    heads = kv_head * group_size + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_mask = h_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + seq64 * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=q_mask,
        other=0.0,
    )
    if COMPUTE_F32:
        q = q.to(tl.float32)

    # Visible keys [kv_lo, seq_len), cut into TILE_N-aligned tiles shared between splits.
    seq_len = tl.load(seq_lens_ptr + seq)
    kv_lo = seq_len * 0
    if sliding_window > 0:
        kv_lo = tl.maximum(seq_len - sliding_window, 0)
    first_tile = kv_lo // TILE_N
    num_tiles = tl.cdiv(seq_len, TILE_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_begin = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, first_tile + num_tiles)

    bt_row = block_tables_ptr + seq64 * stride_bt_seq
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_v_head
    slot_mask = (1 << block_shift) - 1

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for tile in range(tile_begin, tile_end):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)
        n_ok = (offs_n >= kv_lo) & (offs_n < seq_len)
        page = tl.load(bt_row + (offs_n >> block_shift), mask=n_ok, other=0).to(tl.int64)
        slot = (offs_n & slot_mask).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_off = page * stride_k_block + slot * stride_k_slot
        v_off = page * stride_v_block + slot * stride_v_slot
        k = tl.load(k_head + k_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_head + v_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        k = k.to(q.dtype)
        v = v.to(q.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * score_scale
        if softcap > 0:
            # softcap * tanh(s / softcap), written with exp so it runs everywhere.
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        s = tl.where(n_ok[None, :], s * LOG2E, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    if num_splits == 1:
        o_ptrs = out_ptr + seq64 * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (seq64 * num_q_heads + heads) * num_splits + split
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=h_ok)
        tl.store(part_out_ptr + part[:, None] * head_dim + offs_d[None, :], o, mask=q_mask)


@triton.jit(do_not_specialize=["num_q_heads", "num_splits"])
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_o_seq,
    stride_o_head,
    num_q_heads,
    head_dim,
    num_splits,
    BLOCK_D: tl.constexpr,
):
    seq64 = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    first = (seq64 * num_q_heads + head) * num_splits

    lse_max = tl.load(part_lse_ptr + first)
    for i in range(1, num_splits):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + first + i))
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)

    den = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(num_splits):
        w = tl.exp2(tl.load(part_lse_ptr + first + i) - lse_max)
        o = tl.load(part_out_ptr + (first + i) * head_dim + offs_d, mask=d_ok, other=0.0)
        acc += w * o
        den += w
    den = tl.where(den > 0.0, den, 1.0)
    o_ptrs = out_ptr + seq64 * stride_o_seq + head * stride_o_head + offs_d
    tl.store(o_ptrs, (acc / den).to(out_ptr.dtype.element_ty), mask=d_ok)
