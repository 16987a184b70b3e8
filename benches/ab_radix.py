"""A/B two builds of kvindex's native core on bench_radix's request loop, in one process.

On a shared 2-vCPU VM two separate benchmark runs of the same build differ by 30% or
more; interleaving the builds in one process and taking the median of per-round ratios
resolves about ±5% (an A/A run of one build against a copy of itself gives 0.98–1.05).
Each build is loaded as its own module from a ``.so`` file (``_core.abi3.so`` of an
installed wheel, or ``target/release/libkvindex.so`` of ``cargo build --release --features
python,pyo3/extension-module``); rounds alternate ABBA so neither build always runs
first. Usage::

    taskset -c 1 python benches/ab_radix.py A.so B.so [--rounds 20] [--page-sizes 1,16]

With ``--b-window W`` build B's trees with a sliding-window component of ``W`` tokens
(``RadixTree(ps, sliding_window=W)``): passing the same build as A and B then measures
what a full + SWA tree costs per request against the one-group tree. ``--a-window W``
does the same for A's trees: with both, two builds are compared on full + SWA trees.

Prints, per page size and per quantity (µs per call: match, insert, evict per request):
the minimum and median of each build and the median of the B / A ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from types import ModuleType

import bench_radix as br

KEYS = ("match", "insert", "evict_per_req")


def load_core(path: str) -> ModuleType:
    """The native module in ``path``, loaded under its own name (one copy per file)."""
    spec = importlib.util.spec_from_file_location("kvindex._core", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ab(
    a: ModuleType,
    b: ModuleType,
    rounds: int,
    ps: int,
    reqs: list,
    b_window: int | None = None,
    a_window: int | None = None,
) -> dict[str, list]:
    """Per-quantity lists of (A, B) figures, one pair per round."""
    overhead = br.timer_overhead()
    out: dict[str, list] = {k: [] for k in KEYS}
    for r in range(rounds):
        got: dict[int, dict[str, float]] = {}
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            core = (a, b)[i]
            pool = br.SlotPool(br.CAPACITY + 8192 + 16 * ps, ps)
            window = (a_window, b_window)[i]
            tree = core.RadixTree(ps, sliding_window=window) if window else core.RadixTree(ps)
            got[i] = br.request_loop(tree, pool, reqs, br.CAPACITY, overhead)
            pool.audit(tree.all_slots(), len(pool.pages))
        for k in KEYS:
            out[k].append((got[0][k], got[1][k]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="baseline build (.so)")
    ap.add_argument("b", help="candidate build (.so)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--page-sizes", default="1,16")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--b-window", type=int, default=None, help="B: full + SWA, this window")
    ap.add_argument("--a-window", type=int, default=None, help="A: full + SWA, this window")
    args = ap.parse_args()
    a, b = load_core(args.a), load_core(args.b)
    reqs = br.workload(args.requests)
    for ps in (int(x) for x in args.page_sizes.split(",")):
        res = ab(a, b, args.rounds, ps, reqs, args.b_window, args.a_window)
        print(f"page size {ps} ({args.rounds} rounds, µs per call)")
        for k, pairs in res.items():
            xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
            ratio = statistics.median(y / x for x, y in pairs)
            print(
                f"  {k:14s} A min {min(xa):5.2f} med {statistics.median(xa):5.2f} | "
                f"B min {min(xb):5.2f} med {statistics.median(xb):5.2f} | B/A {ratio:.3f}"
            )


if __name__ == "__main__":
    main()
