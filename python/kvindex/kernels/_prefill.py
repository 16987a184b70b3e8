# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Jit code for paged prefill attention (new tokens after a cached prefix, varlen batch).

Only ``@triton.jit`` functions live here; :mod:`kvindex.kernels.attention` validates the
arguments, picks the block sizes and launches them.

The new tokens' K/V are already in the paged cache (stored with ``store_kv``), so every key
is read through the block table. One program handles one sequence, one KV head and
``BLOCK_M`` query rows: ``tokens_per_prog`` consecutive new tokens times
``heads_per_prog`` query heads of the KV head's group (row ``r`` is token
``r // heads_per_prog``, head ``r % heads_per_prog``), so the group shares each K/V tile.
New token ``i`` of a sequence sits at position ``seq_len - q_len + i`` and sees the keys
``k`` with ``pos - sliding_window < k <= pos`` (no lower bound when ``sliding_window`` is 0).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit(
    do_not_specialize=[
        "stride_bt_seq",
        "group_size",
        "heads_per_prog",
        "head_blocks",
        "tokens_per_prog",
        "block_shift",
        "sliding_window",
    ]
)
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    group_size,
    heads_per_prog,
    head_blocks,
    tokens_per_prog,
    head_dim,
    block_shift,
    score_scale,
    softcap,
    sliding_window,
    v_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    seq = tl.program_id(1)
    pid_h = tl.program_id(2)
    seq64 = seq.to(tl.int64)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tok0 = q_block * tokens_per_prog
    if tok0 >= q_len:
        return

    kv_head = pid_h // head_blocks
    rows = tl.arange(0, BLOCK_M)
    r_tok = rows // heads_per_prog
    r_head = (pid_h % head_blocks) * heads_per_prog + rows % heads_per_prog
    row_ok = (r_tok < tokens_per_prog) & (tok0 + r_tok < q_len) & (r_head < group_size)
    heads = kv_head * group_size + r_head
    toks = (q_start + tok0 + r_tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + toks[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=q_mask,
        other=0.0,
    )
    if COMPUTE_F32:
        q = q.to(tl.float32)

    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len
    q_pos = ctx_len + tok0 + r_tok
    # Keys any row of this program may see: [kv_lo, kv_hi).
    kv_hi = ctx_len + tl.minimum(tok0 + tokens_per_prog, q_len)
    kv_lo = seq_len * 0
    if sliding_window > 0:
        kv_lo = tl.maximum(ctx_len + tok0 - sliding_window + 1, 0)

    bt_row = block_tables_ptr + seq64 * stride_bt_seq
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_v_head
    slot_mask = (1 << block_shift) - 1

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for tile in range(kv_lo // TILE_N, tl.cdiv(kv_hi, TILE_N)):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)
        n_ok = (offs_n >= kv_lo) & (offs_n < kv_hi)
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
        visible = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if sliding_window > 0:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s * LOG2E, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    o_ptrs = out_ptr + toks[:, None] * stride_o_tok + heads[:, None] * stride_o_head
    tl.store(o_ptrs + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=q_mask)
