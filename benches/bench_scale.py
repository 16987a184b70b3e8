"""Scale benchmark: a pool of 10 million blocks and a radix tree holding
100 million tokens — construction time, measured memory per block / per cached token,
and per-operation cost against a small instance of the same structure (target: within
2×).

Block pools (``HashChainCache``; ``RadixPrefixCache`` with ``--radix-prefix``), block
size 16, sizes 4,096 / 100,000 / 10,000,000 blocks:

- construction: ``HashChainCache(n, 16)`` wall time and RSS growth per block
  ("empty"; untouched zeroed pages are not resident yet);
- fill: ``admit`` + ``free`` of distinct 2,048-token prompts (a distinct first token,
  so every block hash is new) until every block has been cached once — the pool is
  then all idle cached blocks (``num_cached_blocks == n - 1`` for the hash chain,
  tree pages for the radix cache): fill time and RSS growth per block ("full");
- churn: ``--churn-rounds`` (default 12) more such rounds. Hash tables that see
  steady deletes and inserts accumulate tombstones and grow once more (hashbrown
  doubles a table whose spare room is used up while it is over half full), so this
  is where a long-running cache's memory settles ("after churn").
- per-op cost on the churned pools, interleaved, min over ``--repeats`` runs
  (default 7) of the per-run mean, each run a fresh seeded workload (same seeds for
  every size): 1,000 requests (20 shared system prompts of 1,000-4,000 tokens + a
  unique 50-500-token suffix, 100-300 decode tokens), at most 16 running, FIFO
  admission with a conservative free-block check: ``admit`` (partial hit), one
  ``append_batch`` per decode step for all running requests, ``free``; then 200
  evictions of idle cached blocks (hash chain: ``evict_blocks`` of 8 random idle
  cached blocks; radix: ``evict(128)``, whole leaves). Every allocation on a full
  pool evicts its LRU cached block, so the big pool pays its map removals too.
  Ratios are 10M / 100K (the 100K pool keeps the workload's system prompts cached as
  the 10M one does; the 4,096-block pool cannot, so its hit rate differs: reference
  only).

Radix tree (``RadixCache``, page size 1 and 16), sizes 100K / 10M / 100M tokens:

- construction: insert background sequences — ``size // 100,000`` shared system
  prompts (1,000-4,000 tokens, a distinct first token each), each followed by unique
  2,000-token suffixes, slots = token positions (int32) — until the tree holds the
  size: wall time, RSS growth per cached token, nodes;
- per-op cost (bench_radix's scale workload on top of the background, interleaved,
  min over repeats of the per-run mean, fresh seeded requests per run): per request
  ``match_prefix`` -> ``lock`` -> slots for the miss -> ``insert`` -> ``unlock`` ->
  ``evict`` back down to background + 200,000 tokens (µs per request; the evicted
  leaves are the background's oldest). Ratio 100M / 100K.

Each structure runs in its own subprocess (RSS figures are that structure's alone;
a warm-up first pays numpy's one-time allocations). Before the full-size runs, a run
at a tenth of the size measures memory per block / token, and the full size runs
only if the extrapolation fits in 60 % of ``MemAvailable``. On a shared small
machine expect ±30 % timing noise; the "call floor" is the binding's fixed cost in
the same run. ``--quick``: 20K vs 200K blocks, 10K vs 1M tokens, 200 requests,
2 repeats, 1 churn round (seconds).

Usage: python benches/bench_scale.py [--quick] [--json PATH] [--repeats R]
       [--requests N] [--radix-prefix] [--parts hash_chain,radix_prefix,radix1,radix16]
       [--churn-rounds K] [--no-probe]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import kvindex
from bench_radix import SlotPool, request_loop, timer_overhead, workload_parts
from bench_radix import workload as tree_workload

_PAGE = os.sysconf("SC_PAGE_SIZE")
BS = 16
MAX_RUNNING = 16
RADIX_CAP = 200_000  # tokens the workload may add on top of the background
TARGET_RATIO = 2.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------ block pools


def pool_workload(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt, decode tokens) per request: shared system prompt + unique suffix."""
    parts = workload_parts(n, seed, vocab=50_000)
    return [(np.concatenate([sp, suffix]), dec) for sp, suffix, dec in parts]


def make_pool(kind: str, n: int) -> Any:
    if kind == "hash_chain":
        return kvindex.HashChainCache(n, BS)
    return kvindex.RadixPrefixCache(n, BS)


def fill_pool(kind: str, cache: Any, rounds: int = 1, start: int = 0) -> int:
    """admit + free distinct 2,048-token prompts until every block has been cached
    ``rounds`` times over (the pool ends all idle cached blocks). Returns the number of
    prompts; pass ``start`` = prompts so far to continue with new ones."""
    n = cache.num_blocks
    base = np.random.default_rng(7).integers(0, 50_000, 2048, dtype=np.int32)
    per = len(base) // BS
    need = rounds * (-(-(n - 1) // per) + 1)
    for i in range(start, start + need):
        base[0] = 1_000_000 + i  # a distinct first block: every hash in the chain is new
        cache.admit(1, base)
        cache.free(1)
    return need


def blocks_for(n: int) -> int:
    return -(-n // BS)


def drive_pool(
    kind: str, cache: Any, reqs: list[tuple[np.ndarray, np.ndarray]], overhead: float, seed: int
) -> dict[str, float]:
    """One workload run; µs per call (timer overhead subtracted)."""
    pc = time.perf_counter_ns
    t = {"admit": 0, "append_batch": 0, "free": 0, "evict": 0}
    n_calls = {"admit": 0, "append_batch": 0, "free": 0, "evict": 0}
    pending = deque(range(len(reqs)))
    rid_base = seed * 1_000_000 + 10
    running: dict[int, int] = {}  # index -> decode tokens done
    hits = queries = 0
    gc_was = gc.isenabled()
    gc.disable()
    try:
        while pending or running:
            growth = sum(
                blocks_for(len(reqs[i][0]) + len(reqs[i][1])) - blocks_for(len(reqs[i][0]) + done)
                for i, done in running.items()
            )
            while pending and len(running) < MAX_RUNNING:
                i = pending[0]
                p, d = reqs[i]
                need = blocks_for(len(p) + len(d))
                if need + growth > cache.num_free_blocks:
                    break
                pending.popleft()
                t0 = pc()
                adm = cache.admit(rid_base + i, p)
                t1 = pc()
                assert adm is not None
                t["admit"] += t1 - t0
                n_calls["admit"] += 1
                hits += adm.num_cached_tokens
                queries += len(p)
                running[i] = 0
                growth += need - blocks_for(len(p))
            idx = list(running)
            ids = np.array([rid_base + i for i in idx], np.int64)
            toks = np.array([reqs[i][1][running[i]] for i in idx], np.int32)
            t0 = pc()
            ok = cache.append_batch(ids, toks)
            t1 = pc()
            assert ok
            t["append_batch"] += t1 - t0
            n_calls["append_batch"] += 1
            for i in idx:
                running[i] += 1
                if running[i] == len(reqs[i][1]):
                    del running[i]
                    t0 = pc()
                    cache.free(rid_base + i)
                    t1 = pc()
                    t["free"] += t1 - t0
                    n_calls["free"] += 1
        # evictions of idle cached blocks
        rng = np.random.default_rng(seed + 12345)
        nb = cache.num_blocks
        for _ in range(200):
            if kind == "hash_chain":
                ids_l: list[int] = []
                for _ in range(64):
                    b = int(rng.integers(1, nb))
                    if cache.ref_count(b) == 0 and cache.block_hash(b) is not None:
                        ids_l.append(b)
                        if len(ids_l) == 8:
                            break
                arr = np.array(ids_l, np.int64)
                t0 = pc()
                cache.evict_blocks(arr)
                t1 = pc()
            else:
                t0 = pc()
                cache.evict(128)
                t1 = pc()
            t["evict"] += t1 - t0
            n_calls["evict"] += 1
    finally:
        if gc_was:
            gc.enable()
    out = {k: (t[k] / max(1, n_calls[k]) - overhead) * 1e-3 for k in t}
    out["hit_rate"] = hits / max(1, queries)
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def warm_up() -> None:
    """First uses that allocate for the whole process (numpy's random generators cost
    ~6 MiB of RSS on first use), so that they do not count as the first structure's."""
    g = np.random.default_rng(0)
    toks = g.integers(0, 100, 64, dtype=np.int32)
    for kind in ("hash_chain", "radix_prefix"):
        c = make_pool(kind, 64)
        c.admit(1, toks)
        c.free(1)
    t = kvindex.RadixCache(1)
    t.insert(toks, np.arange(64, dtype=np.int32))
    gc.collect()


def pool_part(
    kind: str, sizes: list[int], n_requests: int, repeats: int, big: int, churn_rounds: int
) -> dict[str, Any]:
    warm_up()
    overhead = timer_overhead()
    res: dict[str, Any] = {"kind": kind, "sizes": sizes, "per_size": {}}
    caches = {}
    for n in sizes:
        gc.collect()
        r0 = rss_bytes()
        t0 = time.perf_counter()
        c = make_pool(kind, n)
        t_build = time.perf_counter() - t0
        r1 = rss_bytes()
        t0 = time.perf_counter()
        prompts = fill_pool(kind, c)
        t_fill = time.perf_counter() - t0
        r2 = rss_bytes()
        cached = c.num_cached_blocks
        # Churn: more rounds of distinct prompts. Hash tables fill up with deleted-entry
        # tombstones and grow once more (hashbrown); record where RSS settles.
        churn = []
        t0 = time.perf_counter()
        for _ in range(churn_rounds):
            prompts += fill_pool(kind, c, 1, start=prompts)
            churn.append(rss_bytes() - r0)
        t_churn = time.perf_counter() - t0
        if n <= 200_000:
            c.check_invariants()
        res["per_size"][str(n)] = {
            "build_s": t_build,
            "fill_s": t_fill,
            "fill_prompts": prompts,
            "rss_empty_bytes_per_block": (r1 - r0) / n,
            "rss_full_bytes_per_block": (r2 - r0) / n,
            "rss_full_mib": (r2 - r0) / 2**20,
            "churn_rounds": churn_rounds,
            "churn_s": t_churn,
            "rss_churn_bytes_per_block": (churn[-1] if churn else r2 - r0) / n,
            "rss_churn_series_mib": [x / 2**20 for x in churn],
            "cached_blocks": cached,
            "free_blocks": c.num_free_blocks,
        }
        caches[n] = c
        print(
            f"  {kind} {n:,} blocks: build {t_build:.3f} s, fill {t_fill:.1f} s, "
            f"{(r1 - r0) / n:.1f} B/block empty, {(r2 - r0) / n:.1f} B/block full, "
            f"{res['per_size'][str(n)]['rss_churn_bytes_per_block']:.1f} after "
            f"{churn_rounds} rounds of churn ({t_churn:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    for r in range(repeats):
        reqs = pool_workload(n_requests, seed=100 + r)
        for n in sizes:
            runs[n].append(drive_pool(kind, caches[n], reqs, overhead, seed=r + 1))
    for n in sizes:
        best = {k: min(x[k] for x in runs[n]) for k in ("admit", "append_batch", "free", "evict")}
        best["hit_rate"] = float(np.mean([x["hit_rate"] for x in runs[n]]))
        res["per_size"][str(n)]["us"] = best
        if n <= 200_000:
            caches[n].check_invariants()
    ref = str(sorted(s for s in sizes if s != big)[-1])
    res["ratio_ref"] = int(ref)
    res["ratios"] = {
        k: ratio(res["per_size"][str(big)]["us"][k], res["per_size"][ref]["us"][k])
        for k in ("admit", "append_batch", "free", "evict")
    }
    return res


# ------------------------------------------------------------------ radix tree


def build_tree(ps: int, size: int, seed: int = 9) -> tuple[Any, int, dict[str, float]]:
    """A tree of ``size`` tokens: shared system prompts + unique 2,000-token suffixes.
    Returns (tree, next free slot, figures)."""
    g = np.random.default_rng(seed)
    n_sys = max(1, size // 100_000)
    systems = []
    for _ in range(n_sys):
        n = int(g.integers(1000, 4001)) // ps * ps
        # A distinct first token per system prompt keeps them apart at the root.
        systems.append(np.concatenate([[len(systems) + 40_000], g.integers(0, 32_000, n - 1)]))
    gc.collect()
    r0 = rss_bytes()
    t0 = time.perf_counter()
    tree = kvindex.RadixCache(ps)
    slot = 0
    k = 0
    suffix_len = 2000
    while tree.total_size < size:
        sp = systems[k % n_sys]
        seq = np.empty(len(sp) + suffix_len, np.int32)
        seq[: len(sp)] = sp
        seq[len(sp) :] = g.integers(0, 32_000, suffix_len, dtype=np.int32)
        slots = np.arange(slot, slot + len(seq), dtype=np.int32)
        r = tree.insert(seq, slots)
        # Duplicate prefix slots (the shared system prompt) are never used again.
        slot += len(seq)
        del r
        k += 1
    t_build = time.perf_counter() - t0
    gc.collect()
    r1 = rss_bytes()
    figs = {
        "build_s": t_build,
        "tokens": tree.total_size,
        "nodes": tree.num_nodes,
        "sequences": k,
        "rss_mib": (r1 - r0) / 2**20,
        "rss_bytes_per_token": (r1 - r0) / tree.total_size,
    }
    return tree, slot, figs


class SlotStack(SlotPool):
    """Free slots (a numpy stack of pages) beyond and below the background's."""

    def __init__(self, first_slot: int, n_slots: int, ps: int, cap: int) -> None:
        self.ps = ps
        first_page = -(-first_slot // ps)
        n_pages = n_slots // ps
        self.pages = np.empty(cap // ps + n_pages, np.int32)
        self.pages[:n_pages] = np.arange(first_page + n_pages - 1, first_page - 1, -1)
        self.top = n_pages
        self.offs = np.arange(ps, dtype=np.int32)


def radix_part(
    ps: int, sizes: list[int], n_requests: int, repeats: int, big: int, radix_cap: int
) -> dict[str, Any]:
    warm_up()
    overhead = timer_overhead()
    res: dict[str, Any] = {"page_size": ps, "sizes": sizes, "per_size": {}, "cap": radix_cap}
    state = {}
    for size in sizes:
        tree, next_slot, figs = build_tree(ps, size)
        if size <= 1_000_000:
            tree.check_invariants()
        res["per_size"][str(size)] = figs
        # The workload's slots: fresh ones above the background (room for one run's
        # tokens beyond the cap) and evicted background slots coming back.
        headroom = radix_cap + 8192 + 16 * ps
        pool = SlotStack(next_slot + ps, headroom, ps, cap=next_slot + 16 * ps)
        state[size] = (tree, pool, tree.total_size + radix_cap)
        print(
            f"  radix page {ps} {size:,} tokens: build {figs['build_s']:.1f} s, "
            f"{figs['rss_bytes_per_token']:.2f} B/token, {figs['nodes']:,} nodes",
            file=sys.stderr,
            flush=True,
        )
    runs: dict[int, list[dict[str, float]]] = {s: [] for s in sizes}
    for r in range(repeats):
        reqs = tree_workload(n_requests, seed=200 + r)
        for size in sizes:
            tree, pool, cap = state[size]
            runs[size].append(request_loop(tree, pool, reqs, cap, overhead))
    keys = ("match", "insert", "evict_per_req", "evict_per_call", "lock_unlock")
    for size in sizes:
        best = {k: min(x[k] for x in runs[size]) for k in keys}
        best["hit_rate"] = float(np.mean([x["hit_rate"] for x in runs[size]]))
        res["per_size"][str(size)]["us"] = best
        if size <= 1_000_000:
            state[size][0].check_invariants()
    ref = str(min(sizes))
    res["ratio_ref"] = int(ref)
    res["ratios"] = {
        k: ratio(res["per_size"][str(big)]["us"][k], res["per_size"][ref]["us"][k])
        for k in ("match", "insert", "evict_per_req", "lock_unlock")
    }
    return res


def call_floor() -> float:
    """µs of a trivial getter through the binding."""
    import timeit

    c = kvindex.HashChainCache(8, BS)
    return min(timeit.repeat(lambda: c.num_free_blocks, number=20_000, repeat=5)) / 20_000 * 1e6


# ------------------------------------------------------------------ driver


def run_part(name: str, big: int, args: argparse.Namespace) -> dict[str, Any]:
    if name in ("hash_chain", "radix_prefix"):
        small = [4096, 20_000] if args.quick else [4096, 100_000]
        sizes = sorted(set(small + [big]))
        return pool_part(name, sizes, args.requests, args.repeats, big, args.churn_rounds)
    ps = int(name.removeprefix("radix"))
    cap = 50_000 if args.quick else RADIX_CAP
    return radix_part(ps, sorted({args.small_tokens, big}), args.requests, args.repeats, big, cap)


def run_sub(name: str, big: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--part", name, "--big", str(big)]
        cmd += ["--json", out, "--repeats", str(args.repeats), "--requests", str(args.requests)]
        cmd += ["--small-tokens", str(args.small_tokens)] + (["--quick"] if args.quick else [])
        cmd += ["--churn-rounds", str(args.churn_rounds)]
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
        if rc != 0 or not os.path.exists(out):
            raise SystemExit(f"part {name} ({big:,}) failed with exit code {rc}")
        with open(out) as f:
            return json.load(f)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (CI): seconds")
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--parts", default="hash_chain,radix1,radix16")
    ap.add_argument("--radix-prefix", action="store_true", help="also the RadixPrefixCache pool")
    ap.add_argument("--no-probe", action="store_true", help="skip the tenth-size memory probe")
    ap.add_argument(
        "--churn-rounds",
        type=int,
        default=None,
        help="pools: further rounds of distinct prompts after the fill (default 12, quick 1)",
    )
    # internal: one part in this process
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--big", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--small-tokens", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.requests is None:
        args.requests = 200 if args.quick else 1000
    if args.churn_rounds is None:
        args.churn_rounds = 1 if args.quick else 12
    if args.small_tokens is None:
        args.small_tokens = 10_000 if args.quick else 100_000
    if args.part:
        r = run_part(args.part, args.big, args)
        with open(args.json, "w") as f:
            json.dump(r, f)
        return

    parts = args.parts.split(",")
    if args.radix_prefix and "radix_prefix" not in parts:
        parts.insert(1, "radix_prefix")
    target = {"hash_chain": 10_000_000, "radix_prefix": 10_000_000}
    if args.quick:
        target = {"hash_chain": 200_000, "radix_prefix": 200_000}
    results: dict[str, Any] = {
        "quick": args.quick,
        "repeats": args.repeats,
        "requests": args.requests,
        "python": platform.python_version(),
        "kvindex": kvindex.__version__,
        "cpus": os.cpu_count(),
        "call_floor_us": call_floor(),
        "parts": {},
    }
    for name in parts:
        big = target.get(name, 1_000_000 if args.quick else 100_000_000)
        entry: dict[str, Any] = {}
        if not args.quick and not args.no_probe:
            probe = run_sub(name, big // 10, args)
            entry["probe"] = probe
            per = probe["per_size"][str(big // 10)]
            unit = per.get("rss_bytes_per_token", per.get("rss_churn_bytes_per_block", 0.0))
            est = unit * big
            avail = mem_available()
            entry["estimated_bytes"] = est
            print(
                f"{name}: {big // 10:,} costs {unit:.1f} B/unit -> {big:,} needs "
                f"~{est / 2**30:.2f} GiB (available {avail / 2**30:.1f} GiB)",
                file=sys.stderr,
                flush=True,
            )
            if est > 0.6 * avail:
                entry["skipped"] = f"needs ~{est / 2**30:.1f} GiB, available {avail / 2**30:.1f}"
                results["parts"][name] = entry
                continue
        t0 = time.perf_counter()
        entry["full"] = run_sub(name, big, args)
        entry["wall_s"] = time.perf_counter() - t0
        results["parts"][name] = entry
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def rows(entry: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """Table rows: every size of the full run, and the probe run's largest size."""
    full = entry["full"]
    out = [(full, n) for n in full["sizes"]]
    if "probe" in entry:
        pbig = max(entry["probe"]["sizes"])
        out.insert(len(out) - 1, (entry["probe"], pbig))
    return out


def report(results: dict[str, Any]) -> None:
    print(f"\nCall floor (a getter): {results['call_floor_us']:.3f} µs\n")
    for name, entry in results["parts"].items():
        if "skipped" in entry:
            print(f"{name}: skipped ({entry['skipped']})\n")
            continue
        runs = [entry["probe"]] if "probe" in entry else []
        runs.append(entry["full"])
        if name in ("hash_chain", "radix_prefix"):
            print(f"### {name}: pools of {BS}-token blocks (µs per call, min of repeats)\n")
            print(
                "| blocks | build s | fill s | B/block empty | B/block full | B/block after "
                "churn | admit | append_batch | free | evict | hit rate |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for run, n in rows(entry):
                p = run["per_size"][str(n)]
                u = p["us"]
                tag = "" if run is entry["full"] else " (probe run)"
                print(
                    f"| {n:,}{tag} | {p['build_s']:.3f} | {p['fill_s']:.1f} | "
                    f"{p['rss_empty_bytes_per_block']:.1f} | "
                    f"{p['rss_full_bytes_per_block']:.1f} | "
                    f"{p['rss_churn_bytes_per_block']:.1f} | {u['admit']:.2f} | "
                    f"{u['append_batch']:.2f} | {u['free']:.2f} | {u['evict']:.2f} | "
                    f"{u['hit_rate']:.3f} |"
                )
            keys = ("admit", "append_batch", "free", "evict")
        else:
            print(f"### radix tree, page size {entry['full']['page_size']} (µs per request)\n")
            print(
                "| tokens | build s | B/token | nodes | match | insert | evict /req | "
                "evict /call | lock+unlock | hit rate |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for run, n in rows(entry):
                p = run["per_size"][str(n)]
                u = p["us"]
                tag = "" if run is entry["full"] else " (probe run)"
                print(
                    f"| {p['tokens']:,}{tag} | {p['build_s']:.2f} | "
                    f"{p['rss_bytes_per_token']:.2f} | {p['nodes']:,} | {u['match']:.2f} | "
                    f"{u['insert']:.2f} | {u['evict_per_req']:.2f} | "
                    f"{u['evict_per_call']:.2f} | {u['lock_unlock']:.2f} | "
                    f"{u['hit_rate']:.3f} |"
                )
            keys = ("match", "insert", "evict_per_req", "lock_unlock")
        for run in runs:
            big = max(run["sizes"])
            rat = run["ratios"]
            cells = ", ".join(
                f"{k} {rat[k]:.2f}×{'' if rat[k] <= TARGET_RATIO else ' (OVER 2×)'}" for k in keys
            )
            print(f"\nratio {big:,} / {run['ratio_ref']:,}: {cells}")
        print()


if __name__ == "__main__":
    main()
