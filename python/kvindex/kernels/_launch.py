"""Kernel launch plans and the block-size tables (host side, no device syncs).

A :class:`KernelLaunch` is everything one kernel launch needs. The public launchers in
:mod:`kvindex.kernels.attention` build plans with the ``plan_*`` functions and run them;
``kernels/check_sm90.py`` builds the same plans from meta tensors and compiles them for
sm_90 instead, so it checks exactly the configurations the launchers choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from kvindex.kernels._decode import _decode_reduce_kernel, _paged_decode_kernel
from kvindex.kernels._prefill import _paged_prefill_kernel
from kvindex.kernels._store_kv import _store_kv_kernel

#: True when ``TRITON_INTERPRET=1`` was set before the jit modules were imported.
INTERPRETED: bool = not isinstance(_paged_decode_kernel, triton.runtime.JITFunction)

#: Query heads packed into the rows of one decode program (tl.dot needs M >= 16).
DECODE_BLOCK_H = 16
#: Most KV splits per sequence in split-KV decode.
MAX_SPLITS = 32
#: Fewest keys per split that the default heuristic creates.
MIN_SPLIT_TOKENS = 512
#: Tokens per store_kv program.
STORE_BLOCK_T = 32


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: ``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def run(self) -> None:
        if math.prod(self.grid) == 0:
            return
        self.kernel[self.grid](
            *self.args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages
        )


@dataclass(frozen=True)
class AttentionConfig:
    """Block sizes for one attention kernel: rows per program, keys per tile, warps."""

    block_rows: int
    tile_n: int
    num_warps: int
    num_stages: int = 2


def block_d(head_dim: int) -> int:
    """Head-dim tile: the next power of two (80 and 96 are padded to 128 and masked)."""
    return max(16, int(triton.next_power_of_2(head_dim)))


def decode_config(q_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int) -> AttentionConfig:
    """Decode block sizes; every choice is compiled for sm_90 by ``kernels/check_sm90.py``."""
    wide = block_d(head_dim) > 64
    if q_dtype == torch.float32:
        tile_n = 16 if cache_dtype == torch.float8_e4m3fn else 32
        return AttentionConfig(DECODE_BLOCK_H, tile_n, 8 if wide else 4)
    return AttentionConfig(DECODE_BLOCK_H, 64, 8 if wide else 4)


def prefill_config(
    q_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int
) -> AttentionConfig:
    """Prefill block sizes (rows = tokens x grouped heads); checked like ``decode_config``."""
    wide = block_d(head_dim) > 64
    if q_dtype == torch.float32:
        if cache_dtype == torch.float8_e4m3fn:  # the fp8 -> fp32 path needs more registers
            return AttentionConfig(16 if wide else 32, 16, 8 if wide else 4)
        return AttentionConfig(32, 32, 8 if wide else 4)
    return AttentionConfig(64, 32 if wide else 64, 8 if wide else 4)


def _compute_flags(q_dtype: torch.dtype, interpreted: bool) -> dict[str, Any]:
    # The interpreter computes bf16 arithmetic wrongly: upcast right after the loads there.
    # fp32 inputs get exact fp32 dots ("ieee"), not TF32.
    return {
        "COMPUTE_F32": interpreted and q_dtype == torch.bfloat16,
        "DOT_PRECISION": "ieee" if q_dtype == torch.float32 else "tf32",
    }


def default_num_splits(num_programs: int, max_context: int, device: torch.device) -> int:
    """Splits per sequence so that about two waves of programs cover the GPU."""
    if device.type == "cuda":
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        num_sms = 8
    wanted = -(-2 * num_sms // max(num_programs, 1))
    by_length = -(-max(max_context, 1) // MIN_SPLIT_TOKENS)
    return max(1, min(MAX_SPLITS, wanted, by_length))


def plan_store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
    interpreted: bool = INTERPRETED,
) -> list[KernelLaunch]:
    num_tokens, num_kv_heads, head_dim = key.shape
    block_size = k_cache.shape[1]
    args = (
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        num_tokens,
        head_dim,
        block_size.bit_length() - 1,
        float(k_scale),
        float(v_scale),
    )
    constexprs = {
        "BLOCK_T": STORE_BLOCK_T,
        "BLOCK_D": block_d(head_dim),
        "FP8_CACHE": k_cache.dtype == torch.float8_e4m3fn,
        # The interpreter's fp32 -> fp8 cast rounds wrongly: round in fp32 first there.
        "ROUND_FP8_IN_FP32": interpreted and k_cache.dtype == torch.float8_e4m3fn,
    }
    grid = (triton.cdiv(num_tokens, STORE_BLOCK_T), num_kv_heads)
    return [KernelLaunch(_store_kv_kernel, grid, args, constexprs, num_warps=4)]


def plan_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    num_splits: int | None,
    sliding_window: int,
    softcap: float,
    k_scale: float,
    v_scale: float,
    interpreted: bool = INTERPRETED,
) -> list[KernelLaunch]:
    num_seqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    cfg = decode_config(q.dtype, k_cache.dtype, head_dim)
    head_blocks = triton.cdiv(group, cfg.block_rows)
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        if sliding_window:
            max_context = min(max_context, sliding_window)
        programs = num_seqs * num_kv_heads * head_blocks
        num_splits = default_num_splits(programs, max_context, q.device)
    if num_splits > 1:
        part_out = torch.empty(
            (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            (num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
    else:  # unused by the kernel, but it needs valid pointers of the right type
        part_out = part_lse = torch.empty((1,), dtype=torch.float32, device=q.device)
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_lse,
        q.stride(0),
        q.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        group,
        head_blocks,
        head_dim,
        block_size.bit_length() - 1,
        num_splits,
        float(scale * k_scale),
        float(softcap),
        sliding_window,
        float(v_scale),
    )
    constexprs = {
        "BLOCK_H": cfg.block_rows,
        "BLOCK_D": block_d(head_dim),
        "TILE_N": cfg.tile_n,
        **_compute_flags(q.dtype, interpreted),
    }
    grid = (num_seqs, num_kv_heads * head_blocks, num_splits)
    launches = [
        KernelLaunch(_paged_decode_kernel, grid, args, constexprs, cfg.num_warps, cfg.num_stages)
    ]
    if num_splits > 1:
        reduce_args = (
            part_out,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            num_q_heads,
            head_dim,
            num_splits,
        )
        launches.append(
            KernelLaunch(
                _decode_reduce_kernel,
                (num_seqs, num_q_heads),
                reduce_args,
                {"BLOCK_D": block_d(head_dim)},
                num_warps=1 if head_dim <= 64 else 2,
            )
        )
    return launches


def plan_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    out: torch.Tensor,
    *,
    scale: float,
    sliding_window: int,
    softcap: float,
    k_scale: float,
    v_scale: float,
    interpreted: bool = INTERPRETED,
) -> list[KernelLaunch]:
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_seqs = seq_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    cfg = prefill_config(q.dtype, k_cache.dtype, head_dim)
    heads_per_prog = min(group, cfg.block_rows)
    head_blocks = triton.cdiv(group, heads_per_prog)
    tokens_per_prog = cfg.block_rows // heads_per_prog
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        q.stride(0),
        q.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        group,
        heads_per_prog,
        head_blocks,
        tokens_per_prog,
        head_dim,
        block_size.bit_length() - 1,
        float(scale * k_scale),
        float(softcap),
        sliding_window,
        float(v_scale),
    )
    constexprs = {
        "BLOCK_M": cfg.block_rows,
        "BLOCK_D": block_d(head_dim),
        "TILE_N": cfg.tile_n,
        **_compute_flags(q.dtype, interpreted),
    }
    grid = (triton.cdiv(max_query_len, tokens_per_prog), num_seqs, num_kv_heads * head_blocks)
    return [
        KernelLaunch(_paged_prefill_kernel, grid, args, constexprs, cfg.num_warps, cfg.num_stages)
    ]
