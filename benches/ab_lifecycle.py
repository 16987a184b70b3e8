"""A/B two builds of kvindex's native core on bench_lifecycle's batch steps, in one process.

The steps are ``bench_lifecycle``'s: ``append_batch`` (64 known ids, today's decode
step), ``decode`` (``schedule_batch`` + ``commit_batch`` of 64 running requests) and
``async`` (``schedule_batch`` of 64 unknown ids, then their ``commit_batch``), for the
hash chain (xxh3_128) and the radix cache, block size 16. Each build is loaded from its
``.so`` as ``ab_radix`` loads it; rounds alternate ABBA, each round keeps the fastest of
``--reps`` runs per build (a step of 64 requests takes microseconds, so one run is at the
mercy of the machine's other load), and the median of the per-round B / A ratios is
printed with each build's minimum and median. Usage::

    taskset -c 1 python benches/ab_lifecycle.py A.so B.so [--rounds 10] [--reps 5] [--steps 2000]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from types import ModuleType, SimpleNamespace

import ab_radix
import bench_lifecycle as bl

STEPS: dict[str, Callable[[str, int], float]] = {
    "append_batch": bl.append_steps,
    "decode": lambda d, s: bl.decode_steps(d, s, 0),
    "async": bl.async_steps,
}


def run(core: ModuleType, design: str, name: str, steps: int) -> float:
    """Seconds per step of ``name`` on ``core``'s caches."""
    caches = SimpleNamespace(
        HashChainCache=core.HashChainCache, RadixPrefixCache=core.RadixPrefixCache
    )
    bl.kvindex = caches  # type: ignore[assignment]
    return STEPS[name](design, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="baseline build (.so)")
    ap.add_argument("b", help="candidate build (.so)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    a, b = ab_radix.load_core(args.a), ab_radix.load_core(args.b)
    for design in ("xxh3_128", "radix"):
        print(f"{design} ({args.rounds} rounds, µs per step of {bl.N_REQ} requests)")
        for name in STEPS:
            pairs = []
            for r in range(args.rounds):
                got = {}
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    core, n = (a, b)[i], args.steps
                    got[i] = min(run(core, design, name, n) for _ in range(args.reps)) * 1e6
                pairs.append((got[0], got[1]))
            xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
            ratio = statistics.median(y / x for x, y in pairs)
            print(
                f"  {name:13s} A min {min(xa):6.2f} med {statistics.median(xa):6.2f} | "
                f"B min {min(xb):6.2f} med {statistics.median(xb):6.2f} | B/A {ratio:.3f}"
            )


if __name__ == "__main__":
    main()
