#!/usr/bin/env python
"""GPU benchmark of kvindex's paged-attention kernels: decode, multi-token decode, prefill.

Timings only; the correctness tests run separately (``benches/gpu_run.sh`` runs
``pytest tests/kernels`` compiled first), so a slow test cannot fail a run whose
measurements succeeded. Each point also records its max abs difference from a dense
reference, computed outside the timed region. On an H200 the whole script takes ~2-3 min.

1. device facts (``nvidia-smi`` clocks, SMs, L2 size);
2. the copy bandwidth (256 MiB and 1 GiB device-to-device copies timed by CUDA graph and
   by events, best kept; read + write bytes): the ceiling every bandwidth figure is a
   fraction of;
3. decode points, Llama-3-8B-like heads (32 query heads, 8 KV heads, head_dim 128): bf16 at
   block 16 over batch x context, block 1 (the radix cache's token-level tables), an fp8
   e4m3 cache, mixed context lengths, and multi-token queries (4 tokens per sequence,
   speculative-decode verification) through ``paged_prefill_attention``. Each is timed
   with the heuristic split count and with 1 split, and against torch's SDPA on the same
   K/V gathered densely with the GQA group folded into the query rows and no mask (so
   SDPA may take its flash path);
4. prefill: 8 x (2048 cached + 512 new) in TFLOP/s against SDPA with a lower-right causal
   bias, a mixed batch (one 2,048-token chunk and 255 decode rows), and store_kv in GB/s.

Timing: CUDA-graph replay (``triton.testing.do_bench_cudagraph``, median), which also
proves the launchers never sync the host. L2 is never a hidden cache: each point keeps
enough copies of its block tables (pointing at distinct pages) and dense tensors that one
rotation reads more than 2.5x the L2 size, and one timed call runs the whole rotation.
The bandwidth target (>= 85% of the copy bandwidth at block 16, >= 75% at block 1, bf16)
applies only to points with >= 1 GiB of K/V per call.

``--sweep decode,prefill`` times only the candidate configs (``SWEEP_DECODE`` over the whole
decode grid, with extra split counts at some points; ``SWEEP_PREFILL`` on the prefill point
and the mixed batch), each point's data built once, a line printed per measurement (~70 s
on an H200); it is how the launchers' defaults are chosen.

Everything goes to ``--out`` (default ``benches/gpu_kernels.json``). ``--dry-run`` runs the
same code on the CPU with tiny shapes in Triton's interpreter (timings meaningless), to
check the script itself; ``tests/kernels/test_gpu_bench_dry_run.py`` does that in CI.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
#: Fraction of the measured copy bandwidth decode must reach (block 16, block 1) on
#: points with at least TARGET_MIN_BYTES of K/V.
TARGET_BLOCK16, TARGET_BLOCK1, TARGET_MIN_BYTES = 0.85, 0.75, GIB
#: One timed rotation reads at least this many times the L2 size.
L2_ROTATION = 2.5
#: Decode configs timed against each other at 32 x 8K (bf16, head_dim 128, pages 16 and 1,
#: the heuristic split count and 3 and 4 splits), and fp8 ones at 64 x 8K:
#: (block_rows, tile_n, num_warps, num_stages, programs_per_sm as compiled for sm_90).
TUNE_CONFIGS = [(16, 32, 4, 2, 4), (16, 32, 2, 3, 4), (16, 64, 4, 2, 4), (16, 32, 4, 3, 3)]
TUNE_FP8_CONFIGS = [(16, 32, 4, 3, 3), (16, 64, 4, 2, 3), (16, 32, 8, 2, 2)]
#: ``--sweep``: candidate configs over the whole grid, by kind of point (the first of each
#: list is the default the sweep was written against; programs per SM as compiled for
#: sm_90, so the split heuristic sees what each config really fits).
SWEEP_DECODE = {
    "bf16": [(16, 32, 4, 2, 4), (16, 64, 4, 2, 4), (16, 64, 4, 3, 3), (16, 128, 4, 2, 2),
             (16, 64, 8, 2, 2)],
    "block1": [(16, 32, 2, 3, 4), (16, 64, 4, 2, 4), (16, 64, 2, 2, 4), (16, 128, 4, 2, 3),
               (16, 64, 4, 3, 3)],
    "fp8": [(16, 32, 4, 3, 3), (16, 64, 4, 2, 3), (16, 64, 4, 3, 2), (16, 128, 8, 2, 2)],
}  # fmt: skip
#: ``--sweep``: explicit split counts also timed (first two bf16 configs) at these points.
SWEEP_SPLITS = (4, 8)
SWEEP_PREFILL = [(64, 32, 8, 2, 1), (64, 32, 4, 2, 2), (64, 64, 4, 2, 2), (64, 64, 4, 3, 2),
                 (64, 64, 8, 2, 1), (64, 64, 8, 3, 1), (128, 32, 8, 2, 1), (128, 64, 8, 2, 1),
                 (128, 64, 8, 3, 1), (64, 128, 8, 2, 1)]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benches" / "gpu_kernels.json")
    p.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes")
    p.add_argument("--rep-ms", type=int, default=40, help="timed milliseconds per variant")
    p.add_argument("--sweep", default="", help="decode,prefill: time candidate configs only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Must be decided before kvindex.kernels (and its @triton.jit) is imported.
    os.environ["TRITON_INTERPRET"] = "1" if args.dry_run else "0"
    bench = Bench(dry_run=args.dry_run, rep_ms=args.rep_ms)
    start = time.perf_counter()
    report: dict[str, Any] = {"dry_run": args.dry_run, "device": bench.device_facts()}
    report["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    bench.warm_up()
    copy_bw = bench.copy_bandwidth()
    report["copy_bandwidth_gbps"] = copy_bw / 1e9
    if args.sweep:
        return run_sweep(bench, report, args.sweep.split(","), copy_bw, args.out, start)
    report["decode"] = [bench.run_point(p, copy_bw) for p in bench.decode_points()]
    # The ceiling again, after the GPU has been busy for a while: report both.
    report["copy_bandwidth_end_gbps"] = bench.copy_bandwidth() / 1e9
    report["copy_details"] = bench.copy_details
    report["prefill"] = bench.guarded(bench.prefill_point)
    report["mixed_batch"] = bench.guarded(bench.mixed_batch_point)
    report["store_kv"] = bench.guarded(bench.store_kv_point)
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(report)
    errors = [r for r in report["decode"] if "error" in r]
    errors += [r for k in ("prefill", "mixed_batch", "store_kv") if "error" in (r := report[k])]
    return 1 if errors else 0


@dataclass(frozen=True)
class DecodePoint:
    """One decode measurement: ``batch`` sequences, ``q_len`` new tokens each."""

    name: str
    batch: int
    context: int
    block: int = 16
    fp8: bool = False
    #: Context lengths drawn uniformly in [context // 16, context] instead of all equal.
    mixed: bool = False
    q_len: int = 1
    #: A decode config to try instead of the launcher's (block_rows, tile_n, num_warps,
    #: num_stages, programs_per_sm): the tuning sweep; such points time only kvindex.
    config: tuple[int, int, int, int, int] | None = None
    #: Split count for the sweep (None: the launcher's heuristic).
    splits: int | None = None


class Bench:
    """Shapes, timing and data builders for one device (CUDA, or CPU for the dry run)."""

    def __init__(self, dry_run: bool, rep_ms: int) -> None:
        import torch

        self.torch = torch
        self.dry_run = dry_run
        self.rep_ms = rep_ms
        self.device = torch.device("cpu" if dry_run else "cuda")
        if not dry_run and not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --dry-run on a CPU-only machine")
        torch.manual_seed(0)
        if dry_run:
            self.hq, self.hkv, self.head_dim = 4, 2, 64
            self.l2_bytes = 32 * 2**10
        else:
            self.hq, self.hkv, self.head_dim = 32, 8, 128
            self.l2_bytes = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        self.dtype = torch.bfloat16
        self.copy_details: list[dict[str, Any]] = []

    # -- facts and timing ------------------------------------------------------------

    def device_facts(self) -> dict[str, Any]:
        import triton

        facts: dict[str, Any] = {
            "torch": self.torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "l2_bytes": self.l2_bytes,
        }
        if self.device.type == "cuda":
            props = self.torch.cuda.get_device_properties(self.device)
            facts |= {"name": props.name, "sms": props.multi_processor_count,
                      "memory_gib": round(props.total_memory / GIB, 1)}  # fmt: skip
            try:
                smi = subprocess.run(
                    ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,driver_version",
                     "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=20,
                )  # fmt: skip
                facts["nvidia_smi"] = smi.stdout.strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                facts["nvidia_smi"] = f"unavailable: {exc}"
        else:
            facts["name"] = "cpu (dry run, Triton interpreter)"
        return facts

    def time_ms(self, fn: Callable[[], Any], calls: int = 1) -> float:
        """Median ms per call of ``fn`` (which makes ``calls`` calls): CUDA-graph replay."""
        if self.device.type == "cuda":
            import triton.testing

            fn()  # compile outside the graph capture
            self.torch.cuda.synchronize()
            ms = triton.testing.do_bench_cudagraph(fn, rep=self.rep_ms, return_mode="median")
            return float(ms) / calls
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3 / calls

    def copies(self, nbytes: int) -> int:
        """Copies of a ``nbytes`` working set one timed rotation must cycle through."""
        return max(1, math.ceil(L2_ROTATION * self.l2_bytes / max(nbytes, 1)))

    def guarded(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return fn()
        except Exception as exc:  # record it and go on
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            self.release()

    def release(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def warm_up(self, seconds: float = 1.0) -> None:
        """Keeps the GPU busy so that its clocks leave idle before the first measurement."""
        if self.device.type != "cuda":
            return
        a = self.torch.randn(4096, 4096, dtype=self.dtype, device=self.device)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                a @ a
            self.torch.cuda.synchronize()

    def copy_bandwidth(self) -> float:
        """Bytes/s of a large device copy (read + write): the best of two buffer sizes, each
        timed by CUDA-graph replay and by events around eager calls (``copy_details``)."""
        torch = self.torch
        sizes = (256 * 2**20, GIB) if self.device.type == "cuda" else (2**20,)
        best = 0.0
        for nbytes in sizes:
            src = torch.empty(nbytes // 4, dtype=torch.float32, device=self.device).normal_()
            copy = functools.partial(torch.empty_like(src).copy_, src)
            timings = {"graph": self.time_ms(copy)}
            if self.device.type == "cuda":
                import triton.testing

                timings["events"] = float(triton.testing.do_bench(copy, return_mode="median"))
            for how, ms in timings.items():
                rate = 2 * nbytes / (ms / 1e3)
                self.copy_details.append({"bytes": nbytes, "timing": how, "gbps": rate / 1e9})
                best = max(best, rate)
        return best

    # -- data ------------------------------------------------------------------------

    def paged(self, lens: list[int], block: int, fp8: bool, rotations: int) -> dict[str, Any]:
        """K/V for sequences of ``lens`` tokens, ``rotations`` tables over distinct pages."""
        torch = self.torch
        pages = [-(-n // block) for n in lens]
        width = max(pages)
        per_rotation = sum(pages)
        num_blocks = rotations * per_rotation + 1
        shape = (num_blocks, block, self.hkv, self.head_dim)
        k_cache = torch.empty(shape, dtype=self.dtype, device=self.device).normal_()
        v_cache = torch.empty(shape, dtype=self.dtype, device=self.device).normal_()
        if fp8:
            k_cache = k_cache.to(torch.float8_e4m3fn)
            v_cache = v_cache.to(torch.float8_e4m3fn)
        perm = (torch.randperm(num_blocks - 1, device=self.device) + 1).to(torch.int32)
        tables = []
        for r in range(rotations):
            table = torch.zeros((len(lens), width), dtype=torch.int32, device=self.device)
            mine = perm[r * per_rotation : (r + 1) * per_rotation]
            at = 0
            for i, n in enumerate(pages):
                table[i, :n] = mine[at : at + n]
                at += n
            tables.append(table)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
        return {"k_cache": k_cache, "v_cache": v_cache, "tables": tables, "seq_lens": seq_lens}

    def dense(self, kv: dict[str, Any], table: Any, ctx: int) -> tuple[Any, Any]:
        """One table's K/V gathered densely (bf16): ``[batch, Hkv, ctx, D]`` each."""
        tables = table.long()
        batch = tables.shape[0]

        def gather(cache: Any) -> Any:
            flat = cache[tables].reshape(batch, -1, self.hkv, self.head_dim)[:, :ctx]
            return flat.transpose(1, 2).to(self.dtype).contiguous()

        return gather(kv["k_cache"]), gather(kv["v_cache"])

    def sdpa_decode(self, q: Any, k: Any, v: Any) -> Any:
        """Decode by SDPA, GQA folded into query rows (``[B, Hkv, G*q_len, D]``), no mask."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        batch, q_len = q.shape[0], q.shape[1]
        group = self.hq // self.hkv
        rows = q.view(batch, q_len, self.hkv, group, self.head_dim).permute(0, 2, 3, 1, 4)
        rows = rows.reshape(batch, self.hkv, group * q_len, self.head_dim)
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(backends):
            return self.torch.nn.functional.scaled_dot_product_attention(rows, k, v)

    # -- decode ----------------------------------------------------------------------

    def decode_points(self) -> list[DecodePoint]:
        if self.dry_run:
            return [
                DecodePoint("bf16", 2, 80),
                DecodePoint("block1", 2, 40, block=1),
                DecodePoint("fp8", 2, 80, fp8=True),
                DecodePoint("mixed", 3, 96, mixed=True),
                DecodePoint("q_len4", 2, 80, q_len=4),
                DecodePoint("tune", 2, 80, config=TUNE_CONFIGS[1]),
            ]
        grid = [(1, 8192), (1, 65536), (8, 8192), (8, 32768), (32, 8192), (64, 2048),
                (64, 8192), (128, 2048), (256, 1024)]  # fmt: skip
        points = [DecodePoint("bf16", b, c) for b, c in grid]
        points += [DecodePoint("block1", b, c, block=1) for b, c in ((8, 32768), (32, 8192))]
        points += [DecodePoint("fp8", b, c, fp8=True) for b, c in ((8, 32768), (64, 8192))]
        points += [DecodePoint("mixed", b, c, mixed=True) for b, c in ((32, 16384), (64, 8192))]
        points += [DecodePoint("q_len4", b, c, q_len=4) for b, c in ((8, 32768), (32, 8192))]
        for block, config, splits in itertools.product((16, 1), TUNE_CONFIGS, (None, 3, 4)):
            points.append(DecodePoint("tune", 32, 8192, block, config=config, splits=splits))
        for config in TUNE_FP8_CONFIGS:
            points.append(DecodePoint("tune", 64, 8192, fp8=True, config=config))
        return points

    def run_point(self, point: DecodePoint, copy_bw: float) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": point.name, "batch": point.batch, "context": point.context,
                               "block": point.block, "q_len": point.q_len}  # fmt: skip
        from kvindex.kernels import _launch

        default_config = _launch.decode_config
        if point.config is not None:
            row["config"] = list(point.config)
            row["splits"] = point.splits
            config = _launch.AttentionConfig(*point.config)
            _launch.decode_config = lambda *_, **__: config
        try:
            row |= self.decode_point(point, copy_bw)
        except Exception as exc:  # record it and go on with the grid
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            _launch.decode_config = default_config
            self.release()
        return row

    def decode_setup(self, pt: DecodePoint) -> dict[str, Any]:
        """The point's K/V (``rotations`` tables), queries and ``call(r, splits)``."""
        from kvindex.kernels import paged_decode_attention, paged_prefill_attention

        torch = self.torch
        gen = torch.Generator().manual_seed(pt.batch * 7919 + pt.context)
        if pt.mixed:
            lo = max(pt.context // 16, pt.q_len)
            lens = torch.randint(lo, pt.context + 1, (pt.batch,), generator=gen).tolist()
        else:
            lens = [pt.context] * pt.batch
        elem = 1 if pt.fp8 else 2
        kv_bytes = 2 * sum(lens) * self.hkv * self.head_dim * elem
        rotations = self.copies(kv_bytes)
        kv = self.paged(lens, pt.block, pt.fp8, rotations)
        tokens = pt.batch * pt.q_len
        qs = [torch.randn(tokens, self.hq, self.head_dim, dtype=self.dtype, device=self.device)
              for _ in range(rotations)]  # fmt: skip
        out = torch.empty_like(qs[0])
        scales: dict[str, Any] = {"k_scale": 0.5, "v_scale": 0.25} if pt.fp8 else {}
        qsl = torch.arange(0, tokens + 1, pt.q_len, dtype=torch.int32, device=self.device)

        def call(r: int, splits: int | None) -> None:
            args = (qs[r], kv["k_cache"], kv["v_cache"], kv["tables"][r], kv["seq_lens"])
            if pt.q_len == 1:
                paged_decode_attention(*args, out=out, num_splits=splits, **scales)
            else:
                paged_prefill_attention(*args, qsl, pt.q_len, out=out, num_splits=splits, **scales)

        def rotation(splits: int | None) -> Callable[[], None]:
            def run() -> None:
                for r in range(rotations):
                    call(r, splits)

            return run

        return {"lens": lens, "kv_bytes": kv_bytes, "rotations": rotations, "kv": kv, "qs": qs,
                "out": out, "scales": scales, "qsl": qsl, "tokens": tokens, "call": call,
                "rotation": rotation}  # fmt: skip

    def decode_point(self, pt: DecodePoint, copy_bw: float) -> dict[str, Any]:
        from kvindex.kernels import _launch
        from kvindex.kernels.reference import ref_paged_prefill

        d = self.decode_setup(pt)
        lens, kv_bytes, rotations, kv, qs = (d["lens"], d["kv_bytes"], d["rotations"],
                                             d["kv"], d["qs"])  # fmt: skip
        out, scales, qsl, tokens, call, rotation = (
            d["out"], d["scales"], d["qsl"], d["tokens"], d["call"], d["rotation"]
        )  # fmt: skip
        us = 1e3 * self.time_ms(rotation(pt.splits), rotations)
        row: dict[str, Any] = {"kv_bytes": kv_bytes, "rotations": rotations, "kvindex_us": us}
        opts: dict[str, Any] = {"scale": 0.1, "sliding_window": 0, "softcap": 0.0}
        opts |= {"k_scale": 1.0, "v_scale": 1.0, "num_splits": pt.splits}
        tables = (qs[0], kv["k_cache"], kv["v_cache"], kv["tables"][0], kv["seq_lens"])
        if pt.q_len == 1:
            plan = _launch.plan_decode(*tables, out, **opts)
        else:
            plan = _launch.plan_prefill(*tables, qsl, pt.q_len, out, **opts)
        row["num_splits"] = plan[0].grid[2]
        if pt.config is not None:
            return row | {"achieved_gbps": kv_bytes / (us / 1e6) / 1e9,
                          "fraction_of_copy_bw": kv_bytes / (us / 1e6) / copy_bw}  # fmt: skip
        row["kvindex_1split_us"] = 1e3 * self.time_ms(rotation(1), rotations)
        # Correctness of this very call, outside the timed region.
        call(0, None)
        ref_lens = kv["seq_lens"]
        if self.device.type == "cuda" and pt.batch * max(lens) > 64 * 8192:
            sub = slice(0, 2)  # the fp32 oracle on a slice of the batch
        else:
            sub = slice(0, pt.batch)
        q_sub = qs[0][sub.start * pt.q_len : sub.stop * pt.q_len]
        ref = ref_paged_prefill(
            q_sub, kv["k_cache"], kv["v_cache"], kv["tables"][0][sub], ref_lens[sub],
            qsl[: sub.stop - sub.start + 1], **scales,
        )  # fmt: skip
        got = out[sub.start * pt.q_len : sub.stop * pt.q_len].float()
        row["max_abs_diff_vs_fp32"] = float((got - ref).abs().max())
        if not pt.mixed and not pt.fp8:
            dense = [self.dense(kv, kv["tables"][r], pt.context) for r in range(rotations)]
            q4 = [q.view(pt.batch, pt.q_len, self.hq, self.head_dim) for q in qs]
            if pt.q_len == 1:
                sdpa_us = 1e3 * self.time_ms(
                    lambda: [self.sdpa_decode(q4[r], *dense[r]) for r in range(rotations)],
                    rotations,
                )
                row["sdpa_us"] = sdpa_us
                row["vs_sdpa"] = sdpa_us / us
            del dense
        moved = (
            kv_bytes
            + 2 * tokens * self.hq * self.head_dim * 2
            + 4 * sum(-(-n // pt.block) for n in lens)
        )
        fraction = moved / (us / 1e6) / copy_bw
        target = TARGET_BLOCK1 if pt.block == 1 else TARGET_BLOCK16
        row |= {"bytes": moved, "achieved_gbps": moved / (us / 1e6) / 1e9,
                "fraction_of_copy_bw": fraction}  # fmt: skip
        if kv_bytes >= TARGET_MIN_BYTES and not pt.fp8 and not pt.mixed and pt.q_len == 1:
            row["target"] = target
            row["meets_target"] = fraction >= target
        return row

    # -- prefill and store -----------------------------------------------------------

    def prefill_shape(self) -> tuple[int, int, int]:
        """(batch, cached, new) of the prefill point."""
        return (8, 2048, 512) if self.device.type == "cuda" else (2, 20, 12)

    def prefill_args(self) -> tuple[Any, ...]:
        """``paged_prefill_attention``'s positional arguments for the prefill point."""
        torch = self.torch
        batch, cached, new = self.prefill_shape()
        kv = self.paged([cached + new] * batch, 16, False, 1)
        q = torch.randn(batch * new, self.hq, self.head_dim, dtype=self.dtype, device=self.device)
        qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=self.device)
        return (q, kv["k_cache"], kv["v_cache"], kv["tables"][0], kv["seq_lens"], qsl, new)

    def prefill_flops(self) -> int:
        batch, cached, new = self.prefill_shape()
        keys = sum(cached + i + 1 for i in range(new)) * batch
        return 4 * self.hq * self.head_dim * keys

    def prefill_point(self) -> dict[str, Any]:
        """8 sequences x (cached prefix + new tokens), causal over both."""
        from torch.nn.attention.bias import causal_lower_right

        from kvindex.kernels import paged_prefill_attention

        torch = self.torch
        batch, cached, new = self.prefill_shape()
        ctx = cached + new
        args = self.prefill_args()
        q, k_cache, table = args[0], args[1], args[3]
        kv = {"k_cache": k_cache, "v_cache": args[2]}
        out = torch.empty_like(q)
        ms = self.time_ms(lambda: paged_prefill_attention(*args, out=out))
        flops = self.prefill_flops()
        k, v = self.dense(kv, table, ctx)
        group = self.hq // self.hkv
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        qd = q.view(batch, new, self.hq, self.head_dim).transpose(1, 2)
        bias = causal_lower_right(new, ctx)
        F = torch.nn.functional
        sdpa_ms = self.time_ms(lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=bias))
        ref = F.scaled_dot_product_attention(qd, k, v, attn_mask=bias)
        diff = (out.view(batch, new, self.hq, -1).transpose(1, 2).float() - ref.float()).abs()
        return {
            "batch": batch, "cached": cached, "new": new, "kvindex_us": ms * 1e3,
            "tflops": flops / (ms / 1e3) / 1e12, "sdpa_causal_lower_right_us": sdpa_ms * 1e3,
            "vs_sdpa": sdpa_ms / ms, "max_abs_diff_vs_sdpa": float(diff.max()),
        }  # fmt: skip

    def mixed_batch_shape(self) -> tuple[int, int, int]:
        """(chunk, decode rows, their context) of the mixed-batch point."""
        return (2048, 255, 2048) if self.device.type == "cuda" else (24, 5, 20)

    def mixed_batch_args(self) -> tuple[Any, ...]:
        """``paged_prefill_attention``'s positional arguments for the mixed batch."""
        torch = self.torch
        chunk, rows, ctx = self.mixed_batch_shape()
        q_lens = [chunk] + [1] * rows
        kv = self.paged([chunk] + [ctx] * rows, 16, False, 1)
        q = torch.randn(sum(q_lens), self.hq, self.head_dim, dtype=self.dtype, device=self.device)
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        qsl = torch.tensor(starts, dtype=torch.int32, device=self.device)
        return (q, kv["k_cache"], kv["v_cache"], kv["tables"][0], kv["seq_lens"], qsl, chunk)

    def mixed_batch_point(self) -> dict[str, Any]:
        """One long chunk plus many decode rows in one prefill launch (flattened grid)."""
        from kvindex.kernels import paged_prefill_attention
        from kvindex.kernels.reference import ref_paged_prefill

        torch = self.torch
        chunk, rows, ctx = self.mixed_batch_shape()
        args = self.mixed_batch_args()
        q, table, qsl = args[0], args[3], args[5]
        kv = {"k_cache": args[1], "v_cache": args[2], "seq_lens": args[4]}
        out = torch.empty_like(q)
        ms = self.time_ms(lambda: paged_prefill_attention(*args, out=out))
        paged_prefill_attention(*args, out=out)
        ref = ref_paged_prefill(q[:chunk + 2], kv["k_cache"], kv["v_cache"], table[:3],
                                kv["seq_lens"][:3], qsl[:4])  # fmt: skip
        diff = float((out[: chunk + 2].float() - ref).abs().max())
        return {"chunk": chunk, "decode_rows": rows, "context": ctx, "kvindex_us": ms * 1e3,
                "max_abs_diff_vs_fp32": diff}  # fmt: skip

    # -- config sweep (--sweep) -----------------------------------------------------

    def sweep_decode_plan(self) -> list[tuple[DecodePoint, list[Any], tuple[int | None, ...]]]:
        """(point, configs, split counts): the decode grid with every candidate config."""
        if self.dry_run:
            return [
                (DecodePoint("bf16", 2, 80), SWEEP_DECODE["bf16"][:2], (None, 4)),
                (DecodePoint("block1", 2, 40, block=1), SWEEP_DECODE["block1"][1:2], (None,)),
            ]
        bf16, heur, more = SWEEP_DECODE["bf16"], (None,), (None, *SWEEP_SPLITS)
        split_points = {(64, 8192), (128, 2048), (256, 1024)}
        plan: list[tuple[DecodePoint, list[Any], tuple[int | None, ...]]] = []
        for b, c in ((1, 8192), (1, 65536), (8, 8192), (8, 32768), (32, 8192), (64, 2048),
                     (64, 8192), (128, 2048), (256, 1024)):  # fmt: skip
            plan.append((DecodePoint("bf16", b, c), bf16, heur))
            if (b, c) in split_points:
                plan.append((DecodePoint("bf16", b, c), bf16[:2], SWEEP_SPLITS))
        for b, c in ((8, 32768), (32, 8192)):
            plan.append((DecodePoint("block1", b, c, block=1), SWEEP_DECODE["block1"], heur))
            plan.append((DecodePoint("q_len4", b, c, q_len=4), bf16, heur))
        for b, c in ((8, 32768), (64, 8192)):
            plan.append((DecodePoint("fp8", b, c, fp8=True), SWEEP_DECODE["fp8"], heur))
        for b, c in ((32, 16384), (64, 8192)):
            plan.append((DecodePoint("mixed", b, c, mixed=True), bf16, more))
        plan.append((DecodePoint("q_len4", 32, 8192, q_len=4), bf16[:2], SWEEP_SPLITS))
        return plan

    def sweep_decode(self, copy_bw: float) -> list[dict[str, Any]]:
        from kvindex.kernels import _launch

        rows: list[dict[str, Any]] = []
        default_config = _launch.decode_config
        for pt, configs, splits_list in self.sweep_decode_plan():
            base = {"kind": pt.name, "batch": pt.batch, "context": pt.context,
                    "block": pt.block, "q_len": pt.q_len}  # fmt: skip
            try:
                d = self.decode_setup(pt)
            except Exception as exc:
                rows.append(base | {"error": f"{type(exc).__name__}: {exc}"[:300]})
                self.release()
                continue
            moved = (d["kv_bytes"] + 2 * d["tokens"] * self.hq * self.head_dim * 2
                     + 4 * sum(-(-n // pt.block) for n in d["lens"]))  # fmt: skip
            for config, splits in itertools.product(configs, splits_list):
                row = base | {"config": list(config), "splits": splits, "kv_bytes": d["kv_bytes"]}
                cfg = _launch.AttentionConfig(*config)
                _launch.decode_config = lambda *_, **__: cfg  # noqa: B023 (used at once)
                try:
                    us = 1e3 * self.time_ms(d["rotation"](splits), d["rotations"])
                    row |= {"num_splits": self.planned_splits(pt, d, splits), "kvindex_us": us,
                            "achieved_gbps": moved / (us / 1e6) / 1e9,
                            "fraction_of_copy_bw": moved / (us / 1e6) / copy_bw}  # fmt: skip
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                finally:
                    _launch.decode_config = default_config
                rows.append(row)
                print_sweep_row(row)
            del d
            self.release()
        return rows

    def planned_splits(self, pt: DecodePoint, d: dict[str, Any], splits: int | None) -> int:
        """The split count the launcher plans for this point (grid axis 2)."""
        from kvindex.kernels import _launch

        opts: dict[str, Any] = {"scale": 0.1, "sliding_window": 0, "softcap": 0.0,
                                "k_scale": 1.0, "v_scale": 1.0, "num_splits": splits}  # fmt: skip
        kv = d["kv"]
        tables = (d["qs"][0], kv["k_cache"], kv["v_cache"], kv["tables"][0], kv["seq_lens"])
        if pt.q_len == 1:
            plan = _launch.plan_decode(*tables, d["out"], **opts)
        else:
            plan = _launch.plan_prefill(*tables, d["qsl"], pt.q_len, d["out"], **opts)
        return int(plan[0].grid[2])

    def sweep_prefill(self) -> list[dict[str, Any]]:
        """Every prefill candidate on the prefill point (TFLOP/s) and the mixed batch."""
        from torch.nn.attention.bias import causal_lower_right

        from kvindex.kernels import _launch, paged_prefill_attention

        torch = self.torch
        configs = SWEEP_PREFILL if not self.dry_run else SWEEP_PREFILL[:2]
        rows: list[dict[str, Any]] = []
        batch, cached, new = self.prefill_shape()
        args = self.prefill_args()
        q, table = args[0], args[3]
        k, v = self.dense({"k_cache": args[1], "v_cache": args[2]}, table, cached + new)
        group = self.hq // self.hkv
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        qd = q.view(batch, new, self.hq, self.head_dim).transpose(1, 2)
        bias = causal_lower_right(new, cached + new)
        F = torch.nn.functional
        sdpa_us = 1e3 * self.time_ms(
            lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=bias)
        )
        ref = F.scaled_dot_product_attention(qd, k, v, attn_mask=bias)
        ref = ref.transpose(1, 2).reshape(batch * new, self.hq, self.head_dim).float()
        mixed = self.mixed_batch_args()
        outs = (torch.empty_like(q), torch.empty_like(mixed[0]))
        default_config = _launch.prefill_config
        for config in configs:
            row: dict[str, Any] = {"kind": "prefill", "config": list(config), "sdpa_us": sdpa_us}
            cfg = _launch.AttentionConfig(*config)
            _launch.prefill_config = lambda *_, **__: cfg  # noqa: B023 (used at once)
            try:
                us = 1e3 * self.time_ms(lambda: paged_prefill_attention(*args, out=outs[0]))
                paged_prefill_attention(*args, out=outs[0])
                mixed_us = 1e3 * self.time_ms(lambda: paged_prefill_attention(*mixed, out=outs[1]))
                row |= {"kvindex_us": us, "tflops": self.prefill_flops() / (us / 1e6) / 1e12,
                        "vs_sdpa": sdpa_us / us, "mixed_batch_us": mixed_us,
                        "max_abs_diff_vs_sdpa": float((outs[0].float() - ref).abs().max()),
                        }  # fmt: skip
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                _launch.prefill_config = default_config
            rows.append(row)
            print_sweep_row(row)
        self.release()
        return rows

    def store_kv_point(self) -> dict[str, Any]:
        from kvindex.kernels import store_kv

        torch = self.torch
        tokens = 8192 if self.device.type == "cuda" else 32
        kv = self.paged([tokens], 16, False, 1)
        key = torch.randn(tokens, self.hkv, self.head_dim, dtype=self.dtype, device=self.device)
        value = torch.randn_like(key)
        table = kv["tables"][0][0].long()
        offs = torch.arange(tokens, device=self.device)
        slots = table[offs // 16] * 16 + offs % 16
        ms = self.time_ms(lambda: store_kv(key, value, kv["k_cache"], kv["v_cache"], slots))
        moved = 4 * key.numel() * 2 + slots.numel() * 8
        return {"tokens": tokens, "us": ms * 1e3, "gbps": moved / (ms / 1e3) / 1e9}


def run_sweep(
    bench: Bench,
    report: dict[str, Any],
    parts: list[str],
    copy_bw: float,
    out: Path,
    start: float,
) -> int:
    """``--sweep``: every candidate config over the whole grid; the JSON is rewritten after
    each part, so a run cut short keeps what it measured."""
    report["sweep"] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    for part in parts:
        rows = bench.sweep_decode(copy_bw) if part == "decode" else bench.sweep_prefill()
        report["sweep"][part] = rows
        report["seconds"] = round(time.perf_counter() - start, 1)
        out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"sweep total {report['seconds']} s")
    return 1 if any("error" in r for rows in report["sweep"].values() for r in rows) else 0


def print_sweep_row(r: dict[str, Any]) -> None:
    if r["kind"] == "prefill":
        head = f"prefill cfg={r['config']}"
        if "error" in r:
            print(f"{head} {r['error']}", flush=True)
            return
        print(f"{head} {r['kvindex_us']:8.1f} us {r['tflops']:6.1f} TFLOP/s sdpa "
              f"{r['sdpa_us']:7.1f} us ({r['vs_sdpa']:.2f}x) mixed {r['mixed_batch_us']:8.1f} us "
              f"maxdiff {r['max_abs_diff_vs_sdpa']:.4f}", flush=True)  # fmt: skip
        return
    head = (f"{r['kind']:>6} {r['batch']:>4} {r['context']:>6} {r['block']:>3} "
            f"cfg={r['config']} splits={r['splits'] or 'auto'}")  # fmt: skip
    if "error" in r:
        print(f"{head} {r['error']}", flush=True)
        return
    print(f"{head} -> {r['num_splits']:>2} {r['kvindex_us']:8.1f} us {r['achieved_gbps']:6.0f} "
          f"GB/s {100 * r['fraction_of_copy_bw']:5.1f}%", flush=True)  # fmt: skip


def print_summary(report: dict[str, Any]) -> None:
    dev = report["device"]
    print(f"device: {dev.get('name')}  L2 {dev['l2_bytes'] / 2**20:.0f} MiB  "
          f"smi: {dev.get('nvidia_smi', '-')}")  # fmt: skip
    print(f"copy bandwidth: {report['copy_bandwidth_gbps']:.0f} GB/s (start), "
          f"{report['copy_bandwidth_end_gbps']:.0f} GB/s (end)")  # fmt: skip
    print(f"{'kind':>7} {'batch':>5} {'ctx':>6} {'blk':>3} {'KV MiB':>7} {'split':>5} "
          f"{'us':>8} {'1split':>8} {'sdpa':>8} {'GB/s':>6} {'%copy':>6} {'target':>7} "
          f"{'maxdiff':>8}")  # fmt: skip
    for r in report["decode"]:
        head = f"{r['kind']:>7} {r['batch']:>5} {r['context']:>6} {r['block']:>3}"
        if "config" in r:
            head += f" cfg={r['config']} splits={r.get('splits') or 'auto'}"
        if "error" in r:
            print(f"{head}  {r['error']}")
            continue
        target = "-" if "target" not in r else ("MET" if r["meets_target"] else "MISSED")
        print(
            f"{head} {r['kv_bytes'] / 2**20:>7.0f} {r['num_splits']:>5} {r['kvindex_us']:>8.1f} "
            f"{r.get('kvindex_1split_us', float('nan')):>8.1f} "
            f"{r.get('sdpa_us', float('nan')):>8.1f} {r['achieved_gbps']:>6.0f} "
            f"{100 * r['fraction_of_copy_bw']:>5.1f}% {target:>7} "
            f"{r.get('max_abs_diff_vs_fp32', float('nan')):>8.4f}"
        )
    p = report["prefill"]
    if "error" in p:
        print(f"prefill: {p['error']}")
    else:
        print(f"prefill {p['batch']}x({p['cached']}+{p['new']}): {p['kvindex_us']:.1f} us, "
              f"{p['tflops']:.1f} TFLOP/s (SDPA lower-right causal "
              f"{p['sdpa_causal_lower_right_us']:.1f} us), maxdiff "
              f"{p['max_abs_diff_vs_sdpa']:.4f}")  # fmt: skip
    m = report["mixed_batch"]
    if "error" in m:
        print(f"mixed batch: {m['error']}")
    else:
        print(f"mixed batch ({m['chunk']}-token chunk + {m['decode_rows']} decode rows of "
              f"{m['context']}): {m['kvindex_us']:.1f} us, maxdiff "
              f"{m['max_abs_diff_vs_fp32']:.4f}")  # fmt: skip
    s = report["store_kv"]
    if "error" in s:
        print(f"store_kv: {s['error']}")
    else:
        print(f"store_kv {s['tokens']} tokens: {s['us']:.1f} us, {s['gbps']:.0f} GB/s")
    print(f"total {report['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
