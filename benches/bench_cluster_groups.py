"""Cluster scoring over KV cache groups: the cost of one query with 2 and 4 groups per
worker against full attention only.

``W`` workers (16, 64), every one fed real ``KVEventBatch`` payloads (``EventEncoder``;
one event per group, ``group_idx`` set) for a prefix of uniformly random length (0..N
blocks of 16 tokens) of one prompt of ``N * 16`` tokens (N = 128, 512), plus 500 blocks
of its own per group. Layouts, all in blocks of 16 tokens:

- ``full``: one full-attention group, no layout declared: ``ClusterIndex.route`` walks
  group 0's blocks for all workers at once (the path every full-attention index takes);
- ``2 groups``: full attention + a sliding window of 128 tokens (gpt-oss' shape);
- ``4 groups``: full attention + sliding window 128 + chunked local 8192 + Mamba
  (``align``): the core's fixed point per worker over its per-group membership.

One query = ``ClusterIndex.route(prompt, load)`` from Python: hashing the prompt
(xxh3_128), scoring every worker, the cost pick. Reported: median µs over ``--reps``
calls, and each layout's ratio to ``full``.

Usage: python benches/bench_cluster_groups.py [--reps N] [--json PATH]
Build with ``maturin develop --release`` first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

import kvindex
from kvindex.cluster import ClusterIndex
from kvindex.events import EventEncoder

BS = 16
OWN = 500
ENC = EventEncoder()
LAYOUTS: dict[str, list[tuple[str, int, int, str]] | None] = {
    "full": None,
    "2 groups": [("full_attention", BS, 0, ""), ("sliding_window", BS, 128, "")],
    "4 groups": [
        ("full_attention", BS, 0, ""),
        ("sliding_window", BS, 128, ""),
        ("chunked_local_attention", BS, 8192, ""),
        ("mamba", BS, 0, "align"),
    ],
}


def stored(hashes: list[int], group: int, kind: str) -> kvindex.BlockStored:
    return kvindex.BlockStored(
        hashes, None, [1] * (BS * len(hashes)), BS, None, "GPU", None, None, group, kind
    )


def build(
    layout: list[tuple[str, int, int, str]] | None, workers: int, n: int, seed: int
) -> tuple[ClusterIndex, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 50_000, n * BS, dtype=np.int32)
    ix = ClusterIndex(BS)
    h = ix.hashes(prompt).tolist()
    groups = layout or [("full_attention", BS, 0, "")]
    for w in range(workers):
        slot = ix.add_worker(f"w{w}")
        if layout is not None:
            ix.set_worker_layout(slot, layout)
        k = int(rng.integers(0, n + 1))
        own = (rng.integers(1, 2**63, OWN, dtype=np.uint64)).tolist()
        events = []
        for g, (kind, *_rest) in enumerate(groups):
            events.append(stored(h[:k] + own, g, kind))
        assert ix.apply(slot, 0, ENC.encode_events(events, 0.0))[0] == "applied"
    return ix, prompt


def time_route(ix: ClusterIndex, prompt: np.ndarray, reps: int) -> float:
    load = np.zeros(ix.slots, dtype=np.float64)
    for _ in range(20):
        ix.route(prompt, load)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ix.route(prompt, load)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for workers in (16, 64):
        for n in (128, 512):
            base = None
            for name, layout in LAYOUTS.items():
                ix, prompt = build(layout, workers, n, seed=workers * 1000 + n)
                us = time_route(ix, prompt, args.reps)
                base = us if base is None else base
                rows.append(
                    {
                        "workers": workers,
                        "prompt_blocks": n,
                        "layout": name,
                        "route_us": us,
                        "ratio": us / base,
                    }
                )
                print(f"W={workers:<3} N={n:<4} {name:<9} route {us:8.1f} µs  x{us / base:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
