"""Paged-attention launchers: ``store_kv``, ``paged_decode_attention``, ``paged_prefill_attention``.

Layouts (row-major; the last dim of every tensor is contiguous):

- ``k_cache``, ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``, fp16, bf16,
  fp32 or fp8 e4m3 (``torch.float8_e4m3fn``, with per-tensor ``k_scale`` / ``v_scale``:
  real value = stored value * scale). ``block_size`` is any value in 1..2**20 (the caches'
  rule), ``head_dim`` a multiple of 8 in 32..256. K and V may be views of one allocation,
  and each has its own strides.
- ``block_tables``: int32 ``[num_seqs, max_blocks]``; row ``i`` lists the pages of sequence
  ``i`` in order; columns past the sequence's last page are never read.
- ``seq_lens``: int32 ``[num_seqs]``, cached prefix + new tokens; 0 in decode is a padding
  row (its output is zeros).
- ``query_start_loc``: int32 ``[num_seqs + 1]``, prefix sums of the new-token counts.
- ``slot_mapping``: int64 ``[num_tokens]``, ``block * block_size + offset``; -1 skips.

New token ``i`` of a sequence with ``q_len`` new tokens sits at position
``seq_len - q_len + i`` and attends to every key at or before it (cached prefix included),
and with ``sliding_window = W > 0`` only to the last ``W`` of them (itself included).
Scores are ``scale * q.k`` (``scale`` defaults to ``head_dim ** -0.5``), then
``softcap * tanh(score / softcap)`` when ``softcap > 0``. Accumulation is fp32; the output
has the query's dtype.

Nothing here synchronises with the device (no ``.item()``, no host copies), so the calls can
be captured in CUDA graphs; values that size a launch (``max_query_len``, ``num_splits``)
come from the arguments. Contract violations that only the data shows (a ``seq_len``
smaller than its ``q_len``, page ids out of range, a ``max_query_len`` below the real
maximum) are not detected and give undefined results.
"""

from __future__ import annotations

import torch

from kvindex.exceptions import DTypeError, InvalidArgumentError
from kvindex.kernels._checks import (
    FLOAT_DTYPES,
    FP8_DTYPE,
    check_attention_options,
    check_cache_pair,
    check_out,
    check_query_vs_cache,
    check_same_device,
    check_scales,
    check_tensor,
)
from kvindex.kernels._launch import (
    INTERPRETED,
    MAX_SPLITS,
    plan_decode,
    plan_prefill,
    plan_store_kv,
)

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv"]


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Writes ``key``/``value`` ``[num_tokens, Hkv, D]`` into the caches at ``slot_mapping``.

    Tokens whose slot is negative are skipped. An fp8 cache receives
    ``clamp(x / scale, -448, 448)`` rounded to e4m3.
    """
    check_tensor("key", key, 3, FLOAT_DTYPES)
    check_tensor("value", value, 3, FLOAT_DTYPES)
    if key.shape != value.shape or key.dtype != value.dtype:
        raise InvalidArgumentError(
            f"key and value differ: {tuple(key.shape)} {key.dtype} vs "
            f"{tuple(value.shape)} {value.dtype}"
        )
    _, num_kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    if key.shape[1:] != (num_kv_heads, head_dim):
        raise InvalidArgumentError(
            f"key is [num_tokens, {num_kv_heads}, {head_dim}] for this cache, "
            f"got {tuple(key.shape)}"
        )
    if k_cache.dtype not in (key.dtype, FP8_DTYPE):
        raise DTypeError(f"cache dtype {k_cache.dtype} must be key's ({key.dtype}) or {FP8_DTYPE}")
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    if slot_mapping.shape[0] != key.shape[0]:
        raise InvalidArgumentError(
            f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens"
        )
    check_scales(k_cache.dtype, k_scale, v_scale)
    check_same_device(
        key.device,
        INTERPRETED,
        value=value,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
    )
    for launch in plan_store_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale):
        launch.run()


def _check_tables(num_seqs: int, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    if block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
        raise InvalidArgumentError(
            f"{num_seqs} sequences but block_tables has {block_tables.shape[0]} rows and "
            f"seq_lens {seq_lens.shape[0]} entries"
        )
    if num_seqs and block_tables.shape[1] == 0:
        raise InvalidArgumentError("block_tables must have at least one column")


def _check_num_splits(num_splits: object) -> None:
    if num_splits is not None and (
        isinstance(num_splits, bool)
        or not isinstance(num_splits, int)
        or not 1 <= num_splits <= MAX_SPLITS
    ):
        raise InvalidArgumentError(f"num_splits must be None or an int in 1..{MAX_SPLITS}")


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """One new token per sequence: ``q`` ``[num_seqs, Hq, D]`` -> ``out`` ``[num_seqs, Hq, D]``.

    The token sits at position ``seq_len - 1`` (its K/V already stored); a sequence of
    length 0 gets zeros. Each sequence's keys are cut into up to ``num_splits`` parts that
    run in parallel and are merged by a second kernel (flash-decoding); ``None`` picks the
    count that fills one wave of the GPU (SMs x programs per SM) without exceeding the
    block table's width, and each sequence uses only as many splits as its real length
    needs (decided on the device). ``Hq`` must be a multiple of ``Hkv``.
    """
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_cache_pair(k_cache, v_cache)
    check_query_vs_cache(q, k_cache)
    _check_tables(q.shape[0], block_tables, seq_lens)
    check_attention_options(sliding_window, softcap, scale)
    check_scales(k_cache.dtype, k_scale, v_scale)
    _check_num_splits(num_splits)
    check_out(out, tuple(q.shape), q.dtype, q.device)
    check_same_device(
        q.device,
        INTERPRETED,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
    )
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    plans = plan_decode(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale=q.shape[2] ** -0.5 if scale is None else float(scale),
        num_splits=num_splits,
        sliding_window=sliding_window,
        softcap=float(softcap),
        k_scale=float(k_scale),
        v_scale=float(v_scale),
    )
    for launch in plans:
        launch.run()
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int = 0,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    num_splits: int | None = None,
) -> torch.Tensor:
    """New tokens after cached prefixes: ``q`` ``[total_new_tokens, Hq, D]`` -> ``out``.

    Sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i + 1]`` of ``q`` (possibly
    none). ``max_query_len`` must be at least the largest new-token count: it picks the
    block sizes without reading ``query_start_loc`` on the host. The launch covers the
    batch with ``total_new_tokens // rows + num_seqs`` programs per KV head (each finds its
    sequence on the device), so mixed batches launch no empty grid. Short queries
    (``max_query_len`` <= 16: speculative-decode verification, small chunks after a long
    prefix) run with decode's block sizes and split-KV; ``num_splits`` is as in
    :func:`paged_decode_attention` (``None``: 1 for batches that fill the GPU anyway).
    """
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_cache_pair(k_cache, v_cache)
    check_query_vs_cache(q, k_cache)
    num_seqs = check_tensor("seq_lens", seq_lens, 1, (torch.int32,)).shape[0]
    _check_tables(num_seqs, block_tables, seq_lens)
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    if query_start_loc.shape[0] != num_seqs + 1:
        raise InvalidArgumentError(
            f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, "
            f"got {query_start_loc.shape[0]}"
        )
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise InvalidArgumentError("max_query_len must be an int")
    if max_query_len < 0 or (q.shape[0] > 0 and num_seqs > 0 and max_query_len == 0):
        raise InvalidArgumentError(
            f"max_query_len must be >= 1 when there are new tokens, got {max_query_len}"
        )
    check_attention_options(sliding_window, softcap, scale)
    check_scales(k_cache.dtype, k_scale, v_scale)
    _check_num_splits(num_splits)
    check_out(out, tuple(q.shape), q.dtype, q.device)
    check_same_device(
        q.device,
        INTERPRETED,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    plans = plan_prefill(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        max_query_len,
        out,
        scale=q.shape[2] ** -0.5 if scale is None else float(scale),
        sliding_window=sliding_window,
        softcap=float(softcap),
        k_scale=float(k_scale),
        v_scale=float(v_scale),
        num_splits=num_splits,
    )
    for launch in plans:
        launch.run()
    return out
