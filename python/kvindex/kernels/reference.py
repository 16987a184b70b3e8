"""The torch fp32 oracle for the paged-attention kernels, shared by tests and benchmarks.

It follows the contract of :mod:`kvindex.kernels.attention` literally: gather each
sequence's K/V through its block table (only the ``seq_len`` slots it owns), dequantise
fp8 with the per-tensor scales, and run a masked softmax in fp32. Slow (a Python loop over
sequences) and obviously correct is the point.
"""

from __future__ import annotations

import torch

__all__ = [
    "attention_reference",
    "dense_causal_attention",
    "gather_kv",
    "ref_paged_decode",
    "ref_paged_prefill",
]


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float = 1.0
) -> torch.Tensor:
    """The first ``seq_len`` tokens of one sequence: ``[seq_len, Hkv, D]`` in fp32."""
    _, block_size, num_kv_heads, head_dim = cache.shape
    num_pages = -(-seq_len // block_size)
    pages = block_table[:num_pages].to(device=cache.device, dtype=torch.long)
    tokens = cache[pages].reshape(num_pages * block_size, num_kv_heads, head_dim)[:seq_len]
    return tokens.float() * scale


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Queries ``[n, Hq, D]`` at positions ``q_pos`` against keys at positions ``0..L-1``.

    ``k``/``v`` are ``[L, Hkv, D]``; query head ``h`` uses KV head ``h // (Hq // Hkv)``.
    A query at position ``p`` sees keys ``k`` with ``p - sliding_window < k <= p``
    (``sliding_window`` 0: no lower bound); a query that sees no key gets zeros.
    Returns fp32 ``[n, Hq, D]``.
    """
    q, k, v = q.float(), k.float(), v.float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = q.shape[2] ** -0.5 if scale is None else scale
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    k_pos = torch.arange(k.shape[0], device=q.device)
    q_pos = q_pos.to(device=q.device, dtype=torch.long)
    visible = k_pos[None, :] <= q_pos[:, None]
    if sliding_window > 0:
        visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without keys: all -inf
    return torch.einsum("hqk,khd->qhd", probs, v)


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Causal attention over a whole sequence: ``q`` ``[L, Hq, D]``, ``k``/``v`` ``[L, Hkv, D]``."""
    q_pos = torch.arange(q.shape[0], device=q.device)
    return attention_reference(
        q, k, v, q_pos, scale=scale, sliding_window=sliding_window, softcap=softcap
    )


def ref_paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The oracle for ``paged_prefill_attention``: fp32 ``[total_new_tokens, Hq, D]``."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len, k_scale)
        v = gather_kv(v_cache, block_tables[i], seq_len, v_scale)
        q_pos = torch.arange(seq_len - (hi - lo), seq_len)
        out[lo:hi] = attention_reference(
            q[lo:hi], k, v, q_pos, scale=scale, sliding_window=sliding_window, softcap=softcap
        )
    return out


def ref_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The oracle for ``paged_decode_attention``: fp32 ``[num_seqs, Hq, D]``."""
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return ref_paged_prefill(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
