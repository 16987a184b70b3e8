"""``kvindex simulate --cluster W --route LIST``: W engine replicas behind a router.

Each engine is a kvindex cache of the chosen design (``--design``: ``hash_chain``, a
``HashChainCache`` hashing with ``--hash``; ``radix``, a ``RadixPrefixCache`` evicting by
``--policy``; both by default, one report section each) with the block size, a
``--cluster-blocks`` pool, ``enable_events`` and an :class:`~kvindex.events.EventPublisher`
on its own ipc endpoints (replay included); one :class:`~kvindex.cluster.ClusterListener`
feeds a :class:`~kvindex.ClusterIndex` from all of them over real ZMQ sockets, and a
:class:`~kvindex.cluster.Router` places every arriving request. The index hashes prompts
as the engines' events do: the hash chain's algorithm, or ``radix_xxh3_64`` (the radix
tree's namespaced page chain) for radix engines.

The engine model is a compact continuous-batching loop, per step and engine: decode one
token for every running request (one ``append_batch``; when blocks run short the newest
request is preempted: freed and put back at the front of its queue, to be recomputed),
free finished requests, admit from the queue in order while fewer than ``--max-running``
run and the step's token budget (``--max-batched-tokens``) lasts (a prompt is prefilled
within its admission step, and cached then: the hash chain caches full blocks at
admission, a radix engine inserts the prompt with ``checkpoint`` as SGLang does when a
prefill completes), then publish the step's events. Follow-up turns arrive their
think time after the turn they follow finishes. Before requests are routed, the index is
brought up to date with every batch published so far (the router sees the last step).

Reported per policy: cluster hit rate (prompt tokens served from the chosen engine's cache),
prefill tokens, load imbalance (max/mean running and queued, averaged over steps), mean
queueing delay (steps from arrival to admission), index cost per block event (the
listener's ``apply`` calls) and per routing decision, batches repaired or lost. Two
reference rows: ``global`` (one engine with W times the pool, running limit and budget:
the upper bound) and per-node caches under ``random`` routing (Mooncake's comparison).
With ``check``, every step compares the index with each engine's own cache (raises on a
difference): the set of block hashes each engine holds (a hash-chain engine's cached
blocks' hashes, a radix engine's ``cached_page_hashes``) equals the index's
``worker_blocks``, and for the step's newly routed prompts the leading blocks the index
says each engine holds equal what the engine's ``lookup`` hits.

With ``faults`` (``--faults``), every engine's stream and replay pass through a
:class:`~kvindex.simulate.faults.FaultProxy` that drops, garbles, duplicates and injects
messages and delays, swallows or garbles replay answers; each routing policy runs twice,
with recovery (snapshot endpoints and heartbeats) and without (replay only, vLLM 0.33's
protocol). Every 10 steps the index is compared with each engine's cache: the report
gives the share of engine samples on which they differ and the mean number of blocks
they differ by, beside the hit rate.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex._core import ClusterIndex, HashChainCache, RadixPrefixCache
from kvindex.cluster import POLICIES, Decision, Router
from kvindex.protocol import DESIGNS
from kvindex.simulate.cluster_report import ClusterResult, cluster_report, faults_report
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.faults import FaultProxy, Faults, parse_faults
from kvindex.simulate.options import parse_designs, parse_ints
from kvindex.simulate.workloads import Workload, chat_workload

__all__ = ["ClusterResult", "run_cluster", "simulate_cluster"]

#: The index's query scheme for radix engines (the tree's KV-event page hashes).
RADIX_ALGO = "radix_xxh3_64"


@dataclass
class _Req:
    rid: int
    prompt: np.ndarray
    output: np.ndarray
    arrived: int
    decision: Decision | None = None
    done: int = 0  # output tokens computed


# Steps between two comparisons of the index with the engines' caches (with faults).
_STALE_EVERY = 10


class _Engine:
    def __init__(
        self,
        i: int,
        blocks: int,
        bs: int,
        cache_kw: dict[str, Any],
        tmp: str,
        publish: bool,
        recovery: bool = False,
    ) -> None:
        self.cache: Any
        self.radix = "algo" not in cache_kw
        if not self.radix:
            self.cache = HashChainCache(blocks + 1, bs, enable_events=publish, **cache_kw)
        else:
            self.cache = RadixPrefixCache(blocks + 1, bs, enable_events=publish, **cache_kw)
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.pub: Any = None
        if publish:
            from kvindex.events import EventPublisher

            extra: dict[str, Any] = {}
            if recovery:
                extra = {
                    "snapshot_endpoint": f"ipc://{tmp}/engine{i}-snap",
                    "heartbeat_interval": 0.05,
                    "block_size": bs,
                }
            self.pub = EventPublisher(
                f"ipc://{tmp}/engine{i}", replay_endpoint=f"ipc://{tmp}/engine{i}-replay", **extra
            )

    def held(self) -> npt.NDArray[np.uint64]:
        """The block hashes this engine's cache holds, sorted."""
        if self.radix:
            return np.unique(self.cache.cached_page_hashes())
        return np.array(_cache_blocks(self.cache), dtype=np.uint64)


def _check_index(
    step: int,
    engines: list[_Engine],
    index: ClusterIndex,
    routed: list[np.ndarray],
    new: int,
) -> None:
    """The brute-force oracle: the index against every engine's own cache. The block
    hashes each engine holds, as a set (hash chain: its cached blocks' hashes; radix: the
    tree's page hashes), and the step's ``new`` prompts (the last of ``routed``) by
    lookup."""
    bs = index.block_size
    for slot, e in enumerate(engines):
        held = index.worker_blocks(slot)
        if e.radix:
            same = np.array_equal(held, e.cache.cached_page_hashes())
        else:
            same = held.tolist() == _cache_blocks(e.cache)
        if not same:
            raise AssertionError(f"step {step}: the index disagrees with engine {slot}")
    for p in routed[len(routed) - new :]:
        # The first k full blocks, k < len(p) / bs: the cache's lookup of k * bs + 1 tokens
        # counts exactly those blocks (a hit leaves the last token to compute).
        k = (len(p) - 1) // bs
        if k == 0:
            continue
        ov = index.overlaps(p[: k * bs])
        for slot, e in enumerate(engines):
            hit = e.cache.lookup(p[: k * bs + 1])
            if int(ov[slot]) * bs != hit:
                raise AssertionError(
                    f"step {step}: engine {slot} hits {hit} tokens of a prompt, the index "
                    f"says {int(ov[slot])} blocks of {bs}"
                )


def _cache_blocks(cache: HashChainCache) -> list[int]:
    out = set()
    for b in range(1, cache.num_blocks):
        h = cache.block_hash(b)
        if h is not None:
            out.add(int.from_bytes(h[-8:], "big"))
    return sorted(out)


def simulate_cluster(
    workload: Workload,
    workers: int,
    route: str,
    *,
    blocks: int = 2048,
    block_size: int = 16,
    max_running: int = 64,
    max_batched_tokens: int = 8192,
    design: str = "hash_chain",
    algo: str = "xxh3_128",
    policy: str = "lru",
    seed: int = 0,
    check: bool = False,
    progress: Callable[[int], None] | None = None,
    faults: Faults | None = None,
    recovery: bool = True,
) -> ClusterResult:
    """Runs ``workload`` on ``workers`` engines of ``design`` (``algo``: the hash chain's
    hash; ``policy``: the radix tree's eviction) routed by ``route``; with ``faults``
    through a fault-injecting proxy, ``recovery`` saying whether snapshots and heartbeats
    are on; see the module docstring. Raises ``SimulationError`` for an unknown route or
    design, a running limit or step budget below 1 (no request could ever be admitted),
    or a pool that cannot hold a request."""
    if route not in POLICIES:
        raise SimulationError(f"unknown route {route!r}; expected one of {', '.join(POLICIES)}")
    if design not in DESIGNS:
        raise SimulationError(f"unknown design {design!r}; expected one of {', '.join(DESIGNS)}")
    if max_running < 1:
        raise SimulationError(f"max_running must be >= 1, got {max_running}")
    if max_batched_tokens < 1:
        raise SimulationError(f"max_batched_tokens must be >= 1, got {max_batched_tokens}")
    need = max(-(-(r.prompt_len + r.output_len) // block_size) for r in workload.requests)
    if need > blocks:
        raise SimulationError(f"a request needs {need} blocks; the pool has {blocks}")
    t_start = time.perf_counter()
    res = ClusterResult(route, workers, design, block_size)
    events = route != "approx"
    faulty = faults is not None and events
    recover = faulty and recovery
    cache_kw: dict[str, Any] = {"algo": algo} if design == "hash_chain" else {"policy": policy}
    index = ClusterIndex(block_size, algo=algo if design == "hash_chain" else RADIX_ALGO)
    with tempfile.TemporaryDirectory(prefix="kvindex-cluster-") as tmp:
        engines = [
            _Engine(i, blocks, block_size, cache_kw, tmp, events, recover) for i in range(workers)
        ]
        listener: Any = None
        proxy: FaultProxy | None = None
        warm: dict[str, int] = {}
        if events:
            from kvindex.cluster import ClusterListener

            listener = ClusterListener(index, replay_timeout=0.2 if faulty else 2.0)
            if faulty:
                proxy = FaultProxy(tmp, seed)
            for i, e in enumerate(engines):
                ep, rep = e.pub.endpoint, e.pub.replay_endpoint
                if proxy is not None:
                    proxy.attach(f"engine{i}", ep, rep)
                    ep, rep = proxy.endpoints(f"engine{i}")
                listener.add_worker(
                    f"engine{i}",
                    ep,
                    replay_endpoint=rep,
                    snapshot_endpoint=e.pub.snapshot_endpoint,
                )
            _warm_up(engines, index)
            _sync(engines, index, listener)
            warm = listener.stats
            if proxy is not None:
                proxy.set_all(faults)
        else:
            for i in range(workers):
                index.add_worker(f"engine{i}")
        router = Router(index, route, seed=seed)
        try:
            _loop(
                workload,
                engines,
                index,
                router,
                listener,
                res,
                max_running,
                max_batched_tokens,
                check,
                progress,
                faulty,
            )
        finally:
            if proxy is not None:
                ps = proxy.stats
                res.extra["injected"] = {
                    "dropped": ps.dropped,
                    "corrupted": ps.corrupted,
                    "duplicated": ps.duplicated,
                    "bad_messages": ps.injected,
                    "replay_faults": ps.replay_faults,
                }
                res.extra["recovery"] = recover
            if listener is not None:
                listener.close()
                if faulty:
                    st_all = listener.stats
                    res.extra["snapshots"] = st_all["snapshots"] - warm.get("snapshots", 0)
                    res.extra["bad_frames"] = st_all["bad_frames"]
                    res.extra["degraded_at_end"] = index.statuses().count("degraded")
                st = {k: v - warm.get(k, 0) for k, v in listener.stats.items()}
                res.repaired, res.lost, res.batches = st["repaired"], st["given_up"], st["applied"]
                for slot in range(workers):
                    info = index.worker_info(slot)
                    res.block_events += info["stored"] + info["removed"]
                res.index_ns_per_event = st["apply_ns"] / max(res.block_events, 1)
            for e in engines:
                if e.pub is not None:
                    e.pub.close()
            if proxy is not None:
                proxy.close()
    res.wall_s = time.perf_counter() - t_start
    return res


def _warm_up(engines: list[_Engine], index: ClusterIndex) -> None:
    """ZMQ's slow joiner: each engine publishes an empty-cache batch until one lands (the
    first batch then either arrived or is repaired through replay)."""
    from kvindex.events import AllBlocksCleared

    deadline = time.monotonic() + 10.0
    for slot, e in enumerate(engines):
        while index.worker_info(slot)["next_seq"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine {slot}'s event stream never reached the index")
            e.pub.publish_events([AllBlocksCleared()])
            time.sleep(0.002)


def _sync(engines: list[_Engine], index: ClusterIndex, listener: Any, wait: float = 5.0) -> None:
    """Waits (at most ``wait`` seconds) until the index has every batch the engines
    published."""
    if listener is None:
        return
    deadline = time.monotonic() + wait
    for slot, e in enumerate(engines):
        want = e.pub.next_seq
        while index.worker_info(slot)["next_seq"] < want:
            if time.monotonic() > deadline:
                return  # late batches are the listener's to repair or give up
            time.sleep(0.0001)


def _loop(
    workload: Workload,
    engines: list[_Engine],
    index: ClusterIndex,
    router: Router,
    listener: Any,
    res: ClusterResult,
    max_running: int,
    budget_per_step: int,
    check: bool,
    progress: Callable[[int], None] | None,
    faulty: bool = False,
) -> None:
    reqs = workload.requests
    # With faults a batch may never arrive (lost, or a stream cut off): wait less.
    sync_s = 0.05 if faulty else 5.0
    samples = differ = diff_blocks = 0
    followers, arrivals = workload.arrival_queue()
    finished = 0
    step = 0
    route_ns = 0
    delays = 0
    run_ratio = queue_ratio = 0.0
    routed: list[np.ndarray] = []
    routed_before = 0
    while finished < len(reqs):
        if all(not e.running and not e.waiting for e in engines):
            if not arrivals:
                raise RuntimeError("cluster simulation stalled")  # pragma: no cover - a bug
            # Every engine is idle: the steps until the next arrival change nothing (no
            # decode, no admission, no event), so time jumps to it.
            step = max(step, arrivals[0][0])
        if arrivals and arrivals[0][0] <= step:
            _sync(engines, index, listener, sync_s)
        while arrivals and arrivals[0][0] <= step:
            _, rid = heapq.heappop(arrivals)
            rq = _Req(rid, workload.prompt(rid), workload.output(rid), step)
            t0 = time.perf_counter_ns()
            d = router.route(rq.prompt)
            route_ns += time.perf_counter_ns() - t0
            assert d is not None
            rq.decision = d
            if check:
                routed.append(rq.prompt)
            res.flagged_decisions += d.flagged
            engines[d.worker].waiting.append(rq)
        for e in engines:
            c = e.cache
            # decode
            while True:
                dec = [q for q in e.running if q.done < len(q.output)]
                if not dec:
                    break
                ids = np.array([q.rid for q in dec], dtype=np.int64)
                toks = np.array([q.output[q.done] for q in dec], dtype=np.int32)
                if c.append_batch(ids, toks):
                    for q in dec:
                        q.done += 1
                    break
                victim = e.running.pop()
                c.free(victim.rid)
                victim.done = 0
                e.waiting.appendleft(victim)
                res.preemptions += 1
            # finish
            keep = []
            for q in e.running:
                if q.done >= len(q.output):
                    c.free(q.rid)
                    finished += 1
                    if q.decision is not None:
                        router.finish(q.decision)
                    for f in followers.get(q.rid, ()):
                        heapq.heappush(arrivals, (step + 1 + reqs[f].arrival, f))
                    if progress is not None:
                        progress(1)
                else:
                    keep.append(q)
            e.running = keep
            # admit
            budget = budget_per_step
            while e.waiting and len(e.running) < max_running and budget > 0:
                q = e.waiting[0]
                prompt = q.prompt if q.done == 0 else np.concatenate([q.prompt, q.output[: q.done]])
                adm = c.admit(q.rid, prompt)
                if adm is None:
                    break
                e.waiting.popleft()
                if e.radix:
                    c.checkpoint(q.rid)  # prefilled this step: SGLang caches it now
                hit = adm.num_cached_tokens
                if q.done == 0 and q.decision is not None and q.arrived >= 0:
                    res.requests += 1
                    res.prompt_tokens += len(prompt)
                    res.hit_tokens += hit
                    delays += step - q.arrived
                    q.arrived = -1
                res.prefill_tokens += len(prompt) - hit
                budget -= len(prompt) - hit
                e.running.append(q)
            if e.pub is not None:
                e.pub.publish(c, ts=float(step))
        if faulty and step % _STALE_EVERY == 0:
            _sync(engines, index, listener, sync_s)
            for slot, e in enumerate(engines):
                off = int(np.setxor1d(index.worker_blocks(slot), e.held()).size)
                samples += 1
                differ += off > 0
                diff_blocks += off
        if check and listener is not None:
            _sync(engines, index, listener)
            _check_index(step, engines, index, routed, len(routed) - routed_before)
            routed_before = len(routed)
        running = [len(e.running) for e in engines]
        queued = [len(e.waiting) for e in engines]
        if sum(running):
            run_ratio += max(running) / (sum(running) / len(engines))
        if sum(queued):
            queue_ratio += max(queued) / (sum(queued) / len(engines))
        step += 1
    res.steps = step
    res.imbalance_running = run_ratio / step
    res.imbalance_queued = queue_ratio / step
    res.mean_queue_delay = delays / max(res.requests, 1)
    res.route_ns_per_decision = route_ns / max(res.requests, 1)
    if faulty:
        res.extra["stale_share"] = differ / max(samples, 1)
        res.extra["stale_blocks"] = diff_blocks / max(samples, 1)


def run_cluster(args: argparse.Namespace) -> int:
    """The ``--cluster`` mode of ``kvindex simulate``: per design (``--design``; both by
    default) one section with a row per ``--route`` policy plus the ``global`` pool;
    ``--json`` writes every figure, ``--plot`` draws them."""
    workers = int(args.cluster)
    routes = [r.strip() for r in str(args.route).split(",") if r.strip()]
    for r in routes:
        if r not in POLICIES:
            raise ValueError(f"--route: unknown policy {r!r}; expected {', '.join(POLICIES)}")
    if not routes:
        raise ValueError("--route: no policy given")
    if workers < 1:
        raise ValueError(f"--cluster must be >= 1, got {workers}")
    seed = int(getattr(args, "seed", None) or 0)
    workload: Workload
    if getattr(args, "trace", None):
        from kvindex.simulate.trace import read_mooncake_trace

        workload = read_mooncake_trace(
            args.trace,
            step_ms=args.step_ms if args.step_ms is not None else 20.0,
            limit=args.requests,
            tokens_per_hash=getattr(args, "tokens_per_hash", None) or 512,
        )
    else:
        workload = chat_workload(getattr(args, "requests", None) or 1000, seed)
    sizes = parse_ints(str(getattr(args, "block_size", None) or 16), "block size")
    designs = parse_designs(str(getattr(args, "design", None) or ",".join(DESIGNS)), sizes)
    kw: dict[str, Any] = {
        "blocks": int(args.cluster_blocks),
        "max_running": int(getattr(args, "max_running", 64)),
        "max_batched_tokens": int(getattr(args, "max_batched_tokens", 8192)),
        "algo": getattr(args, "hash", None) or "xxh3_128",
        "policy": getattr(args, "policy", None) or "lru",
        "seed": seed,
    }
    faults = parse_faults(str(args.faults)) if getattr(args, "faults", None) else None
    from kvindex.simulate.progress import Progress

    # With faults each event-fed policy runs with recovery and without.
    modes = [True, False] if faults is not None else [True]
    plan = [
        (d, bs, r, workers, m)
        for d, bs in designs
        for r in [*routes, "global"]
        for m in (modes if r not in ("global", "approx") else [True])
    ]
    bar = Progress(len(plan) * len(workload), enabled=not args.quiet and sys.stderr.isatty())
    results: list[ClusterResult] = []
    try:
        for design, bs, r, w, recovery in plan:
            bar.set_label(f"{design}@{bs} {r} x{w if r != 'global' else 1}")
            run_kw = dict(kw, design=design, block_size=bs)
            if r == "global":
                run_kw["blocks"] *= workers
                run_kw["max_running"] *= workers
                run_kw["max_batched_tokens"] *= workers
                res = simulate_cluster(workload, 1, "round_robin", progress=bar.advance, **run_kw)
                res.route = "global"
            else:
                res = simulate_cluster(
                    workload,
                    w,
                    r,
                    progress=bar.advance,
                    faults=faults,
                    recovery=recovery,
                    **run_kw,
                )
                if faults is not None and r != "approx":
                    res.route = f"{r}{'+' if recovery else '-'}recovery"
            results.append(res)
    finally:
        bar.close()
    print(cluster_report(results, workers, kw))
    if faults is not None:
        print()
        print(faults_report(results, faults))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "workload": workload.summary(),
                    "settings": {
                        **kw,
                        "designs": [list(d) for d in designs],
                        "faults": None if faults is None else vars(faults),
                    },
                    "runs": [r.as_dict() for r in results],
                },
                f,
                indent=1,
            )
    if getattr(args, "plot", None):
        from kvindex.simulate.cluster_plot import plot_cluster

        plot_cluster(results, workers, args.plot, title=str(workload.summary().get("name", "")))
    return 0
