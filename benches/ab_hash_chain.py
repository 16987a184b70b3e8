"""A/B two builds of kvindex's native core on bench_hash_chain's scheduler loop, in one process.

The hash-chain counterpart of ``ab_radix.py`` (same method: each build loaded from its
own ``.so``, rounds alternating ABBA, the median of per-round B / A ratios). Each round
drives ``bench_hash_chain.drive`` (admit with prompt hashing, one ``append_batch`` per
decode step, free) once per build and algorithm. Usage::

    taskset -c 1 python benches/ab_hash_chain.py A.so B.so [--rounds 10] [--requests 500]

Prints, per algorithm and per quantity (µs per request: admit, decode, free, total):
the minimum and median of each build and the median of the B / A ratios.
"""

from __future__ import annotations

import argparse
import statistics
from types import ModuleType

import bench_hash_chain as bh
from ab_radix import load_core

KEYS = ("admit_us_per_req", "decode_us_per_req", "free_us_per_req", "total_us_per_req")
ALGOS = ("xxh3_128", "vllm_sha256_cbor")


def run_once(core: ModuleType, reqs: list, algo: str) -> dict[str, float]:
    """One scheduler loop on ``core`` (bench_hash_chain reads its module global)."""
    bh.kvindex = core  # type: ignore[assignment]
    return bh.drive(reqs, "kvindex", algo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="baseline build (.so)")
    ap.add_argument("b", help="candidate build (.so)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=500)
    args = ap.parse_args()
    a, b = load_core(args.a), load_core(args.b)
    reqs = bh.workload(args.requests)
    for algo in ALGOS:
        for core in (a, b):
            run_once(core, reqs[:50], algo)  # warm-up
        pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in KEYS}
        for r in range(args.rounds):
            got: dict[int, dict[str, float]] = {}
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                got[i] = run_once((a, b)[i], reqs, algo)
            assert got[0]["hit_rate"] == got[1]["hit_rate"], "both builds must hit alike"
            for k in KEYS:
                pairs[k].append((got[0][k], got[1][k]))
        print(f"{algo} ({args.rounds} rounds, {args.requests} requests, µs per request)")
        for k, ps in pairs.items():
            xa, xb = [p[0] for p in ps], [p[1] for p in ps]
            ratio = statistics.median(y / x for x, y in ps)
            name = k.removesuffix("_us_per_req")
            print(
                f"  {name:7s} A min {min(xa):7.2f} med {statistics.median(xa):7.2f} | "
                f"B min {min(xb):7.2f} med {statistics.median(xb):7.2f} | B/A {ratio:.3f}"
            )


if __name__ == "__main__":
    main()
