# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Jit code for paged attention (decode and prefill) and its split-merge kernel.

Only ``@triton.jit`` functions live here; :mod:`kvindex.kernels.attention` validates the
arguments, :mod:`kvindex.kernels._launch` picks the block sizes and launches them.

One program of :func:`_paged_attention_kernel` handles one block of query rows of one
sequence against one KV head, over one split of the keys those rows may see:

- rows: ``tokens_per_prog`` consecutive new tokens times ``heads_per_prog`` query heads of
  the KV head's group (row ``r`` is token ``r // heads_per_prog``, head
  ``r % heads_per_prog``), so the group shares every K/V tile and ``tl.dot`` gets >= 16
  rows even in decode;
- grid axis 0 is flattened over the batch: with ``UNIT_QUERIES`` (decode: one new token per
  sequence) program ``i`` is sequence ``i``; otherwise program ``b`` finds its sequence by a
  binary search over ``query_start_loc[i] // tokens_per_prog + i`` (the first query block
  of sequence ``i``), so ``T // tokens_per_prog + num_seqs`` programs cover any batch of
  ``T`` new tokens and only the last block of each sequence can be idle;
- grid axis 2 is the split (flash-decoding): the visible keys ``[kv_lo, kv_hi)`` of the
  program's rows are cut into ``TILE_N``-aligned tiles shared out between
  ``min(num_splits, cdiv(tiles, min_split_tiles))`` splits, so a short sequence in a
  batch of long ones uses fewer splits (the rest exit at once, writing only ``lse = -inf``).

Every key is gathered through the block table on its own (``page = n // block_size``, a
shift when ``POW2_PAGES``), so ``TILE_N`` does not depend on the page size and any page
size works. New token ``i`` of a
sequence sits at position ``seq_len - q_len + i`` and sees keys ``k`` with
``pos - sliding_window < k <= pos``. A row that sees no key (a sequence of length 0)
gets zeros. With one split the program writes the output; otherwise normalised partial
outputs and base-2 log-sum-exps, which :func:`_merge_splits_kernel` merges.

The key loop is written for Triton's software pipeliner: the block-table load, the K/V
gathers and the dots sit in one ``for`` loop with no early exit, so with ``num_stages``
>= 2 the next tile's page ids and K/V are fetched asynchronously (``cp.async``) while the
current tile is computed (``kernels/sm90_compile_check.py`` checks that they are). With
``MASK_FREE_TILES`` (long queries) the tiles that every row sees whole (keys at or before
the first row's position, no sliding window) run first in a second pipelined loop without
the key masks, so only the diagonal and the last tile pay for them; decode compiles
without it.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _attend_full_tile(
    tile, q, m_i, l_i, acc, bt_row, k_head, v_head, stride_k_block, stride_k_slot,
    stride_v_block, stride_v_slot, block_size, block_shift, offs_d, d_ok, score_scale, softcap,
    TILE_N: tl.constexpr, POW2_PAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The key loop's body for a tile whose keys every row sees: no masks but the head dim."""
    offs_n = tile * TILE_N + tl.arange(0, TILE_N)
    if POW2_PAGES:
        logical_page = offs_n >> block_shift
        in_page = offs_n & (block_size - 1)
    else:
        logical_page = offs_n // block_size
        in_page = offs_n - logical_page * block_size
    page = tl.load(bt_row + logical_page).to(tl.int64)
    slot = in_page.to(tl.int64)
    k_off = page * stride_k_block + slot * stride_k_slot
    v_off = page * stride_v_block + slot * stride_v_slot
    k = tl.load(k_head + k_off[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    v = tl.load(v_head + v_off[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * score_scale
    if softcap > 0:
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
    s = s * LOG2E
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit(
    do_not_specialize=[
        "stride_bt_seq",
        "num_seqs",
        "search_steps",
        "num_q_heads",
        "group_size",
        "heads_per_prog",
        "head_blocks",
        "tokens_per_prog",
        "num_splits",
        "min_split_tiles",
        "sliding_window",
        "block_shift",
    ]
)
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
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
    num_seqs,
    search_steps,
    num_q_heads,
    group_size,
    heads_per_prog,
    head_blocks,
    tokens_per_prog,
    head_dim,
    block_size,
    block_shift,
    num_splits,
    min_split_tiles,
    score_scale,
    softcap,
    sliding_window,
    v_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    UNIT_QUERIES: tl.constexpr,
    POW2_PAGES: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASK_FREE_TILES: tl.constexpr,
):
    q_block = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    if UNIT_QUERIES:
        seq = q_block
        q_start = q_block
        q_len = 1
        tok0 = 0
    else:
        # The last sequence whose first query block is at or before this program's.
        lo = 0
        hi = num_seqs - 1
        for _ in range(search_steps):
            mid = (lo + hi + 1) // 2
            first_block = tl.load(query_start_loc_ptr + mid) // tokens_per_prog + mid
            at_or_before = first_block <= q_block
            lo = tl.where(at_or_before, mid, lo)
            hi = tl.where(at_or_before, hi, mid - 1)
        seq = lo
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        tok0 = (q_block - (q_start // tokens_per_prog + seq)) * tokens_per_prog
        if tok0 >= q_len:
            return
    seq64 = seq.to(tl.int64)

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

    # Keys any row of this program may see: [kv_lo, kv_hi).
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len
    q_pos = ctx_len + tok0 + r_tok
    kv_hi = ctx_len + tl.minimum(tok0 + tokens_per_prog, q_len)
    kv_lo = kv_hi * 0
    if sliding_window > 0:
        kv_lo = tl.maximum(ctx_len + tok0 - sliding_window + 1, 0)
    first_tile = kv_lo // TILE_N
    num_tiles = tl.maximum(tl.cdiv(kv_hi, TILE_N) - first_tile, 0)
    # Splits this program's rows use: fewer for short sequences.
    used_splits = tl.minimum(num_splits, tl.maximum(tl.cdiv(num_tiles, min_split_tiles), 1))
    tiles_per_split = tl.cdiv(num_tiles, used_splits)
    tile_begin = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, first_tile + num_tiles)

    bt_row = block_tables_ptr + seq64 * stride_bt_seq
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_v_head

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if MASK_FREE_TILES:
        # Tiles whose keys every row sees (at or before the first row's position, no
        # window) run without masks first; the loop below takes the rest (the diagonal).
        if sliding_window == 0:
            full_end = tl.maximum(tl.minimum((ctx_len + tok0 + 1) // TILE_N, tile_end), tile_begin)
            for tile in range(tile_begin, full_end):
                m_i, l_i, acc = _attend_full_tile(
                    tile, q, m_i, l_i, acc, bt_row, k_head, v_head, stride_k_block,
                    stride_k_slot, stride_v_block, stride_v_slot, block_size, block_shift,
                    offs_d, d_ok, score_scale, softcap, TILE_N, POW2_PAGES, DOT_PRECISION,
                )  # fmt: skip
            tile_begin = full_end
    for tile in range(tile_begin, tile_end):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)
        n_ok = (offs_n >= kv_lo) & (offs_n < kv_hi)
        if POW2_PAGES:  # shifts instead of a division by a run-time value
            logical_page = offs_n >> block_shift
            in_page = offs_n & (block_size - 1)
        else:
            logical_page = offs_n // block_size
            in_page = offs_n - logical_page * block_size
        page = tl.load(bt_row + logical_page, mask=n_ok, other=0).to(tl.int64)
        slot = in_page.to(tl.int64)
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
        if UNIT_QUERIES:
            visible = n_ok[None, :]
        else:
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
    if num_splits == 1:
        o_ptrs = out_ptr + toks[:, None] * stride_o_tok + heads[:, None] * stride_o_head
        tl.store(o_ptrs + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (toks * num_q_heads + heads) * num_splits + split
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        if split < used_splits:
            part_ptrs = part_out_ptr + part[:, None] * head_dim + offs_d[None, :]
            tl.store(part_ptrs, o, mask=q_mask)


@triton.jit(do_not_specialize=["num_q_heads", "num_splits"])
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_o_tok,
    stride_o_head,
    num_q_heads,
    head_dim,
    num_splits,
    BLOCK_D: tl.constexpr,
):
    """Merges one (token, head)'s split outputs; a split with ``lse = -inf`` is never read."""
    tok64 = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    first = (tok64 * num_q_heads + head) * num_splits

    lse_max = tl.load(part_lse_ptr + first)
    for i in range(1, num_splits):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + first + i))
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)

    den = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(num_splits):
        lse = tl.load(part_lse_ptr + first + i)
        w = tl.exp2(lse - lse_max)
        used = (tl.zeros([BLOCK_D], dtype=tl.float32) + lse) > float("-inf")
        o = tl.load(part_out_ptr + (first + i) * head_dim + offs_d, mask=d_ok & used, other=0.0)
        acc += w * o
        den += w
    den = tl.where(den > 0.0, den, 1.0)
    o_ptrs = out_ptr + tok64 * stride_o_tok + head * stride_o_head + offs_d
    tl.store(o_ptrs, (acc / den).to(out_ptr.dtype.element_ty), mask=d_ok)
