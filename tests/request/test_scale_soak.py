"""Quick versions of the scale and soak benches (full-size runs:
``benches/bench_scale.py`` and ``benches/bench_soak.py``, figures in the "Scale and soak"
section of ``benches/RESULTS.md``).

Soak: 200,000 mixed ops per cache through the same driver as the bench, with the
exact accounting identity checked after every op and ``check_invariants`` plus the
full id-set partition every 20,000 ops (any mismatch raises). Memory is checked three
ways, from coarse to exact:

- RSS: end within 16 MiB of the post-warm-up figure. A gross guard only: single
  RSS samples move by a few MiB with what happens to be live, and over the first few
  hundred thousand ops the raw tree's RSS still settles (allocator high-water
  marks), so the 5 % criterion is checked by the 10M-op bench.
- C heap bytes in use (glibc ``mallinfo2``; numpy's small-buffer cache pre-filled)
  and Python object count (``sys.getallocatedblocks``) sampled right after every
  reset, when the cache and the driver are empty: the maxima of the second half of
  the samples may exceed those of the first half by at most 128 KiB / 1,000 objects.
  One-time capacity doublings fall within one half; a leak of ~1.3 bytes or one
  object per 100 ops fails (checked below with an injected leak).
- Per-call loops: every API call repeated 20,000 times from the same state must not
  grow the heap (< 0.2 B/call) or the object count: catches a leak of a single
  allocation or reference per call, error paths included.

A block leak too small for RSS (one block per thousand ops) shows in the accounting:
an injected one makes the soak fail.

Scale smoke: a 1,000,000-block pool and a 1,000,000-token tree — construction,
memory per block / token (upper bounds), accounting after filling, and per-op cost
against a small instance within a loose 4× (the bench's 2× target needs quiet
machines and repeats).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import numpy as np
import pytest

import bench_scale
import bench_soak
import kvindex

SOAK_OPS = 200_000
HEAP_DRIFT_MAX = 128 * 1024
OBJECTS_DRIFT_MAX = 1000


def soak(kind: str, ops: int = SOAK_OPS, reset_every: int = 10_000) -> dict[str, Any]:
    s = bench_soak.make_soak(kind, seed=1, events=True, reset_every=reset_every)
    return bench_soak.run_soak(s, ops, checkpoint=20_000, log=False)


@pytest.mark.parametrize(
    "kind", ["hash_chain", "hash_chain_sha", "radix_prefix", "radix_prefix_1", "radix"]
)
def test_soak(kind: str) -> None:
    r = soak(kind)
    assert r["ops"] >= SOAK_OPS
    assert r["checkpoints_passed"] >= SOAK_OPS // 20_000
    # Every kind of op ran, the pool was contended and resets happened.
    counts = r["op_counts"]
    expected = {"reset", "take_events", "error"}
    if kind == "radix":
        expected |= {"match_prefix", "insert", "evict", "lock", "unlock", "probe", "path_slots"}
    else:
        expected |= {"admit", "append", "append_batch", "free", "free_batch", "lookup"}
        expected |= {"block_tables", "slot_mapping", "take_stats"}
        expected |= {"evict_blocks"} if kind.startswith("hash_chain") else {"evict", "checkpoint"}
    assert expected <= counts.keys(), expected - counts.keys()
    # The pool ran short at times: the refusal paths ran too.
    assert (r["refused_starts"] if kind == "radix" else counts.get("admit_none", 0)) > 0
    assert r["resets_after_warm"] >= 8
    assert 0.2 < r["hit_rate"] < 1.0
    assert r["rss_end"] - r["rss_warm"] <= 16 * 2**20, r
    assert r["heap_drift"] <= HEAP_DRIFT_MAX, r["reset_samples"]
    assert r["objects_drift"] <= OBJECTS_DRIFT_MAX, r["reset_samples"]


def test_soak_radix_tree_paged() -> None:
    r = soak("radix_16", ops=100_000)
    assert r["checkpoints_passed"] >= 5
    assert r["heap_drift"] <= HEAP_DRIFT_MAX, r["reset_samples"]
    assert r["objects_drift"] <= OBJECTS_DRIFT_MAX, r["reset_samples"]


def test_injected_leaks_are_detected() -> None:
    """The memory checks above can fail: a leak of a 2 KiB buffer per 100 ops and of a
    Python object per 20 ops each exceed the drift limits."""
    s = bench_soak.make_soak("radix_prefix", seed=2, events=False, reset_every=5_000)
    leaked: list[Any] = []
    step = s.step

    def leaky_step() -> None:
        step()
        if s.ops % 100 == 0:
            leaked.append(np.ones(512, np.int32))  # 2 KiB from the C heap
        if s.ops % 20 == 0:
            leaked.append(object())

    s.step = leaky_step  # type: ignore[method-assign]
    r = bench_soak.run_soak(s, 100_000, checkpoint=20_000, log=False)
    assert r["heap_drift"] > HEAP_DRIFT_MAX
    assert r["objects_drift"] > OBJECTS_DRIFT_MAX


class _SkipsSomeFrees:
    """Proxy that drops every 300th ``free`` on the floor: the cache keeps the request
    and its blocks while the driver's model lets them go (a one-block-per-thousand-ops
    scale leak)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._frees = 0

    def free(self, rid: int) -> None:
        self._frees += 1
        if self._frees % 300:
            self._inner.free(rid)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("kind", ["hash_chain", "radix_prefix"])
def test_injected_block_leak_breaks_accounting(kind: str) -> None:
    s = bench_soak.make_soak(kind, seed=3, events=False, reset_every=0)
    assert isinstance(s, bench_soak.RequestSoak)
    s.cache = _SkipsSomeFrees(s.cache)
    with pytest.raises(bench_soak.AccountingError):
        bench_soak.run_soak(s, 50_000, checkpoint=10_000, log=False)


# ------------------------------------------------------------ per-call leak loops


def _no_growth(name: str, fn: Any, n: int = 20_000, rounds: int = 3) -> None:
    """``n`` calls of ``fn`` leave the C heap and the Python block count (nearly) where
    they were. A leak grows in every round; the interpreter's free lists and caches can
    move the block count by a few dozen once (seen in full-suite runs), so a round that
    grows is retried, and only growth in every one of ``rounds`` rounds fails."""
    for _ in range(200):
        fn()
    seen = []
    for _ in range(rounds):
        gc.collect()
        h0, p0 = bench_soak.heap_bytes(), sys.getallocatedblocks()
        for _ in range(n):
            fn()
        gc.collect()
        dh, dp = bench_soak.heap_bytes() - h0, sys.getallocatedblocks() - p0
        if dh < 0.2 * n and dp < 20:
            return
        seen.append(f"C heap +{dh} B, +{dp} Python objects")
    raise AssertionError(f"{name}: grew in each of {rounds} rounds of {n} calls: {seen}")


def test_no_growth_catches_a_slow_object_leak() -> None:
    """One object kept per 1,000 calls grows every round, so ``_no_growth`` fails."""
    kept: list[object] = []
    calls = [0]

    def leaky() -> None:
        calls[0] += 1
        if calls[0] % 1000 == 0:
            kept.append(object())

    with pytest.raises(AssertionError, match="grew in each of 3 rounds"):
        _no_growth("leaky", leaky)


def _raises(fn: Any, exc: type[BaseException]) -> Any:
    def call() -> None:
        try:
            fn()
        except exc:
            return
        raise AssertionError(f"{fn} did not raise {exc.__name__}")

    return call


@pytest.mark.parametrize("events", [False, True])
def test_api_calls_do_not_leak(events: bool) -> None:
    bench_soak.prefill_numpy_cache()
    p = np.arange(100, dtype=np.int32)
    p2 = np.arange(1000, 1100, dtype=np.int32)
    one = np.ones(1, np.int32)
    ids2 = np.array([1, 2], np.int64)

    for name in ("hash_chain", "radix"):
        c: Any = kvindex.make_cache(name, 1024, 16, enable_events=events)

        def cycle(c: Any = c) -> None:
            c.admit(1, p)
            c.admit(2, p2, cache_salt="s", lora=("a", "/a"))
            c.append(1, one)
            c.append_batch(ids2, np.ones(2, np.int32))
            c.block_tables(ids2, 16)
            c.slot_mapping(ids2, np.ones(2, np.int64))
            c.lookup(p)
            c.stats  # noqa: B018
            c.free(1)
            c.free_batch(np.array([2], np.int64))
            c.take_events()
            c.reset()
            c.take_events()

        _no_growth(f"{name} cycle", cycle)
        c.admit(7, p)
        _no_growth(f"{name} duplicate admit", _raises(lambda c=c: c.admit(7, p), ValueError))
        _no_growth(f"{name} unknown free", _raises(lambda c=c: c.free(99), KeyError))
        _no_growth(f"{name} reset while running", _raises(c.reset, RuntimeError))
        bad = np.array([7, 7], np.int64)
        _no_growth(
            f"{name} repeated batch id",
            _raises(lambda c=c, b=bad: c.append_batch(b, np.ones(2, np.int32)), ValueError),
        )
        _no_growth(
            f"{name} wrong dtype", _raises(lambda c=c: c.lookup(p.astype(np.float32)), TypeError)
        )
        c.free(7)
        c.take_events()

    t = kvindex.RadixCache(1, enable_events=events)
    slots = np.arange(100, dtype=np.int32)
    slots2 = np.arange(100, 200, dtype=np.int32)

    def tree_cycle() -> None:
        m = t.match_prefix(p)
        t.lock(m.node)
        r = t.insert(p, slots, "ns")
        r2 = t.insert(p, slots2)
        t.unlock(m.node)
        t.probe(p)
        t.path_slots(t.match_prefix(p).node)
        t.evict(50)
        t.reset()
        t.take_events()
        del r, r2

    _no_growth("radix tree cycle", tree_cycle)
    dup = slots.copy()
    dup[-1] = dup[0]
    _no_growth("radix repeated slot", _raises(lambda: t.insert(p, dup), ValueError))
    _no_growth("radix stale handle", _raises(lambda: t.unlock(5 | (9 << 32)), KeyError))
    m = t.match_prefix(p)
    t.insert(p, slots)
    leaf = t.match_prefix(p).node
    _no_growth("radix unlock without lock", _raises(lambda: t.unlock(leaf), RuntimeError))
    del m


# ------------------------------------------------------------ scale smoke


def test_scale_pool_smoke() -> None:
    """A 1M-block pool: construction, memory, fill, accounting, per-op cost vs 16K."""
    big_n, small_n = 1_000_000, 16_384
    gc.collect()
    r0 = bench_soak.rss_bytes()
    big = kvindex.HashChainCache(big_n, 16)
    r1 = bench_soak.rss_bytes()
    prompts = bench_scale.fill_pool("hash_chain", big)
    r2 = bench_soak.rss_bytes()
    assert big.num_free_blocks == big_n - 1  # every block is cached and idle
    assert big.num_cached_blocks == big_n - 1
    assert prompts * 128 >= big_n - 1
    # Memory: RSS deltas may undercount (freed memory reused) but never overcount much.
    assert (r1 - r0) / big_n < 100, "empty pool: bytes per block"
    assert (r2 - r0) / big_n < 400, "full pool: bytes per block"
    small = kvindex.HashChainCache(small_n, 16)
    bench_scale.fill_pool("hash_chain", small)
    overhead = bench_scale.timer_overhead()
    runs: dict[int, list[dict[str, float]]] = {big_n: [], small_n: []}
    for rep in range(3):
        reqs = bench_scale.pool_workload(150, seed=rep)
        for n, c in ((small_n, small), (big_n, big)):
            runs[n].append(bench_scale.drive_pool("hash_chain", c, reqs, overhead, seed=rep + 1))
            assert c.num_requests == 0
            assert c.num_free_blocks == n - 1
    small.check_invariants()
    keys = ("admit", "append_batch", "free", "evict")
    best = {n: {k: min(x[k] for x in v) for k in keys} for n, v in runs.items()}
    total = {n: sum(b.values()) for n, b in best.items()}
    assert total[big_n] < 4 * total[small_n], best


def test_scale_tree_smoke() -> None:
    """A 1M-token tree: build, memory per token, invariants, per-request cost vs 10K."""
    overhead = bench_scale.timer_overhead()
    res = {}
    for size in (10_000, 1_000_000):
        tree, next_slot, figs = bench_scale.build_tree(1, size)
        assert figs["tokens"] >= size
        if size > 100_000:
            assert figs["rss_bytes_per_token"] < 32
        tree.check_invariants()
        pool = bench_scale.SlotStack(next_slot + 1, 60_000, 1, cap=next_slot + 16)
        cap = tree.total_size + 50_000
        runs = []
        for rep in range(3):
            reqs = bench_scale.tree_workload(100, seed=rep)
            runs.append(bench_scale.request_loop(tree, pool, reqs, cap, overhead))
            assert tree.total_size <= cap
            assert tree.protected_size == 0
        tree.check_invariants()
        res[size] = {k: min(r[k] for r in runs) for k in ("match", "insert", "evict_per_req")}
    total = {n: sum(v.values()) for n, v in res.items()}
    assert total[1_000_000] < 4 * total[10_000], res
