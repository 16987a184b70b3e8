#!/usr/bin/env python
"""Compile every kvindex kernel configuration for sm_90 (H100/H200) on a CPU-only machine.

Fails (exit 1) on a compile error or a register spill in any configuration. The
configurations are not listed by hand: the launchers' own planning functions
(``kvindex.kernels._launch.plan_*``) are called on meta tensors over the supported space
(dtypes x fp8 cache x head dims x GQA groups x page sizes x split counts), Triton's JIT
binder turns each plan into the exact signature / specialisation / options a GPU launch
would compile, duplicates are dropped, and each distinct one goes through
``triton.compile(..., target=GPUTarget("cuda", 90, 32))`` down to a cubin with the
``ptxas`` bundled in the triton wheel. ``cuobjdump --dump-resource-usage`` (also bundled)
then gives registers per thread and the spill stack (``STACK`` > 0 = spills), and
``--dump-sass`` whether the 16-bit attention kernels use tensor cores (HMMA / HGMMA; a
config without them also fails).

Usage: ``python kernels/sm90_compile_check.py [--verbose] [--json PATH]``; the kernels are imported
from whatever ``kvindex`` is installed (or on ``sys.path``).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

TARGET_ARCH = 90
WARP_SIZE = 32
ATTENTION_KERNELS = ("_paged_attention_kernel",)
#: sm_90 limits per SM: 32-bit registers, shared memory (bytes), warps, resident blocks.
SM90_REGS, SM90_SMEM, SM90_WARPS, SM90_BLOCKS = 65536, 228 * 1024, 64, 32
#: Shared memory the driver reserves per resident block on sm_90.
SM90_SMEM_PER_BLOCK = 1024


def programs_per_sm(regs: int, shared: int, num_warps: int) -> int:
    """Programs of this kernel one sm_90 SM holds at once (registers, shared memory, warps).

    Registers are allocated per warp in units of 256; shared memory per block plus the
    1 KiB the driver reserves.
    """
    regs_per_warp = -(-regs * WARP_SIZE // 256) * 256
    by_regs = SM90_REGS // (regs_per_warp * num_warps) if regs > 0 else SM90_BLOCKS
    by_smem = SM90_SMEM // (shared + SM90_SMEM_PER_BLOCK)
    by_warps = SM90_WARPS // num_warps
    return max(0, min(by_regs, by_smem, by_warps, SM90_BLOCKS))


@dataclass
class CompileResult:
    kernel: str
    config: str
    num_warps: int
    num_stages: int = 2
    #: Programs per SM the launch plan relies on, and what the compiled kernel achieves.
    programs_per_sm_floor: int = 1
    programs_per_sm: int = -1
    #: ``cp.async`` instructions in the PTX (the pipelined key loop's asynchronous loads).
    async_copies: int = -1
    needs_pipelining: bool = False
    regs: int = -1
    stack_bytes: int = -1
    shared_bytes: int = -1
    mma_instructions: int = -1
    needs_mma: bool = False
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Compiled, no spills, tensor cores where the dtype allows them, asynchronous
        (pipelined) loads where the plan asks for stages, and the claimed occupancy."""
        return (
            self.error is None
            and self.stack_bytes == 0
            and (self.mma_instructions > 0 or not self.needs_mma)
            and (self.async_copies > 0 or not self.needs_pipelining)
            and self.programs_per_sm >= self.programs_per_sm_floor
        )


def _load_jit_modules() -> dict[str, Any]:
    """Fresh, compilable copies of the jit functions, even if the interpreter is on.

    ``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so the jit modules (which hold
    nothing but jit code) are executed again from their files with it switched off.
    """
    import kvindex.kernels._paged_attention as attention_mod
    import kvindex.kernels._store_kv as store_mod

    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        kernels: dict[str, Any] = {}
        for mod in (attention_mod, store_mod):
            assert mod.__file__ is not None
            spec = importlib.util.spec_from_file_location(f"_sm90_{mod.__name__}", mod.__file__)
            assert spec is not None and spec.loader is not None
            fresh = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = fresh  # the jit decorator wants a real module
            spec.loader.exec_module(fresh)
            for name in dir(fresh):
                if name.startswith("_") and name.endswith("_kernel"):
                    kernels[name] = getattr(fresh, name)
        return kernels
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _space(full: bool) -> Iterator[tuple[tuple[Any, Any], int, tuple[int, int], int]]:
    """(dtype pair, head dim, (Hq, Hkv), page size) points; duplicate compiles are dropped.

    Head dims and page sizes reach the compiler only through the head-dim tile (the next
    power of two) and Triton's integer specialisations (== 1, multiple of 16), so these
    points cover every supported shape. Default (CI): every dtype pair at head dim 128 and
    page 16; bf16 and bf16 over fp8 at every tile (32, 64, 256); bf16 at head dim 120 (not
    a multiple of 16) and at page sizes 1 (constant-folded), 12 and 544 (not powers of two) and
    the largest. ``full``: every dtype pair at every tile, and the odd head dims
    (80, 96, 112, 120, 192) at every listed page size.
    """
    import torch

    from kvindex.kernels import _checks

    fp8 = _checks.FP8_DTYPE
    dtype_pairs = [(dt, dt) for dt in _checks.FLOAT_DTYPES] + [
        (dt, fp8) for dt in _checks.FLOAT_DTYPES
    ]
    bf16_pairs = [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, fp8)]
    pages = (1, 12, 544, _checks.MAX_BLOCK_SIZE)
    for pair in dtype_pairs:
        yield pair, 128, (32, 8), 16
    for pair, head_dim in itertools.product(dtype_pairs if full else bf16_pairs, (32, 64, 256)):
        yield pair, head_dim, (32, 8), 16
    odd_dims = (80, 96, 112, 120, 192) if full else (120,)
    odd_pairs = bf16_pairs if full else bf16_pairs[:1]
    for pair, head_dim, bs in itertools.product(odd_pairs, odd_dims, (16, *pages)):
        yield pair, head_dim, (12, 3), bs
    for pair, bs in itertools.product(odd_pairs, pages):
        yield pair, 128, (32, 1), bs


def iter_plans(full: bool = False) -> Iterator[tuple[str, Any]]:
    """(label, KernelLaunch) for the configuration space: decode, short and long prefill."""
    import torch

    from kvindex.kernels._launch import SHORT_QUERY_LEN, plan_decode, plan_prefill, plan_store_kv

    meta = torch.device("meta")
    for (q_dt, c_dt), head_dim, (hq, hkv), bs in _space(full):
        label = f"q={str(q_dt)[6:]} cache={str(c_dt)[6:]} D={head_dim} Hq/Hkv={hq}/{hkv} block={bs}"
        num_seqs, max_blocks, num_tokens = 4, 9, 40
        k_cache = torch.empty((64, bs, hkv, head_dim), dtype=c_dt, device=meta)
        v_cache = torch.empty_like(k_cache)
        tables = torch.empty((num_seqs, max_blocks), dtype=torch.int32, device=meta)
        seq_lens = torch.empty((num_seqs,), dtype=torch.int32, device=meta)
        scales = {"k_scale": 1.0, "v_scale": 1.0}
        opts: dict[str, Any] = {"scale": 0.1, "sliding_window": 0, "softcap": 0.0, **scales}
        q = torch.empty((num_seqs, hq, head_dim), dtype=q_dt, device=meta)
        for launch in plan_decode(
            q, k_cache, v_cache, tables, seq_lens, torch.empty_like(q),
            num_splits=4, interpreted=False, **opts,
        ):  # fmt: skip
            yield f"decode {label} splits=4", launch
        qp = torch.empty((num_tokens, hq, head_dim), dtype=q_dt, device=meta)
        qsl = torch.empty((num_seqs + 1,), dtype=torch.int32, device=meta)
        for kind, max_q in (("short-prefill", SHORT_QUERY_LEN), ("prefill", 4 * SHORT_QUERY_LEN)):
            for launch in plan_prefill(
                qp, k_cache, v_cache, tables, seq_lens, qsl, max_q, torch.empty_like(qp),
                num_splits=1, interpreted=False, **opts,
            ):  # fmt: skip
                yield f"{kind} {label}", launch
        key = torch.empty((num_tokens, hkv, head_dim), dtype=q_dt, device=meta)
        slots = torch.empty((num_tokens,), dtype=torch.int64, device=meta)
        for launch in plan_store_kv(key, key, k_cache, v_cache, slots, **scales, interpreted=False):
            yield f"store_kv {label}", launch


def _bind(jit_fn: Any, launch: Any, backend: Any) -> tuple[Any, dict[str, Any], Any, Any]:
    """What ``jit_fn[grid](*args, **kwargs)`` compiles: (options, signature, constexprs, attrs)."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(launch.constexprs)
    kwargs.update(num_warps=launch.num_warps, num_stages=launch.num_stages)
    kwargs["debug"] = False
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    return options, signature, constexprs, attrs


def _inspect_cubin(cubin: bytes, tools: Path) -> tuple[int, int, int]:
    """(registers per thread, stack bytes, tensor-core instructions) of a one-kernel cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage, sass = (
            subprocess.run(
                [str(tools / "cuobjdump"), flag, f.name], check=True, capture_output=True, text=True
            ).stdout
            for flag in ("--dump-resource-usage", "--dump-sass")
        )
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    if regs is None or stack is None:
        raise RuntimeError(f"cannot parse cuobjdump output:\n{usage}")
    mma = len(re.findall(r"\b(?:HMMA|HGMMA)\.", sass))
    return int(regs.group(1)), int(stack.group(1)), mma


@dataclass
class _Job:
    result: CompileResult
    jit_fn: Any
    bound: tuple[Any, dict[str, Any], Any, Any]


def _compile_job(job: _Job, target: Any, tools: Path) -> CompileResult:
    import triton
    from triton.compiler import ASTSource

    options, signature, constexprs, attrs = job.bound
    result = job.result
    start = time.perf_counter()
    try:
        src = ASTSource(job.jit_fn, signature, constexprs, attrs)
        compiled = triton.compile(src, target=target, options=options.__dict__)
        result.shared_bytes = int(compiled.metadata.shared)
        result.regs, result.stack_bytes, result.mma_instructions = _inspect_cubin(
            compiled.asm["cubin"], tools
        )
        result.async_copies = len(re.findall(r"\bcp\.async\.(?:ca|cg)\b", compiled.asm["ptx"]))
        result.programs_per_sm = programs_per_sm(result.regs, result.shared_bytes, result.num_warps)
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()] or [""]
        result.error = f"{type(exc).__name__}: {lines[-1][:300]}"
    result.seconds = time.perf_counter() - start
    return result


def run_check(
    verbose: bool = False, jobs: int = 2, only: str = "", full: bool = False
) -> list[CompileResult]:
    """Compiles every distinct configuration (``jobs`` at a time); one result per compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    target = GPUTarget("cuda", TARGET_ARCH, WARP_SIZE)
    backend = make_backend(target)
    jit_fns = _load_jit_modules()
    todo: dict[str, _Job] = {}
    for label, launch in iter_plans(full):
        if only not in label:
            continue
        name = launch.kernel.fn.__name__
        bound = _bind(jit_fns[name], launch, backend)
        options, signature, constexprs, attrs = bound
        key = repr((name, sorted(signature.items()), constexprs, attrs, options))
        if key not in todo:
            # 16-bit attention must run its dots on tensor cores (HMMA / HGMMA).
            tensor_cores = name in ATTENTION_KERNELS and signature["q_ptr"] != "*fp32"
            result = CompileResult(
                name,
                label,
                launch.num_warps,
                num_stages=launch.num_stages,
                programs_per_sm_floor=launch.programs_per_sm,
                needs_mma=tensor_cores,
                # A key loop planned with >= 2 stages must prefetch with cp.async.
                needs_pipelining=name in ATTENTION_KERNELS and launch.num_stages >= 2,
            )
            todo[key] = _Job(result, jit_fns[name], bound)
    results: list[CompileResult] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(_compile_job, todo.values(), repeat(target), repeat(tools)):
            results.append(result)
            if verbose:
                print(_format(result), flush=True)
    return results


def _format(r: CompileResult) -> str:
    if r.ok:
        status = "ok"
    elif r.error:
        status = f"ERROR {r.error}"
    elif r.stack_bytes:
        status = "SPILLS"
    elif r.needs_mma and r.mma_instructions <= 0:
        status = "NO TENSOR CORES"
    elif r.needs_pipelining and r.async_copies <= 0:
        status = "NOT PIPELINED"
    else:
        status = f"OCCUPANCY {r.programs_per_sm} < {r.programs_per_sm_floor} programs/SM"
    return (
        f"{r.kernel:<23} w={r.num_warps} st={r.num_stages} regs={r.regs:>3} "
        f"stack={r.stack_bytes:>4}B smem={r.shared_bytes:>6}B mma={r.mma_instructions:>3} "
        f"cp.async={r.async_copies:>3} progs/SM={r.programs_per_sm:>2}>={r.programs_per_sm_floor} "
        f"{r.seconds:5.1f}s  {status}  "
        f"[{r.config}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every configuration")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--only", default="", help="compile only labels containing this")
    parser.add_argument("--full", action="store_true", help="every dtype pair x tile x odd dim")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run_check(verbose=args.verbose, jobs=args.jobs, only=args.only, full=args.full)
    bad = [r for r in results if not r.ok]
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    for r in bad:
        print(_format(r))
    worst = max(results, key=lambda r: r.regs)
    print(
        f"sm_{TARGET_ARCH}: {len(results)} configurations compiled in "
        f"{time.perf_counter() - start:.1f}s; {len(bad)} failed; max regs {worst.regs} "
        f"({worst.kernel}, {worst.config})"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
