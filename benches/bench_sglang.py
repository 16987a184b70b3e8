"""Per-request cost of SGLang 0.5.23's prefix cache through the seam its scheduler calls
(``BasePrefixCache``): kvindex's backend (``--radix-cache-backend kvindex``) against SGLang's
default ``UnifiedRadixCache`` (and, with ``--with-radix``, its ``RadixCache``), one process,
interleaved rounds, the same request stream, the same hits.

One request: ``evict`` when the pool is short (memory pressure), ``match_prefix``, ``lock``
of the matched node, ``path_device_indices`` of the hit, allocation of the rest,
``insert`` of the whole sequence, free of the duplicates it exposes, ``unlock``. Requests
share a few system prompts (hits) and the pool holds about a quarter of what they
insert, so the caches evict all the time. Every round checks that each backend saw the
same hit length for every request.

``--with-floor`` adds the seam's floor: ``SeamFloor``, the cheapest ``BasePrefixCache``
that meets the contract the scheduler relies on (a ``MatchResult`` per match, a
``TreeLock`` per lock, a device-index tensor per ``path_device_indices``, an
``InsertResult`` per insert) while doing no tree work: it never hits, and its pool holds
the whole stream, so it never evicts (it could only evict by giving slots back through
SGLang's allocator, as every backend does). What it costs per request is what any
backend behind this seam pays before its own work; the allocator's frees under memory
pressure come on top.

``--clock cpu`` times with this thread's CPU clock (``time.thread_time``) instead of the
wall clock: on a loaded machine it leaves out the time the process waits for a core.

Needs the SGLang environment (``make sglang-suite`` builds it):

    . .sglang-env/env.sh && .sglang-env/venv/bin/python benches/bench_sglang.py

``UnifiedRadixCache``'s tree core is SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND's (``rust``,
SGLang's default, or ``python``); SGLang's bundled Rust tree core is built for torch 2.14
and misreads tensors under another torch, where the bench reports it and stops (run with
``python`` there).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import time
import warnings
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations" / "sglang"))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import (
        BasePrefixCache,
        DecLockRefParams,
        DecLockRefResult,
        EvictParams,
        EvictResult,
        IncLockRefResult,
        InsertParams,
        InsertResult,
        MatchPrefixParams,
        MatchResult,
        TreeLock,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_driver import make_cache


class SeamFloor(BasePrefixCache):
    """The seam's floor: SGLang's objects and allocator frees, no tree (never hits)."""

    def __init__(self, params: Any) -> None:
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.disable = False
        self.root_node = 0
        self._held: collections.deque[Any] = collections.deque()
        self._empty = torch.empty((0,), dtype=torch.int64)
        self._receipt = DecLockRefParams()

    def reset(self) -> None:
        self._held.clear()

    def match_prefix(self, params: Any) -> Any:
        return MatchResult(
            device_prefix_len=0, last_device_node=0, last_host_node=0, best_match_node=0
        )

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        raise NotImplementedError

    def insert(self, params: Any) -> Any:
        self._held.append(params.value)
        return InsertResult(prefix_len=0)

    def evict(self, params: Any) -> Any:
        evicted = 0
        free = self.token_to_kv_pool_allocator.free_segment
        while evicted < params.num_tokens and self._held:
            value = self._held.popleft()
            free(value, start_pos=0)
            evicted += len(value)
        return EvictResult(num_tokens_evicted=evicted)

    def inc_lock_ref(self, node: Any) -> Any:
        return IncLockRefResult(delta=0)

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        return DecLockRefResult(delta=0)

    def lock(self, node: Any) -> Any:
        return TreeLock(node, self._receipt)

    def unlock(self, lock: Any) -> None:
        pass

    def path_device_indices(self, node: Any) -> Any:
        return self._empty

    def total_size(self) -> int:
        return 0


def stream(
    seed: int, n: int, prefixes: int, prefix_len: int, tail_len: int, vocab: int
) -> list[array[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(prefix_len)] for _ in range(prefixes)]
    return [
        array(
            "q",
            rng.choice(systems)
            + [rng.randrange(vocab) for _ in range(rng.randrange(tail_len // 2, tail_len))],
        )
        for _ in range(n)
    ]


def run(
    cache: Any,
    alloc: Any,
    reqs: list[array[int]],
    page_size: int,
    clock: Any = time.perf_counter,
) -> tuple[float, float, list[int]]:
    """Seconds for all requests, seconds inside the cache's calls alone (what the cache
    costs: the allocator's alloc / free and the tensor concatenation excluded, the frees an
    eviction makes included), and each request's hit length."""
    hits = []
    ps = page_size
    in_cache = 0.0
    t0 = clock()
    for tokens in reqs:
        n = len(tokens) // ps * ps
        key = RadixKey(tokens[:n])
        a = clock()
        if alloc.available_size() < n:
            cache.evict(EvictParams(num_tokens=n - alloc.available_size()))
        m = cache.match_prefix(MatchPrefixParams(key=key))
        node = m.last_device_node
        lock = cache.lock(node)
        hit = m.device_prefix_len
        prefix = cache.path_device_indices(node)[:hit]
        b = clock()
        fresh = alloc.alloc(n - hit)
        values = torch.cat((prefix, fresh))
        c = clock()
        r = cache.insert(InsertParams(key=key, value=values))
        d = clock()
        if r.prefix_len > hit:
            alloc.free(values[hit : r.prefix_len])
        e = clock()
        cache.unlock(lock)
        in_cache += (b - a) + (d - c) + (clock() - e)
        hits.append(hit)
    return clock() - t0, in_cache, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--page-sizes", default="1,16")
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--tail-len", type=int, default=512)
    ap.add_argument("--with-radix", action="store_true", help="also SGLang's RadixCache")
    ap.add_argument(
        "--with-floor", action="store_true", help="also the seam's floor (SeamFloor, no tree)"
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter; cpu: this thread's CPU time (time.thread_time)",
    )
    args = ap.parse_args()
    core = os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "rust")
    backends = (
        ["unified", "kvindex"]
        + (["radix"] if args.with_radix else [])
        + (["floor"] if args.with_floor else [])
    )
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(
        f"SGLang UnifiedRadixCache tree core: {core}; torch {torch.__version__}; clock {args.clock}"
    )
    for ps in [int(x) for x in args.page_sizes.split(",")]:
        reqs = stream(ps, args.requests, args.prefixes, args.prefix_len, args.tail_len, 32000)
        total = sum(len(r) for r in reqs)
        kv_size = (total // 4) // ps * ps + args.prefix_len * 4
        per_req: dict[str, list[float]] = {b: [] for b in backends}
        per_cache: dict[str, list[float]] = {b: [] for b in backends}
        ref_hits: list[int] | None = None
        for rnd in range(args.rounds):
            order = backends if rnd % 2 == 0 else backends[::-1]
            for b in order:
                world = "kvindex" if b == "floor" else b
                pool = total // ps * ps + ps if b == "floor" else kv_size
                cache, alloc, _ = make_cache(world, page_size=ps, kv_size=pool, max_context_len=8)
                if b == "floor":
                    cache = SeamFloor(cache)
                try:
                    secs, cache_secs, hits = run(cache, alloc, reqs, ps, clock)
                except ValueError as e:
                    sys.exit(f"{b} (tree core {core}) failed: {e}")
                if b == "floor":
                    pass  # never hits, by construction
                elif ref_hits is None:
                    ref_hits = hits
                elif hits != ref_hits:
                    sys.exit(f"{b} saw different hits than the first backend (page {ps})")
                per_req[b].append(secs / len(reqs) * 1e6)
                per_cache[b].append(cache_secs / len(reqs) * 1e6)
        assert ref_hits is not None
        hit_rate = sum(ref_hits) / sum(len(r) // ps * ps for r in reqs)
        for what, table in (("whole request", per_req), ("cache calls", per_cache)):
            med = {b: statistics.median(v) for b, v in table.items()}
            line = ", ".join(f"{b} {med[b]:.1f} µs" for b in backends)
            print(
                f"page {ps} ({what}): {args.requests} requests x {args.rounds} rounds, "
                f"hit rate {hit_rate:.0%}, pool {kv_size} tokens: {line}; "
                f"unified/kvindex {med['unified'] / med['kvindex']:.1f}x"
                + (
                    f", unified/floor {med['unified'] / med['floor']:.1f}x"
                    if "floor" in med
                    else ""
                )
                + (
                    f", radix/kvindex {med['radix'] / med['kvindex']:.1f}x"
                    if "radix" in med
                    else ""
                )
            )


if __name__ == "__main__":
    main()
