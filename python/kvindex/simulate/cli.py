"""``kvindex simulate``: argument parsing and the run that prints, saves and plots a report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any, cast

from kvindex.simulate.capacity import Capacity, parse_capacities
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.ledger import HitTally
from kvindex.simulate.options import parse_designs, parse_ints
from kvindex.simulate.outputs import check_output_path, check_plot_path
from kvindex.simulate.progress import Progress
from kvindex.simulate.report import (
    DEFAULT_WIDTH,
    FORMATS,
    JSON_SCHEMA_VERSION,
    SimulationReport,
    format_full,
    format_seeds,
    format_summary,
    write_json,
)
from kvindex.simulate.runner import Task, default_jobs, run_tasks
from kvindex.simulate.scheduler import RADIX_INSERT, RunResult, RunSpec, check_spec
from kvindex.simulate.trace import TRACE_BLOCK
from kvindex.simulate.workloads import Workload, chat_workload
from kvindex.sizing import ModelShape, SizingError, kv_budget_bytes, parse_bytes

__all__ = ["add_arguments", "build_parser", "check_args", "guarded_run", "main", "run"]

DESCRIPTION = """\
Replay a workload through kvindex's two prefix-index designs — the hash chain (vLLM's
chained block hashes) and the radix tree (SGLang) — at several block sizes and KV pool
capacities, and compare hit rates, tokens lost to block granularity and to the full-hit
rule, evictions, waits, peak blocks and the index's own CPU cost.

Scheduling model (continuous batching, one step = one forward pass):
  1. arrivals join the queue (trace: timestamp // --step-ms; chat follow-up turns: a
     think time after the previous turn finishes);
  2. every running request past its prefill decodes one token (one append_batch); if
     blocks run short the most recently admitted request is preempted (re-queued at the
     front, later resumed with its output so far);
  3. admitted requests continue a chunked prefill within --max-batched-tokens (one
     schedule_batch; if blocks run short the most recently admitted request is preempted);
  4. the queue head is admitted (first come, first served) while the step's token budget
     lasts and fewer than --max-running run: the cache hits its longest cached prefix and
     allocates the first chunk; if blocks run short the head waits (counted) until the
     next step;
  5. finished requests are freed; their blocks stay cached until evicted.
Chunk semantics, the same for both designs (vLLM's): a prefill chunk's full blocks are
cacheable by other requests from the step that schedules them (the engine-lifecycle
calls admit_chunk, schedule_batch, preempt, resume). --radix-insert prefill|finish
selects instead the alternative whole-prompt-admission model of earlier reports: the
whole prompt is allocated at admission and the hash chain caches it then, while the radix
tree inserts it when its prefill completes (prefill) or when the request finishes (finish).
Every request must fit alone in the pool. Figures are exact and reproducible (same seed,
same numbers) except the measured µs, reported apart (JSON: "timing"). Configurations run
in parallel, one process each, on up to --jobs cores (default: all).
"""

EPILOG = """\
capacity values (comma-separated): inf; tokens 65536, 64k, 3M, 64Ki; blocks 4096blocks;
memory 40GiB / 80GB with --model-shape. Examples:
  kvindex simulate                                   # chat workload, default grid
  kvindex simulate --workload seeds                  # the design notes' worked examples
  kvindex simulate --trace mooncake.jsonl --design hash_chain,radix,radix@1 --capacity 1M,3M,inf
  kvindex simulate --capacity 1GiB,4GiB --model-shape layers=32,kv_heads=8,head_dim=128,dtype=bf16
"""

_CHAT_BLOCK_SIZES = "1,16"
_TRACE_BLOCK_SIZES = "16"
_CHAT_CAPACITIES = "32k,64k,128k,inf"
_TRACE_CAPACITIES = "1M,3M,10M,inf"
_STEP_MS = 20.0


def add_arguments(
    p: argparse.ArgumentParser, *, defaults: bool = True, hidden: bool = False
) -> None:
    """Adds ``kvindex simulate``'s options to ``p``.

    With ``defaults=False`` an option left out sets nothing (``argparse.SUPPRESS``): used by
    the ``simulate`` subcommand, so that options given before it (``kvindex --quiet
    simulate``) are not reset to their defaults by the subcommand's parser. ``hidden``
    leaves the options out of ``p``'s help.
    """
    from kvindex import HASH_ALGOS, RADIX_POLICIES

    def opt(group: Any, *flags: str, default: Any = None, **kw: Any) -> None:
        if hidden:
            kw["help"] = argparse.SUPPRESS
        group.add_argument(*flags, default=default if defaults else argparse.SUPPRESS, **kw)

    w = p.add_argument_group("workload")
    opt(
        w,
        "--workload",
        choices=("chat", "seeds"),
        help="chat: seeded multi-tenant chat generator (default); seeds: the worked examples "
        "of the vLLM hash-chain and radix-tree design notes",
    )
    opt(w, "--trace", metavar="FILE", help="replay a Mooncake JSONL trace instead")
    opt(
        w,
        "--requests",
        type=int,
        metavar="N",
        help="chat: number of requests (default 1000); trace: keep the first N",
    )
    opt(w, "--seed", type=int, help="chat: generator seed (default 0)")
    opt(
        w,
        "--step-ms",
        type=float,
        metavar="MS",
        help=f"trace: milliseconds per scheduler step (default {_STEP_MS:g})",
    )
    opt(
        w,
        "--tokens-per-hash",
        type=int,
        metavar="N",
        help=f"trace: tokens per hash id (default {TRACE_BLOCK}, the Mooncake release's)",
    )
    d = p.add_argument_group("designs and pool")
    opt(
        d,
        "--design",
        "--index",
        dest="design",
        default="hash_chain,radix",
        metavar="LIST",
        help="designs, comma-separated: hash_chain, radix; DESIGN@BS runs one block size "
        "only (default hash_chain,radix); --index is an alias",
    )
    opt(
        d,
        "--block-size",
        metavar="LIST",
        help=f"block (page) sizes, comma-separated (default {_CHAT_BLOCK_SIZES}; "
        f"trace {_TRACE_BLOCK_SIZES})",
    )
    opt(d, "--hash", default="xxh3_128", choices=HASH_ALGOS, help="hash-chain algorithm (xxh3_128)")
    opt(d, "--policy", default="lru", choices=RADIX_POLICIES, help="radix eviction policy (lru)")
    opt(
        d,
        "--radix-insert",
        default=RADIX_INSERT[0],
        choices=RADIX_INSERT,
        help="schedule (default): both designs on vLLM's chunk semantics; prefill | finish: "
        "the alternative whole-prompt-admission model, the radix tree inserting a prompt "
        "when its prefill completes | when the request finishes",
    )
    opt(
        d,
        "--capacity",
        metavar="LIST",
        help=f"KV pool sizes (default {_CHAT_CAPACITIES}; trace {_TRACE_CAPACITIES})",
    )
    opt(
        d,
        "--model-shape",
        metavar="SHAPE",
        help="layers=L,kv_heads=H,head_dim=D[,dtype=bf16]: turns memory capacities into tokens",
    )
    b = p.add_argument_group("pool from an engine's memory budget (needs --model-shape)")
    opt(
        b,
        "--budget-rule",
        choices=("sglang", "vllm"),
        help="add the pool this rule leaves: sglang = fraction x GPU - weights; vllm = "
        "fraction x GPU - weights - activation peak - other",
    )
    opt(b, "--gpu-memory", metavar="SIZE", help="GPU memory, e.g. 80GiB")
    opt(
        b,
        "--memory-fraction",
        type=float,
        metavar="F",
        help="mem_fraction_static (sglang, required) / gpu_memory_utilization (vllm, 0.9)",
    )
    opt(b, "--weights", metavar="SIZE", help="model weights, e.g. 16GiB (default 0)")
    opt(b, "--activation-peak", metavar="SIZE", help="vllm: profiled peak (default 0)")
    opt(b, "--other-memory", metavar="SIZE", help="vllm: non-torch memory (default 0)")
    s = p.add_argument_group("scheduler")
    opt(s, "--max-running", type=int, default=64, help="running requests (default 64)")
    opt(
        s,
        "--max-batched-tokens",
        type=int,
        default=8192,
        help="tokens computed per step (default 8192)",
    )
    hy = p.add_argument_group("hybrid models: KV cache groups (sliding window, chunked, Mamba)")
    opt(
        hy,
        "--model",
        metavar="PRESET|FILE",
        help="replay the workload through this model's KV cache groups (a preset: gpt-oss, "
        "gemma3, gemma3-1b, llama4, qwen3-next, deepseek-v3.2; or a JSON layout) next to the "
        "same model as full attention: hit rate, memory per cached token, each group's loss",
    )
    opt(hy, "--mamba-cache-mode", choices=("none", "align"), help="--model: Mamba groups' mode")
    o = p.add_argument_group("output and speed")
    opt(
        o,
        "--format",
        choices=FORMATS,
        help="print the full table as aligned text, Markdown or CSV (default: a summary that "
        "fits the terminal)",
    )
    opt(o, "--json", metavar="PATH", help="write every figure as JSON")
    opt(
        o,
        "--plot",
        metavar="PATH.png",
        help="plot hit rate against capacity (--cluster: hit rate and queueing delay per "
        "routing policy; needs matplotlib; format from the suffix)",
    )
    opt(
        o,
        "--jobs",
        "-j",
        type=int,
        metavar="N",
        help="processes running configurations in parallel, one configuration each (default: "
        "the usable CPU cores); the exact figures do not depend on it, the measured µs are "
        "steadier with 1",
    )
    opt(o, "--quiet", "-q", action="store_true", default=False, help="no progress bar")
    c = p.add_argument_group(
        "cluster: W engines behind a KV-aware router (needs kvindex[events])",
        "engines are caches of each --design and --block-size (one report section "
        "each; block size 16 by default), --hash or --policy and a --cluster-blocks pool",
    )
    opt(c, "--cluster", type=int, metavar="W", help="simulate W engine replicas behind a router")
    opt(
        c,
        "--route",
        default="kv,random,round_robin,least_loaded,approx",
        help="routing policies, comma-separated (default: all of kv, random, round_robin, "
        "least_loaded, approx)",
    )
    opt(
        c,
        "--cluster-blocks",
        type=int,
        default=2048,
        metavar="N",
        help="pool blocks per engine (default 2048)",
    )
    opt(
        c,
        "--faults",
        metavar="SPEC",
        help="inject faults between the engines and the index (drop=P,corrupt=P,duplicate=P,"
        "inject=P,replay=ok|late|never|garbage, or 'default') and run each event-fed "
        "policy with recovery (snapshots, heartbeats) and without",
    )


def _warn(args: argparse.Namespace, message: str) -> None:
    print(f"{getattr(args, 'prog', 'kvindex simulate')}: warning: {message}", file=sys.stderr)


def check_args(args: argparse.Namespace) -> None:
    """Rejects conflicting options and output paths that cannot be written, warns about
    options that do not apply; fills in the defaults that depend on the workload.

    Runs before anything is simulated (it reads no trace and imports no plotting library).
    """
    trace = bool(args.trace)
    if trace and args.workload is not None:
        raise SimulationError(
            f"--trace and --workload {args.workload} both name the workload; give one"
        )
    workload = "trace" if trace else (args.workload or "chat")
    args.workload_kind = workload
    if args.cluster is not None:
        if workload == "seeds":
            raise SimulationError("--cluster replays the chat workload or a --trace, not seeds")
        if args.cluster < 1:
            raise SimulationError(f"--cluster must be >= 1, got {args.cluster}")
    if getattr(args, "faults", None) is not None:
        if args.cluster is None:
            raise SimulationError("--faults needs --cluster")
        from kvindex.simulate.faults import parse_faults

        try:
            parse_faults(str(args.faults))
        except ValueError as e:
            raise SimulationError(str(e)) from None
    if args.json is not None:
        check_output_path("--json", args.json)
    if args.plot is not None:
        if workload == "seeds":
            raise SimulationError("--plot needs a capacity sweep; the seeds workload has none")
        check_plot_path(args.plot)
    if args.jobs is not None and args.jobs < 1:
        raise SimulationError(f"--jobs must be >= 1, got {args.jobs}")
    if args.requests is not None and args.requests < 1:
        raise SimulationError(f"--requests must be >= 1, got {args.requests}")
    if args.tokens_per_hash is not None and args.tokens_per_hash < 1:
        raise SimulationError(f"--tokens-per-hash must be >= 1, got {args.tokens_per_hash}")
    if args.step_ms is not None and not args.step_ms > 0:
        raise SimulationError(f"--step-ms must be > 0, got {args.step_ms}")
    if args.seed is not None and args.seed < 0:
        raise SimulationError(f"--seed must be >= 0, got {args.seed}")
    if args.seed is not None and workload != "chat":
        _warn(args, f"--seed applies to the chat workload only; ignored for the {workload}")
    for flag, value in (("--step-ms", args.step_ms), ("--tokens-per-hash", args.tokens_per_hash)):
        if value is not None and workload != "trace":
            _warn(args, f"{flag} applies to --trace only; ignored")
    if workload == "seeds":
        ignored = [
            flag
            for flag, value in (
                ("--requests", args.requests),
                ("--block-size", args.block_size),
                ("--capacity", args.capacity),
                ("--model-shape", args.model_shape),
                ("--budget-rule", args.budget_rule),
                ("--format", args.format),
                ("--jobs", args.jobs),
            )
            if value is not None
        ]
        if ignored:
            _warn(
                args,
                f"{', '.join(ignored)}: not used by the seeds workload (fixed examples); ignored",
            )
    if args.budget_rule is None:
        given = [
            flag
            for flag, value in (
                ("--memory-fraction", args.memory_fraction),
                ("--weights", args.weights),
                ("--activation-peak", args.activation_peak),
                ("--other-memory", args.other_memory),
            )
            if value is not None
        ]
        if given:
            _warn(args, f"{', '.join(given)} apply only with --budget-rule; ignored")
    elif args.budget_rule == "sglang":
        for flag, value in (
            ("--activation-peak", args.activation_peak),
            ("--other-memory", args.other_memory),
        ):
            if value is not None:
                _warn(args, f"{flag} applies to --budget-rule vllm only; ignored")


def _budget_capacity(args: argparse.Namespace, shape: ModelShape | None) -> Capacity | None:
    if args.budget_rule is None:
        if args.gpu_memory is not None:
            raise SimulationError("--gpu-memory needs --budget-rule sglang or vllm")
        return None
    if shape is None:
        raise SimulationError("--budget-rule needs --model-shape")
    if args.gpu_memory is None:
        raise SimulationError("--budget-rule needs --gpu-memory")
    weights = args.weights or "0"
    vllm = args.budget_rule == "vllm"
    budget = kv_budget_bytes(
        args.budget_rule,
        gpu_memory_bytes=parse_bytes(args.gpu_memory),
        fraction=args.memory_fraction,
        weight_bytes=parse_bytes(weights),
        activation_bytes=parse_bytes(args.activation_peak or "0") if vllm else 0,
        other_bytes=parse_bytes(args.other_memory or "0") if vllm else 0,
    )
    frac = args.memory_fraction if args.memory_fraction is not None else 0.9
    label = f"{args.budget_rule}({args.gpu_memory}x{frac:g}-{weights})"
    if budget < shape.bytes_per_token:
        raise SimulationError(f"the {label} budget ({budget:,} bytes) holds no token")
    return Capacity(label, "bytes", budget, shape.bytes_per_token)


def _json_header(args: argparse.Namespace) -> dict[str, Any]:
    from kvindex import __version__

    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "kvindex_version": __version__,
        "command": getattr(args, "command_line", None),
    }


def _run_seeds(args: argparse.Namespace) -> int:
    from kvindex.simulate.seeds import run_seeds

    rows = run_seeds()
    print(format_seeds(rows, width=_terminal_width()))
    if args.json:
        write_json(args.json, {**_json_header(args), "workload": "seeds", "examples": rows})
    return 0


def _load_workload(args: argparse.Namespace) -> Workload:
    if args.workload_kind == "trace":
        from kvindex.simulate.trace import read_mooncake_trace

        return read_mooncake_trace(
            args.trace,
            step_ms=args.step_ms if args.step_ms is not None else _STEP_MS,
            limit=args.requests,
            tokens_per_hash=args.tokens_per_hash or TRACE_BLOCK,
        )
    return chat_workload(args.requests or 1000, args.seed if args.seed is not None else 0)


def _terminal_width() -> int:
    """Columns of the terminal on stdout; 120 when it cannot be read (a pipe, a file)."""
    try:
        cols = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        cols = 0
    if cols <= 0:
        env = os.environ.get("COLUMNS", "")
        cols = int(env) if env.isdigit() and int(env) > 0 else DEFAULT_WIDTH
    return max(cols, 40)


def run(args: argparse.Namespace) -> int:
    """Runs ``kvindex simulate`` for parsed ``args``; returns the exit status."""
    if args.model is not None and args.cluster is not None:
        raise SimulationError(
            "--model runs one engine's groups; it does not combine with --cluster"
        )
    if args.mamba_cache_mode is not None and args.model is None:
        _warn(args, "--mamba-cache-mode applies to --model only; ignored")
    if args.cluster is not None:
        check_args(args)
        # Engines publish real KV-event batches over ZMQ to the cluster index: the cluster
        # simulator (and pyzmq) is imported only for these runs.
        from kvindex.simulate.cluster import run_cluster

        try:
            return run_cluster(args)
        except ValueError as e:
            raise SimulationError(str(e)) from e
    check_args(args)
    if args.workload_kind == "seeds":
        return _run_seeds(args)
    if args.model is not None:
        from kvindex.simulate.hybrid import run_model

        return run_model(args, _load_workload(args), _json_header(args))
    shape = ModelShape.parse(args.model_shape) if args.model_shape else None
    trace = args.workload_kind == "trace"
    block_sizes = parse_ints(
        args.block_size or (_TRACE_BLOCK_SIZES if trace else _CHAT_BLOCK_SIZES), "block size"
    )
    configs = parse_designs(args.design, block_sizes)
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

    tasks: list[Task] = [Task("max", "radix", 1)]
    for design, bs in configs:
        kw: dict[str, Any] = {"algo": args.hash} if design == "hash_chain" else {}
        if design == "radix":
            kw["policy"] = args.policy
        tasks.append(Task("ceiling", design, bs, cache_kw=kw))
    tasks += [Task("run", s.design, s.block_size, spec=s) for s in specs]
    jobs = args.jobs if args.jobs is not None else default_jobs(len(tasks))
    enabled = not args.quiet and sys.stderr.isatty()
    bar = Progress(len(tasks) * len(workload), enabled=enabled)
    try:
        results = run_tasks(workload, tasks, jobs=jobs, progress=bar)
    finally:
        bar.close()
    tmax = cast(HitTally, results[0]).hit_rate
    pairs = list(zip(tasks, results, strict=True))
    ceilings = {
        (t.design, t.block_size): cast(HitTally, r) for t, r in pairs if t.kind == "ceiling"
    }
    runs = [cast(RunResult, r) for t, r in pairs if t.kind == "run"]

    rep = SimulationReport(
        workload.summary(),
        {
            "max_running": args.max_running,
            "max_batched_tokens": args.max_batched_tokens,
            "radix_insert": args.radix_insert,
            "policy": args.policy,
            "hash_algo": args.hash,
            "step_ms": (args.step_ms if args.step_ms is not None else _STEP_MS) if trace else None,
            "processes": min(jobs, len(tasks)),
        },
        tmax,
        ceilings,
        runs,
        str(shape) if shape is not None else None,
        shape.bytes_per_token if shape is not None else None,
    )
    fmt = args.format
    if fmt is None:
        print(format_summary(rep, width=_terminal_width()))
    else:
        print(format_full(rep, fmt))
    if args.json:
        write_json(args.json, {**_json_header(args), **rep.as_dict()})
    if args.plot:
        from kvindex.simulate.plot import plot_hit_rate

        plot_hit_rate(rep, args.plot)
    return 0


def build_parser(prog: str = "kvindex simulate") -> argparse.ArgumentParser:
    """The parser of ``kvindex simulate`` (also ``python -m kvindex.simulate.cli``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "kvindex simulate") -> int:
    """Parses ``argv`` and runs; errors in the input print one line and return 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    args.command_line = shlex.join([prog, *argv])
    return guarded_run(args, prog)


def guarded_run(args: argparse.Namespace, prog: str = "kvindex simulate") -> int:
    """:func:`run`, with input errors printed as ``prog: error: ...`` (exit status 2)."""
    from kvindex.exceptions import KvIndexError

    args.prog = prog
    try:
        return run(args)
    except BrokenPipeError:
        # `kvindex | head`: the reader left; stop quietly, as a shell tool would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (SimulationError, SizingError, KvIndexError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
