#!/usr/bin/env python
"""GPU benchmark of kvindex's paged-attention kernels. ~3-4 min on an H200.

On a CUDA machine, in order:

1. device facts (``nvidia-smi`` clocks, torch's device name);
2. the kernel tests, compiled (``pytest tests/kernels`` with ``TRITON_INTERPRET=0``);
3. the device's copy bandwidth (a large device-to-device ``copy_``; read + write bytes);
4. decode at batch {1, 8, 64, 256} x context {1K, 8K, 32K}, Llama-3-8B-like shapes (32 query
   heads, 8 KV heads, head_dim 128, bf16, block 16, pages scattered at random): kvindex's
   split-KV decode (heuristic split count, and 1 split) timed by CUDA-graph replay (which
   also proves the launchers never sync the host), achieved bandwidth (K+V + q/out + block
   tables bytes / time) as a fraction of the measured copy bandwidth, and torch's dense
   SDPA on the same data gathered densely (time and max abs difference);
5. one prefill-with-prefix point, 8 x (2048 cached + 512 new), in TFLOP/s, against SDPA
   with an explicit mask, and one store_kv point in GB/s.

Everything goes to ``--out`` (default ``benches/gpu_kernels.json``). ``--dry-run`` runs the
same code on the CPU with tiny shapes in Triton's interpreter (timings meaningless), to
check the script itself; ``tests/kernels/test_gpu_bench_dry_run.py`` does that in CI.
Needs kvindex installed with the ``kernels`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benches" / "gpu_kernels.json")
    p.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest tests/kernels")
    p.add_argument("--test-timeout", type=int, default=150, help="seconds for the tests")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Must be decided before kvindex.kernels (and its @triton.jit) is imported.
    os.environ["TRITON_INTERPRET"] = "1" if args.dry_run else "0"
    bench = Bench(dry_run=args.dry_run)
    report: dict[str, Any] = {"dry_run": args.dry_run, "device": bench.device_facts()}
    start = time.perf_counter()
    report["tests"] = run_kernel_tests(args.dry_run, args.skip_tests, args.test_timeout)
    copy_bw = bench.copy_bandwidth()
    report["copy_bandwidth_gbps"] = copy_bw / 1e9
    report["decode"] = bench.decode_grid(copy_bw)
    report["prefill"] = bench.prefill_point()
    report["store_kv"] = bench.store_kv_point()
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(report)
    ok = report["tests"].get("returncode", 0) == 0 and all(
        "error" not in d for d in report["decode"]
    )
    return 0 if ok else 1


def run_kernel_tests(dry_run: bool, skip: bool, timeout: int) -> dict[str, Any]:
    """The kernel test suite, compiled on the GPU (dry run: one interpreter test)."""
    if skip:
        return {"skipped": True}
    if dry_run:
        target = ["tests/kernels/test_paged_decode.py::test_out_argument_is_filled_and_returned"]
    else:
        target = ["tests/kernels"]
    env = dict(os.environ, TRITON_INTERPRET="1" if dry_run else "0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *target]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        return {"returncode": -1, "timeout_s": timeout, "tail": str(tail)}
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "summary": lines[-1] if lines else "",
        "tail": "\n".join(lines[-30:]) if proc.returncode else "",
    }


class Bench:
    """Shapes, timing and data builders for one device (CUDA, or CPU for the dry run)."""

    def __init__(self, dry_run: bool) -> None:
        import torch

        self.torch = torch
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        if not dry_run and not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --dry-run on a CPU-only machine")
        torch.manual_seed(0)
        if dry_run:
            self.hq, self.hkv, self.head_dim, self.block = 4, 2, 64, 16
            self.batches, self.contexts = [1, 3], [80]
        else:
            self.hq, self.hkv, self.head_dim, self.block = 32, 8, 128, 16
            self.batches, self.contexts = [1, 8, 64, 256], [1024, 8192, 32768]
        self.dtype = torch.bfloat16

    # -- facts and timing ------------------------------------------------------------

    def device_facts(self) -> dict[str, Any]:
        import triton

        facts: dict[str, Any] = {
            "torch": self.torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
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

    def time_ms(self, fn: Callable[[], Any]) -> float:
        """Median ms per call: CUDA-graph replay on a GPU, wall clock in the dry run."""
        if self.device.type == "cuda":
            import triton.testing

            return float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def copy_bandwidth(self) -> float:
        """Bytes/s of a large device copy (read + write)."""
        n = (2 * GIB if self.device.type == "cuda" else 16 * 2**20) // 2
        src = self.torch.empty(n, dtype=self.torch.float16, device=self.device).normal_()
        dst = self.torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src))
        return 2 * n * 2 / (ms / 1e3)

    # -- data ------------------------------------------------------------------------

    def paged(self, batch: int, ctx: int) -> dict[str, Any]:
        """bf16 K/V caches for ``batch`` sequences of ``ctx`` tokens in scattered pages."""
        torch = self.torch
        pages = -(-ctx // self.block)
        num_blocks = batch * pages + 1
        shape = (num_blocks, self.block, self.hkv, self.head_dim)
        k_cache = torch.empty(shape, dtype=self.dtype, device=self.device).normal_()
        v_cache = torch.empty(shape, dtype=self.dtype, device=self.device).normal_()
        perm = torch.randperm(num_blocks - 1, device=self.device)[: batch * pages] + 1
        tables = perm.view(batch, pages).to(torch.int32)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=self.device)
        return {"k_cache": k_cache, "v_cache": v_cache, "block_tables": tables,
                "seq_lens": seq_lens}  # fmt: skip

    def dense(self, kv: dict[str, Any], ctx: int) -> tuple[Any, Any]:
        """The same K/V gathered densely: ``[batch, Hkv, ctx, D]`` each."""
        tables = kv["block_tables"].long()
        batch = tables.shape[0]

        def gather(cache: Any) -> Any:
            flat = cache[tables].reshape(batch, -1, self.hkv, self.head_dim)[:, :ctx]
            return flat.transpose(1, 2).contiguous()

        return gather(kv["k_cache"]), gather(kv["v_cache"])

    def fits(self, batch: int, ctx: int) -> bool:
        if self.device.type != "cuda":
            return True
        need = 2 * 2 * batch * ctx * self.hkv * self.head_dim * 2  # paged + dense K and V
        free, _ = self.torch.cuda.mem_get_info(self.device)
        return need < 0.85 * free

    # -- measurements ----------------------------------------------------------------

    def decode_grid(self, copy_bw: float) -> list[dict[str, Any]]:
        rows = []
        for ctx in self.contexts:
            for batch in self.batches:
                row: dict[str, Any] = {"batch": batch, "context": ctx}
                if not self.fits(batch, ctx):
                    row["error"] = "skipped: not enough device memory"
                else:
                    try:
                        row |= self.decode_point(batch, ctx, copy_bw)
                    except Exception as exc:  # record it and go on with the grid
                        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                rows.append(row)
                if self.device.type == "cuda":
                    self.torch.cuda.empty_cache()
        return rows

    def decode_point(self, batch: int, ctx: int, copy_bw: float) -> dict[str, Any]:
        from kvindex.kernels import paged_decode_attention
        from kvindex.kernels._launch import default_num_splits

        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        kv = self.paged(batch, ctx)
        q = torch.randn(batch, self.hq, self.head_dim, dtype=self.dtype, device=self.device)
        out = torch.empty_like(q)
        args = (q, kv["k_cache"], kv["v_cache"], kv["block_tables"], kv["seq_lens"])
        max_ctx = kv["block_tables"].shape[1] * self.block
        splits = default_num_splits(batch * self.hkv, max_ctx, self.device)
        us = 1e3 * self.time_ms(lambda: paged_decode_attention(*args, out=out, num_splits=splits))
        us_1 = 1e3 * self.time_ms(lambda: paged_decode_attention(*args, out=out, num_splits=1))
        paged_decode_attention(*args, out=out, num_splits=splits)
        k, v = self.dense(kv, ctx)
        kv.clear()
        qd = q.unsqueeze(2)  # [B, Hq, 1, D]
        sdpa_us = 1e3 * self.time_ms(lambda: sdpa(qd, k, v, enable_gqa=True))
        ref = sdpa(qd, k, v, enable_gqa=True).squeeze(2)
        moved = (2 * k.numel() + 2 * q.numel()) * 2 + batch * (max_ctx // self.block) * 4
        fraction = moved / (us / 1e6) / copy_bw
        return {
            "num_splits": splits, "kvindex_us": us, "kvindex_1split_us": us_1,
            "sdpa_us": sdpa_us, "vs_sdpa": sdpa_us / us, "bytes": moved,
            "achieved_gbps": moved / (us / 1e6) / 1e9, "fraction_of_copy_bw": fraction,
            "meets_80pct_target": fraction >= 0.8,
            "max_abs_diff_vs_sdpa": float((out.float() - ref.float()).abs().max()),
        }  # fmt: skip

    def prefill_point(self) -> dict[str, Any]:
        """8 sequences x (cached prefix + new tokens) with causal attention over both."""
        from kvindex.kernels import paged_prefill_attention

        torch = self.torch
        batch, cached, new = (8, 2048, 512) if self.device.type == "cuda" else (2, 20, 12)
        ctx = cached + new
        kv = self.paged(batch, ctx)
        q = torch.randn(batch * new, self.hq, self.head_dim, dtype=self.dtype, device=self.device)
        qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=self.device)
        args = (q, kv["k_cache"], kv["v_cache"], kv["block_tables"], kv["seq_lens"], qsl, new)
        out = torch.empty_like(q)
        ms = self.time_ms(lambda: paged_prefill_attention(*args, out=out))
        keys = sum(cached + i + 1 for i in range(new)) * batch
        flops = 4 * self.hq * self.head_dim * keys
        k, v = self.dense(kv, ctx)
        qd = q.view(batch, new, self.hq, self.head_dim).transpose(1, 2)
        pos = torch.arange(ctx, device=self.device)
        mask = pos[None, :] <= (cached + torch.arange(new, device=self.device))[:, None]
        F = torch.nn.functional
        sdpa_ms = self.time_ms(
            lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, enable_gqa=True)
        )
        ref = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, enable_gqa=True)
        diff = (out.view(batch, new, self.hq, -1).transpose(1, 2).float() - ref.float()).abs()
        return {
            "batch": batch, "cached": cached, "new": new, "kvindex_us": ms * 1e3,
            "tflops": flops / (ms / 1e3) / 1e12, "sdpa_masked_us": sdpa_ms * 1e3,
            "max_abs_diff_vs_sdpa": float(diff.max()),
        }  # fmt: skip

    def store_kv_point(self) -> dict[str, Any]:
        from kvindex.kernels import store_kv

        torch = self.torch
        tokens = 8192 if self.device.type == "cuda" else 32
        kv = self.paged(1, tokens)
        key = torch.randn(tokens, self.hkv, self.head_dim, dtype=self.dtype, device=self.device)
        value = torch.randn_like(key)
        table = kv["block_tables"][0].long()
        offs = torch.arange(tokens, device=self.device)
        slots = table[offs // self.block] * self.block + offs % self.block
        ms = self.time_ms(lambda: store_kv(key, value, kv["k_cache"], kv["v_cache"], slots))
        moved = 4 * key.numel() * 2 + slots.numel() * 8
        return {"tokens": tokens, "us": ms * 1e3, "gbps": moved / (ms / 1e3) / 1e9}


def print_summary(report: dict[str, Any]) -> None:
    print(f"device: {report['device'].get('name')}  tests: {report['tests'].get('summary', '-')}")
    print(f"copy bandwidth: {report['copy_bandwidth_gbps']:.0f} GB/s")
    print(f"{'batch':>6} {'ctx':>6} {'splits':>6} {'us':>9} {'1split':>9} {'sdpa':>9} "
          f"{'GB/s':>7} {'%copy':>6} {'maxdiff':>8}")  # fmt: skip
    for r in report["decode"]:
        if "error" in r:
            print(f"{r['batch']:>6} {r['context']:>6}  {r['error']}")
            continue
        print(
            f"{r['batch']:>6} {r['context']:>6} {r['num_splits']:>6} {r['kvindex_us']:>9.1f} "
            f"{r['kvindex_1split_us']:>9.1f} {r['sdpa_us']:>9.1f} {r['achieved_gbps']:>7.0f} "
            f"{100 * r['fraction_of_copy_bw']:>5.1f}% {r['max_abs_diff_vs_sdpa']:>8.4f}"
        )
    p = report["prefill"]
    print(f"prefill {p['batch']}x({p['cached']}+{p['new']}): {p['kvindex_us']:.1f} us, "
          f"{p['tflops']:.1f} TFLOP/s (SDPA masked {p['sdpa_masked_us']:.1f} us)")  # fmt: skip
    s = report["store_kv"]
    print(f"store_kv {s['tokens']} tokens: {s['us']:.1f} us, {s['gbps']:.0f} GB/s")
    print(f"total {report['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
