"""KV-event wire benchmark: encoding rate, and the scheduler-step cost of publishing.

1. Encoding. A ``HashChainCache`` (vLLM sha256_cbor, block 16) admits 512 fresh
   256-token prompts per round, so its buffer holds 512 ``BlockStored`` runs of 16
   blocks of 16 tokens; one timed ``EventEncoder.encode(cache, ts)`` drains and
   encodes them into a vLLM 0.33 payload. Reported: block hashes per second (one
   core: the call holds the GIL and runs no thread). Baseline in the same run: what a
   Python publisher does with the same events, ``take_events()`` + ``to_dict()`` +
   ``msgpack.packb`` (skipped when msgpack is not installed).
2. Step overhead. A scheduler loop (per step: admit 8 requests sharing 20 system
   prompts, decode one token for every running request, free the oldest 8; a pool that
   evicts) runs with events off, then with events on and ``EventPublisher.publish(cache)``
   every step to a real PUB socket on tcp://127.0.0.1 (its sender thread included). The
   runs are paired, in ABBA order; reported: the median over ``--rounds`` pairs of the
   extra µs per event (``(t_on - t_off) / events``), in wall time (the loop ends when
   the last batch is sent) and in process CPU time (every thread: immune to the other
   work on a shared machine, and counting the sender and libzmq I/O threads).

Usage: python benches/bench_events.py [--rounds N] [--steps N] [--json PATH]
Build with ``maturin develop --release`` first.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

import kvindex
from kvindex.events import EventEncoder, EventPublisher

BS = 16
RUN_BLOCKS = 16
EVENTS_PER_CALL = 512


def encoding(rounds: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    cache = kvindex.HashChainCache(
        EVENTS_PER_CALL * (RUN_BLOCKS + 1) + 1, BS, algo="vllm_sha256_cbor", enable_events=True
    )
    enc = EventEncoder()
    try:
        import msgpack  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - optional baseline
        msgpack = None
    best_rust = best_py = float("inf")
    payload_bytes = 0
    rid = 0
    for r in range(rounds):
        ids = []
        for _ in range(EVENTS_PER_CALL):
            rid += 1
            prompt = rng.integers(0, 50_000, RUN_BLOCKS * BS + 1, dtype=np.int64)
            assert cache.admit(rid, prompt) is not None
            ids.append(rid)
        if r % 2 == 0 or msgpack is None:
            t0 = time.perf_counter()
            payload = enc.encode(cache, 1.0)
            best_rust = min(best_rust, time.perf_counter() - t0)
            assert payload is not None
            payload_bytes = len(payload)
        else:
            t0 = time.perf_counter()
            events = cache.take_events()
            msgpack.packb([1.0, [e.to_dict() for e in events], 0])
            best_py = min(best_py, time.perf_counter() - t0)
        cache.free_batch(np.array(ids, dtype=np.int64))
        cache.reset()
        enc.encode(cache, 0.0)  # drop the AllBlocksCleared
    hashes = EVENTS_PER_CALL * RUN_BLOCKS
    out = {
        "events_per_call": EVENTS_PER_CALL,
        "hashes_per_call": hashes,
        "payload_bytes": payload_bytes,
        "rust_hashes_per_s": hashes / best_rust,
        "rust_us_per_event": best_rust / EVENTS_PER_CALL * 1e6,
    }
    if msgpack is not None:
        out["python_msgpack_hashes_per_s"] = hashes / best_py
        out["speedup_vs_python_msgpack"] = best_py / best_rust
    return out


def _step_loop(
    steps: int, mode: str, publisher: EventPublisher | None = None
) -> tuple[float, float, int]:
    """Runs the scheduler loop with events ``off``, ``published`` every step, or drained
    and ``counted`` (untimed use). Returns (wall seconds, process CPU seconds: every
    thread, the publisher's sender and libzmq's I/O thread included; events seen, 0
    unless counted)."""
    rng = np.random.default_rng(1)
    systems = [rng.integers(0, 50_000, 512, dtype=np.int64) for _ in range(20)]
    suffixes = rng.integers(0, 50_000, (steps * 8, 64), dtype=np.int64)
    picks = rng.integers(0, 20, steps * 8)
    prompts = [np.concatenate([systems[p], s]) for p, s in zip(picks, suffixes, strict=True)]
    cache = kvindex.HashChainCache(2048, BS, algo="vllm_sha256_cbor", enable_events=mode != "off")
    running: list[int] = []
    events = 0
    rid = 0
    decode_tok = np.full(256, 7, dtype=np.int64)
    t0 = time.perf_counter()
    c0 = time.process_time()
    for step in range(steps):
        for _ in range(8):
            if cache.admit(rid, prompts[rid]) is not None:
                running.append(rid)
            rid += 1
        ids = np.array(running, dtype=np.int64)
        if len(ids):
            cache.append_batch(ids, decode_tok[: len(ids)])
        if len(running) > 64:
            cache.free_batch(np.array(running[:8], dtype=np.int64))
            del running[:8]
        if publisher is not None:
            publisher.publish(cache, ts=float(step))
        elif mode == "counted":
            events += len(cache.take_events())
    if publisher is not None:
        wait_sent(publisher)  # the sending is part of the cost
    return time.perf_counter() - t0, time.process_time() - c0, events


def wait_sent(pub: EventPublisher) -> None:
    while pub.stats["queued"]:
        time.sleep(0.0005)


def step_overhead(rounds: int, steps: int) -> dict[str, Any]:
    """Paired rounds in ABBA order (off/on, on/off, ...): the machine's background load
    moves both halves of a pair alike. Reported: the median per-round difference, and
    the difference of the best runs."""
    _, _, n_events = _step_loop(steps, "counted")
    offs: list[tuple[float, float]] = []
    ons: list[tuple[float, float]] = []
    pub_stats: dict[str, int] = {}

    def run_off() -> tuple[float, float]:
        wall, cpu, _ = _step_loop(steps, "off")
        return wall, cpu

    def run_on() -> tuple[float, float]:
        nonlocal pub_stats
        pub = EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
        try:
            wall, cpu, _ = _step_loop(steps, "published", pub)
        finally:
            pub.close(timeout=5.0)
        pub_stats = pub.stats
        return wall, cpu

    for r in range(rounds):
        if r % 2 == 0:
            offs.append(run_off())
            ons.append(run_on())
        else:
            ons.append(run_on())
            offs.append(run_off())

    def median_diff(k: int) -> float:
        diffs = sorted(on[k] - off[k] for on, off in zip(ons, offs, strict=True))
        return diffs[len(diffs) // 2]

    best_off = min(o[0] for o in offs)
    best_on = min(o[0] for o in ons)
    return {
        "steps": steps,
        "rounds": rounds,
        "events": n_events,
        "events_per_step": n_events / steps,
        "us_per_step_events_off": best_off / steps * 1e6,
        "us_per_step_events_published": best_on / steps * 1e6,
        "overhead_us_per_event": median_diff(0) / n_events * 1e6,
        "overhead_us_per_event_best_runs": (best_on - best_off) / n_events * 1e6,
        "overhead_cpu_us_per_event": median_diff(1) / n_events * 1e6,
        "publisher": pub_stats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    res = {
        "encoding": encoding(max(args.rounds, 4)),
        "step_overhead": step_overhead(args.rounds, args.steps),
    }
    e, s = res["encoding"], res["step_overhead"]
    print(
        f"encoding: {e['rust_hashes_per_s'] / 1e6:.1f} M block hashes/s "
        f"({e['rust_us_per_event']:.2f} µs per 16-block BlockStored, "
        f"{e['payload_bytes'] / e['events_per_call']:.0f} B/event)"
        + (
            f"; Python take_events+msgpack {e['python_msgpack_hashes_per_s'] / 1e6:.2f} M/s "
            f"({e['speedup_vs_python_msgpack']:.0f}x slower)"
            if "speedup_vs_python_msgpack" in e
            else ""
        )
    )
    print(
        f"step: {s['us_per_step_events_off']:.1f} µs off, "
        f"{s['us_per_step_events_published']:.1f} µs published "
        f"({s['events_per_step']:.1f} events/step): "
        f"+{s['overhead_us_per_event']:.2f} µs wall per event (median of {s['rounds']} "
        f"paired rounds; best runs: {s['overhead_us_per_event_best_runs']:+.2f}), "
        f"+{s['overhead_cpu_us_per_event']:.2f} µs CPU per event (all threads); "
        f"publisher {s['publisher']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
