"""Kernel launch plans and the block-size tables (host side, no device syncs).

A :class:`KernelLaunch` is everything one kernel launch needs. The public launchers in
:mod:`kvindex.kernels.attention` build plans with the ``plan_*`` functions and run them;
``kernels/sm90_compile_check.py`` builds the same plans from meta tensors and compiles them for
sm_90 instead, so it checks exactly the configurations the launchers choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from kvindex.kernels._paged_attention import _merge_splits_kernel, _paged_attention_kernel
from kvindex.kernels._store_kv import _store_kv_kernel

#: True when ``TRITON_INTERPRET=1`` was set before the jit modules were imported.
INTERPRETED: bool = not isinstance(_paged_attention_kernel, triton.runtime.JITFunction)

#: Most KV splits per query block in split-KV attention.
MAX_SPLITS = 64
#: Fewest keys per split that the default heuristic creates.
MIN_SPLIT_TOKENS = 256
#: Keys per split the heuristic still goes down to when more splits fill the waves as well
#: (mixed lengths: a long sequence's splits then spread over more SMs).
BALANCE_SPLIT_TOKENS = 2048
#: Tokens per store_kv program.
STORE_BLOCK_T = 32
#: Streaming multiprocessors assumed when the tensors are not on a CUDA device.
DEFAULT_SMS = 132


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: ``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    #: Programs of this launch that must fit on one SM at once (checked for sm_90).
    programs_per_sm: int = 1

    def run(self) -> None:
        if math.prod(self.grid) == 0:
            return
        self.kernel[self.grid](
            *self.args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages
        )


@dataclass(frozen=True)
class AttentionConfig:
    """Block sizes for one attention launch.

    ``block_rows`` query rows (tokens x grouped heads) per program, ``tile_n`` keys per
    inner iteration, ``num_warps``, ``num_stages`` (software-pipelining depth of the key
    loop) and ``programs_per_sm``: how many programs the compiled kernel fits on one sm_90
    SM (registers and shared memory). ``kernels/sm90_compile_check.py`` compiles every config and
    fails if one fits fewer programs than it claims; the split-count heuristic relies on it.
    """

    block_rows: int
    tile_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int


def block_d(head_dim: int) -> int:
    """Head-dim tile: the next power of two (80, 96, 112, 120 ... are padded and masked)."""
    return max(16, int(triton.next_power_of_2(head_dim)))


def decode_config(
    q_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    block_size: int = 16,
    short_queries: bool = False,
) -> AttentionConfig:
    """Decode (and short-query) block sizes, by dtype, head-dim tile, alignment and page size.

    16 rows (the GQA group packed into ``tl.dot``'s M); 2 or 3 pipeline stages, so the next
    tile's page ids and K/V are loaded asynchronously while the current tile is computed,
    with several programs per SM. ``short_queries``: the config serves queries of up to
    ``SHORT_QUERY_LEN`` tokens (the prefill path's kernel); it, like page sizes that are
    not powers of two (a division per key), fits fewer programs per SM. Head dims that are
    not a multiple of 16 cannot use 16-byte asynchronous copies and run unpipelined
    (1 stage) with small tiles. Every choice is compiled for sm_90 by
    ``kernels/sm90_compile_check.py``, which fails when a config spills, loses its pipelined
    loads or fits fewer programs per SM than ``programs_per_sm`` says; the 16-bit
    head-dim-128 choice (64-key tiles, 4 warps, 2 stages at every page size) comes from the
    H200 sweep over the whole decode grid (``benches/gpu_kernels.py --sweep decode``).
    """
    bd = block_d(head_dim)
    fp8 = cache_dtype == torch.float8_e4m3fn
    if head_dim % 16:
        return AttentionConfig(16, 16, 4, 1, 2)
    if q_dtype == torch.float32:  # fp32 queries: correctness first, small unpipelined tiles
        if bd >= 256 or fp8:
            return AttentionConfig(16, 16, 8, 1, 1)
        return AttentionConfig(16, 16, 4, 2, 2)
    if bd >= 256:
        return AttentionConfig(16, 16, 8, 2, 1) if fp8 else AttentionConfig(16, 16, 4, 2, 2)
    if bd == 128:
        if fp8:
            return AttentionConfig(16, 32, 4, 3, 3)
        pow2_pages = block_size & (block_size - 1) == 0
        return AttentionConfig(16, 64, 4, 2, 4 if pow2_pages and not short_queries else 3)
    return AttentionConfig(16, 16 if fp8 else 64, 4, 3, 4)


def prefill_config(
    q_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int
) -> AttentionConfig:
    """Prefill block sizes (rows = tokens x grouped heads); checked like ``decode_config``."""
    bd = block_d(head_dim)
    wide = bd > 64
    if head_dim % 16:
        return AttentionConfig(16, 16, 4, 1, 1)
    if q_dtype == torch.float32:
        if cache_dtype == torch.float8_e4m3fn or bd >= 256:
            return AttentionConfig(16 if wide else 32, 16, 8 if wide else 4, 1, 1)
        return AttentionConfig(32, 32, 8 if wide else 4, 2, 1)
    if bd >= 256:
        return AttentionConfig(32, 32, 8, 2, 1)
    if wide and cache_dtype == torch.float8_e4m3fn:  # not swept with 64-key tiles
        return AttentionConfig(64, 32, 8, 2, 1)
    # 64 rows x 64 keys on one warpgroup (wgmma's M = 64): the H200 prefill sweep's best at
    # head dim 128 (1.4x the 64 x 32, 8-warp tile).
    return AttentionConfig(64, 64, 4, 2, 2 if wide else 1)


def _compute_flags(q_dtype: torch.dtype, interpreted: bool) -> dict[str, Any]:
    # The interpreter computes bf16 arithmetic wrongly: upcast right after the loads there.
    # fp32 inputs get exact fp32 dots ("ieee"), not TF32.
    return {
        "COMPUTE_F32": interpreted and q_dtype == torch.bfloat16,
        "DOT_PRECISION": "ieee" if q_dtype == torch.float32 else "tf32",
    }


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return DEFAULT_SMS


def default_num_splits(
    num_programs: int, max_context: int, programs_per_sm: int, sms: int, tile_n: int
) -> int:
    """Splits per query block that fill the GPU's waves evenly.

    ``num_programs`` programs without splitting; the GPU runs ``sms * programs_per_sm`` at
    once (one wave). A launch of ``n`` programs takes ``ceil(n / slots)`` waves, and the
    last one is idle where it is not full: the count picked is the one with the fullest
    waves (the smallest such count, a larger one only when it fills 5% more of them), at
    most one split per ``MIN_SPLIT_TOKENS`` keys of the widest table row; then the largest
    count that fills the waves as well with splits of at least ``BALANCE_SPLIT_TOKENS``
    keys. In the kernel each sequence uses only as many splits as its real length needs
    (``min_split_tiles``), so short sequences in a batch of long ones skip the long ones'
    splits, and long ones spread over more SMs (on the H200, mixed lengths at 64 x 8K:
    362 -> 293 us; equal lengths cost 1%).
    """
    slots = max(1, sms * programs_per_sm)
    programs = max(num_programs, 1)
    context = max(max_context, 1)
    by_width = -(-context // max(MIN_SPLIT_TOKENS, tile_n))

    def fill(splits: int) -> float:
        total = programs * splits
        return total / (-(-total // slots) * slots)

    best, best_fill = 1, 0.0
    for splits in range(1, max(1, min(MAX_SPLITS, by_width)) + 1):
        if fill(splits) > best_fill * 1.05:
            best, best_fill = splits, fill(splits)
    balanced = best
    for splits in range(best + 1, min(MAX_SPLITS, by_width, context // BALANCE_SPLIT_TOKENS) + 1):
        if fill(splits) >= best_fill * 0.99:
            balanced = splits
    return balanced


def _attention_launches(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    cfg: AttentionConfig,
    *,
    unit_queries: bool,
    max_query_len: int,
    scale: float,
    num_splits: int | None,
    sliding_window: int,
    softcap: float,
    k_scale: float,
    v_scale: float,
    interpreted: bool,
) -> list[KernelLaunch]:
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    heads_per_prog = min(group, cfg.block_rows)
    head_blocks = triton.cdiv(group, heads_per_prog)
    tokens_per_prog = cfg.block_rows // heads_per_prog
    if unit_queries:
        tokens_per_prog = 1
        q_blocks = num_seqs
    else:
        # Enough for every sequence's query blocks (see the kernel's docstring).
        q_blocks = num_tokens // tokens_per_prog + num_seqs
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        if sliding_window:
            max_context = min(max_context, sliding_window + max(max_query_len, 1))
        # Programs with work: with every query in one block (max_query_len <= tokens per
        # program), one per sequence, however many spare ones axis 0 launches.
        busy = num_seqs if max_query_len <= tokens_per_prog else q_blocks
        programs = busy * num_kv_heads * head_blocks
        num_splits = default_num_splits(
            programs, max_context, cfg.programs_per_sm, num_sms(q.device), cfg.tile_n
        )
    if num_splits > 1:
        part_out = torch.empty(
            (num_tokens, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            (num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
    else:  # unused by the kernel, but it needs valid pointers of the right type
        part_out = part_lse = torch.empty((1,), dtype=torch.float32, device=q.device)
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
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
        num_seqs,
        max(num_seqs - 1, 0).bit_length(),
        num_q_heads,
        group,
        heads_per_prog,
        head_blocks,
        tokens_per_prog,
        head_dim,
        block_size,
        block_size.bit_length() - 1,
        num_splits,
        max(1, MIN_SPLIT_TOKENS // cfg.tile_n),
        float(scale * k_scale),
        float(softcap),
        sliding_window,
        float(v_scale),
    )
    constexprs = {
        # Long queries: most tiles lie wholly before the diagonal and run without masks.
        "MASK_FREE_TILES": max_query_len > SHORT_QUERY_LEN,
        "BLOCK_M": cfg.block_rows,
        "BLOCK_D": block_d(head_dim),
        "TILE_N": cfg.tile_n,
        "UNIT_QUERIES": unit_queries,
        "POW2_PAGES": (block_size & (block_size - 1)) == 0,
        **_compute_flags(q.dtype, interpreted),
    }
    grid = (q_blocks, num_kv_heads * head_blocks, num_splits)
    launches = [
        KernelLaunch(
            _paged_attention_kernel,
            grid,
            args,
            constexprs,
            cfg.num_warps,
            cfg.num_stages,
            cfg.programs_per_sm,
        )
    ]
    if num_splits > 1:
        merge_args = (
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
                _merge_splits_kernel,
                (num_tokens, num_q_heads),
                merge_args,
                {"BLOCK_D": block_d(head_dim)},
                num_warps=1 if head_dim <= 64 else 2,
            )
        )
    return launches


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
    # Head dims that are not a multiple of 16 load element by element: fewer tokens then.
    block_t = STORE_BLOCK_T if head_dim % 16 == 0 else STORE_BLOCK_T // 4
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
        block_size,
        float(k_scale),
        float(v_scale),
    )
    constexprs = {
        "BLOCK_T": block_t,
        "BLOCK_D": block_d(head_dim),
        "FP8_CACHE": k_cache.dtype == torch.float8_e4m3fn,
        # The interpreter's fp32 -> fp8 cast rounds wrongly: round in fp32 first there.
        "ROUND_FP8_IN_FP32": interpreted and k_cache.dtype == torch.float8_e4m3fn,
    }
    grid = (triton.cdiv(num_tokens, block_t), num_kv_heads)
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
    """One query token per sequence; ``seq_lens`` stands in for the unused start offsets."""
    cfg = decode_config(q.dtype, k_cache.dtype, q.shape[2], k_cache.shape[1])
    return _attention_launches(
        q, k_cache, v_cache, block_tables, seq_lens, seq_lens, out, cfg,
        unit_queries=True, max_query_len=1, scale=scale, num_splits=num_splits,
        sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale,
        interpreted=interpreted,
    )  # fmt: skip


#: Largest ``max_query_len`` that runs with the decode configuration (split-KV, pipelined):
#: speculative-decode verification and small chunks after a long prefix.
SHORT_QUERY_LEN = 16


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
    num_splits: int | None = None,
    interpreted: bool = INTERPRETED,
) -> list[KernelLaunch]:
    """Varlen new tokens; short queries use the decode configuration, any length splits."""
    if max_query_len <= SHORT_QUERY_LEN:
        cfg = decode_config(q.dtype, k_cache.dtype, q.shape[2], k_cache.shape[1], True)
    else:
        cfg = prefill_config(q.dtype, k_cache.dtype, q.shape[2])
    return _attention_launches(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, cfg,
        unit_queries=False, max_query_len=max_query_len, scale=scale, num_splits=num_splits,
        sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale,
        interpreted=interpreted,
    )  # fmt: skip
