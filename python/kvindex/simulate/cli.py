"""``kvindex simulate``: argument parsing and the run that prints, saves and plots a report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from kvindex.simulate.capacity import Capacity, parse_capacities
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.ledger import HitTally
from kvindex.simulate.progress import Progress
from kvindex.simulate.reference import replay_in_order, theoretical_max_hit_rate
from kvindex.simulate.report import SimulationReport, format_seeds, format_table, write_json
from kvindex.simulate.scheduler import RADIX_INSERT, RunResult, RunSpec, check_spec, simulate_run
from kvindex.simulate.workloads import Workload, chat_workload
from kvindex.sizing import ModelShape, SizingError, kv_budget_bytes, parse_bytes

__all__ = ["add_arguments", "main", "run"]

DESCRIPTION = """\
Replay a workload through kvindex's two prefix-index designs — the hash chain (vLLM's
chained block hashes) and the radix tree (SGLang) — at several block sizes and KV pool
capacities, and compare hit rates, tokens lost to block granularity and to the full-hit
rule, evictions, waits, peak blocks and the index's own CPU cost.

Scheduling model (continuous batching, one step = one forward pass):
  1. arrivals join the queue (trace: timestamp // --step-ms; chat follow-up turns: a
     think time after the previous turn finishes);
  2. every running request past its prefill decodes one token (one append_batch); if
     blocks run short the most recently admitted request is preempted (freed, re-queued at
     the front, later re-admitted with its output so far);
  3. admitted requests continue a chunked prefill within --max-batched-tokens;
  4. the queue head is admitted (first come, first served) while the step's token budget
     lasts and fewer than --max-running run: the cache hits its longest cached prefix and
     allocates the whole prompt; if blocks run short the head waits (counted) until the
     next step;
  5. the radix design inserts a prompt when its prefill completes (--radix-insert
     prefill, SGLang's cache_unfinished_req) or when the request finishes (finish);
  6. finished requests are freed; their blocks stay cached until evicted.
Every request must fit alone in the pool. Figures are exact and reproducible (same seed,
same numbers) except the measured µs, reported apart (JSON: "timing").
"""

EPILOG = """\
capacity values (comma-separated): inf; tokens 65536, 64k, 3M, 64Ki; blocks 4096blocks;
memory 40GiB / 80GB with --model-shape. Examples:
  kvindex simulate                                   # chat workload, default grid
  kvindex simulate --workload seeds                  # the seed notes' worked examples
  kvindex simulate --trace mooncake.jsonl --index hash_chain,radix,radix@1 --capacity 1M,3M,inf
  kvindex simulate --capacity 1GiB,4GiB --model-shape layers=32,kv_heads=8,head_dim=128,dtype=bf16
"""

_CHAT_BLOCK_SIZES = "1,16"
_TRACE_BLOCK_SIZES = "16"
_CHAT_CAPACITIES = "32k,64k,128k,inf"
_TRACE_CAPACITIES = "1M,3M,10M,inf"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``kvindex simulate``'s options to ``p``."""
    from kvindex import HASH_ALGOS, RADIX_POLICIES

    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        choices=("chat", "seeds"),
        default="chat",
        help="chat: seeded multi-tenant chat generator (default); seeds: the seed notes' "
        "worked examples",
    )
    w.add_argument("--trace", metavar="FILE", help="replay a Mooncake JSONL trace instead")
    w.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="chat: number of requests (default 1000); trace: keep the first N",
    )
    w.add_argument("--seed", type=int, default=0, help="chat generator seed (default 0)")
    w.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        help="trace: milliseconds per scheduler step (default 20)",
    )
    d = p.add_argument_group("designs and pool")
    d.add_argument(
        "--index",
        default="hash_chain,radix",
        metavar="LIST",
        help="designs, comma-separated: hash_chain, radix; DESIGN@BS runs one block size "
        "only (default hash_chain,radix)",
    )
    d.add_argument(
        "--block-size",
        metavar="LIST",
        help=f"block (page) sizes, comma-separated (default {_CHAT_BLOCK_SIZES}; "
        f"trace {_TRACE_BLOCK_SIZES})",
    )
    d.add_argument(
        "--hash", default="xxh3_128", choices=HASH_ALGOS, help="hash-chain algorithm (xxh3_128)"
    )
    d.add_argument(
        "--policy", default="lru", choices=RADIX_POLICIES, help="radix eviction policy (lru)"
    )
    d.add_argument(
        "--radix-insert",
        default="prefill",
        choices=RADIX_INSERT,
        help="when the radix design inserts a request (default prefill)",
    )
    d.add_argument(
        "--capacity",
        metavar="LIST",
        help=f"KV pool sizes (default {_CHAT_CAPACITIES}; trace {_TRACE_CAPACITIES})",
    )
    d.add_argument(
        "--model-shape",
        metavar="SHAPE",
        help="layers=L,kv_heads=H,head_dim=D[,dtype=bf16]: turns memory capacities into tokens",
    )
    b = p.add_argument_group("pool from an engine's memory budget (needs --model-shape)")
    b.add_argument(
        "--budget-rule",
        choices=("sglang", "vllm"),
        help="add the pool this rule leaves: sglang = fraction x GPU - weights; vllm = "
        "fraction x GPU - weights - activation peak - other",
    )
    b.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory, e.g. 80GiB")
    b.add_argument(
        "--memory-fraction",
        type=float,
        metavar="F",
        help="mem_fraction_static (sglang, required) / gpu_memory_utilization (vllm, 0.9)",
    )
    b.add_argument("--weights", metavar="SIZE", default="0", help="model weights, e.g. 16GiB")
    b.add_argument("--activation-peak", metavar="SIZE", default="0", help="vllm: profiled peak")
    b.add_argument("--other-memory", metavar="SIZE", default="0", help="vllm: non-torch memory")
    s = p.add_argument_group("scheduler")
    s.add_argument("--max-running", type=int, default=64, help="running requests (default 64)")
    s.add_argument(
        "--max-batched-tokens",
        type=int,
        default=8192,
        help="tokens computed per step (default 8192)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    o.add_argument(
        "--plot", metavar="PATH.png", help="plot hit rate against capacity (needs matplotlib)"
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar")


def _ints(text: str, what: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            v = int(part)
        except ValueError:
            raise SimulationError(f"bad {what} {part.strip()!r}: expected an integer") from None
        if v < 1:
            raise SimulationError(f"{what} must be >= 1, got {v}")
        if v not in out:
            out.append(v)
    if not out:
        raise SimulationError(f"no {what} given")
    return out


def _configs(index: str, block_sizes: list[int]) -> list[tuple[str, int]]:
    from kvindex.protocol import DESIGNS

    out: list[tuple[str, int]] = []
    for item in index.split(","):
        item = item.strip()
        if not item:
            continue
        design, _, bs = item.partition("@")
        design = design.strip()
        if design not in DESIGNS:
            raise SimulationError(
                f"unknown design {design!r}; expected one of {', '.join(DESIGNS)}"
            )
        for b in _ints(bs, "block size") if bs else block_sizes:
            if (design, b) not in out:
                out.append((design, b))
    if not out:
        raise SimulationError("no design given (--index)")
    return out


def _budget_capacity(args: argparse.Namespace, shape: ModelShape | None) -> Capacity | None:
    if args.budget_rule is None:
        if args.gpu_memory is not None:
            raise SimulationError("--gpu-memory needs --budget-rule sglang or vllm")
        return None
    if shape is None:
        raise SimulationError("--budget-rule needs --model-shape")
    if args.gpu_memory is None:
        raise SimulationError("--budget-rule needs --gpu-memory")
    budget = kv_budget_bytes(
        args.budget_rule,
        gpu_memory_bytes=parse_bytes(args.gpu_memory),
        fraction=args.memory_fraction,
        weight_bytes=parse_bytes(args.weights),
        activation_bytes=parse_bytes(args.activation_peak) if args.budget_rule == "vllm" else 0,
        other_bytes=parse_bytes(args.other_memory) if args.budget_rule == "vllm" else 0,
    )
    frac = args.memory_fraction if args.memory_fraction is not None else 0.9
    label = f"{args.budget_rule}({args.gpu_memory}x{frac:g}-{args.weights})"
    if budget < shape.bytes_per_token:
        raise SimulationError(f"the {label} budget ({budget:,} bytes) holds no token")
    return Capacity(label, "bytes", budget, shape.bytes_per_token)


def _run_seeds(args: argparse.Namespace) -> int:
    from kvindex.simulate.seeds import run_seeds

    rows = run_seeds()
    print(format_seeds(rows))
    if args.json:
        write_json(args.json, {"workload": "seeds", "examples": rows})
    if args.plot:
        raise SimulationError("--plot needs a capacity sweep; the seeds workload has none")
    return 0


def _load_workload(args: argparse.Namespace) -> Workload:
    if args.requests is not None and args.requests < 1:
        raise SimulationError(f"--requests must be >= 1, got {args.requests}")
    if args.trace:
        from kvindex.simulate.trace import read_mooncake_trace

        return read_mooncake_trace(args.trace, step_ms=args.step_ms, limit=args.requests)
    return chat_workload(args.requests or 1000, args.seed)


def run(args: argparse.Namespace) -> int:
    """Runs ``kvindex simulate`` for parsed ``args``; returns the exit status."""
    if args.plot:
        from kvindex.simulate.plot import plot_available

        plot_available()
    if args.workload == "seeds" and not args.trace:
        return _run_seeds(args)
    shape = ModelShape.parse(args.model_shape) if args.model_shape else None
    trace = bool(args.trace)
    block_sizes = _ints(
        args.block_size or (_TRACE_BLOCK_SIZES if trace else _CHAT_BLOCK_SIZES), "block size"
    )
    configs = _configs(args.index, block_sizes)
    capacities = parse_capacities(
        args.capacity or (_TRACE_CAPACITIES if trace else _CHAT_CAPACITIES), shape
    )
    extra = _budget_capacity(args, shape)
    if extra is not None and extra not in capacities:
        capacities.append(extra)
    workload = _load_workload(args)
    specs = [
        RunSpec(
            design,
            bs,
            cap,
            max_running=args.max_running,
            max_batched_tokens=args.max_batched_tokens,
            hash_algo=args.hash,
            policy=args.policy,
            radix_insert=args.radix_insert,
        )
        for design, bs in configs
        for cap in capacities
    ]
    for spec in specs:
        check_spec(workload, spec)

    n = len(workload)
    enabled = not args.quiet and sys.stderr.isatty()
    bar = Progress((len(specs) + len(configs) + 1) * n, enabled=enabled)
    try:
        bar.set_label("theoretical maximum (radix bs=1, inf, in order)")
        tmax = theoretical_max_hit_rate(workload, progress=bar.advance)
        ceilings: dict[tuple[str, int], HitTally] = {}
        for design, bs in configs:
            bar.set_label(f"ceiling {design} bs={bs}")
            kw: dict[str, Any] = {"algo": args.hash} if design == "hash_chain" else {}
            if design == "radix":
                kw["policy"] = args.policy
            ceilings[(design, bs)] = replay_in_order(
                workload, design, bs, losses=False, progress=bar.advance, **kw
            )
        runs: list[RunResult] = []
        for i, spec in enumerate(specs, 1):
            bar.set_label(f"run {i}/{len(specs)} {spec.label()}")
            runs.append(simulate_run(workload, spec, progress=bar.advance))
    finally:
        bar.close()

    rep = SimulationReport(
        workload.summary(),
        {
            "max_running": args.max_running,
            "max_batched_tokens": args.max_batched_tokens,
            "radix_insert": args.radix_insert,
            "policy": args.policy,
            "hash_algo": args.hash,
            "step_ms": args.step_ms if trace else None,
        },
        tmax,
        ceilings,
        runs,
        str(shape) if shape is not None else None,
        shape.bytes_per_token if shape is not None else None,
    )
    print(format_table(rep))
    if args.json:
        write_json(args.json, rep.as_dict())
    if args.plot:
        from kvindex.simulate.plot import plot_hit_rate

        plot_hit_rate(rep, args.plot)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "kvindex simulate") -> int:
    """Parses ``argv`` and runs; errors in the input print one line and return 2."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return guarded_run(args, prog)


def guarded_run(args: argparse.Namespace, prog: str = "kvindex simulate") -> int:
    """:func:`run`, with input errors printed as ``prog: error: ...`` (exit status 2)."""
    from kvindex.exceptions import KvIndexError

    try:
        return run(args)
    except (SimulationError, SizingError, KvIndexError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


# `--cluster W --route LIST` (W engines behind a router): kvindex/cluster/simulate.py.
__import__("kvindex.cluster.simulate", fromlist=["hook"]).hook(sys.modules[__name__])
