"""Engine-lifecycle benchmark: the per-step calls against today's calls, same run.

Three ratios, each against a baseline measured in the same process, interleaved
over rounds (best round of each kept):

1. decode step of 64 running requests (one ``schedule_batch`` + one ``commit_batch``)
   with 4 lookahead slots each, against the same step without lookahead (target <= 2x);
2. async step: reserve the slots of 64 tokens whose ids are unknown
   (``schedule_batch``), then commit the 64 ids (``commit_batch``), against today's
   ``append_batch`` of 64 known ids (target <= 1.5x);
3. chunked prefill of a 32K-token prompt in 8K chunks (``admit_chunk`` + 3
   ``schedule``, then ``finish``) against admitting it whole (``admit`` + ``free``)
   (target <= 1.2x);
4. int64 token arrays against int32 ones (target <= 1.1x): a hot 3,289-token
   ``RadixTree.match_prefix`` (page 16) and ``RadixPrefixCache.lookup`` on a tree holding
   that one sequence (one edge: the call is nearly all compare), the same match on the
   tree ``bench_radix.py``'s workload builds (300 requests: 20 shared system prompts,
   unique suffixes and outputs; page 1 and 16; the query is one request's first 3,289
   tokens, a hit through its system-prompt edge into its own suffix), and a hash-chain
   ``admit`` + ``free`` of a 2,705-token prompt sharing a cached 2,400-token prefix.

Both designs (``HashChainCache`` with xxh3_128 and vllm_sha256_cbor, and
``RadixPrefixCache``), block size 16. The step measures (1, 2) time a warm cache: the
same steps once untimed, then the requests freed, the cache reset and the prompts
admitted again (see ``timed_steps``).

Usage: python benches/bench_lifecycle.py [--rounds N] [--steps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import bench_radix
import kvindex

BS = 16
N_REQ = 64
PROMPT = 256
clock = time.perf_counter


def make(design: str, num_blocks: int) -> Any:
    if design == "radix":
        return kvindex.RadixPrefixCache(num_blocks, BS)
    return kvindex.HashChainCache(num_blocks, BS, algo=design)


def timed_steps(
    design: str, steps: int, lookahead: int, admit: str, step: Callable[[Any], None]
) -> float:
    """Seconds per ``step(cache)`` over ``steps`` steps of 64 running requests (256-token
    prompts admitted with ``admit``: ``"admit_chunk"``, whose requests then commit their
    first sampled id, or ``"admit"``), on a warm cache: the same steps run once untimed,
    then every request is freed, the cache reset and the prompts admitted again, so the
    timed steps find the cache's structures grown as in a running engine (the radix tree's
    node arena; a fresh cache's first growth costs page faults that depend on the
    allocator's state, not on the step)."""
    per = -(-(PROMPT + steps + lookahead + 1) // BS) + 1
    c = make(design, N_REQ * per + 2)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50_000, PROMPT, dtype=np.int32) for _ in range(N_REQ)]
    ids = np.arange(N_REQ, dtype=np.int64)
    toks = np.arange(N_REQ, dtype=np.int32)

    def start() -> None:
        for i, p in enumerate(prompts):
            assert getattr(c, admit)(i, p) is not None
        if admit == "admit_chunk":
            c.commit_batch(ids, toks)  # the admission's sampled ids: every request decodes

    start()
    for _ in range(steps):
        step(c)
    for i in range(N_REQ):
        c.free(i)
    c.reset()
    start()
    t0 = clock()
    for _ in range(steps):
        step(c)
    return (clock() - t0) / steps


def decode_steps(design: str, steps: int, lookahead: int) -> float:
    """Seconds per step: schedule the next position, commit the sampled ids."""
    ids = np.arange(N_REQ, dtype=np.int64)
    toks = np.arange(N_REQ, dtype=np.int32)
    ones = np.ones(N_REQ, dtype=np.int64)

    def step(c: Any) -> None:
        assert c.schedule_batch(ids, ones, lookahead=lookahead)[0] == N_REQ
        c.commit_batch(ids, toks)

    return timed_steps(design, steps, lookahead, "admit_chunk", step)


def async_steps(design: str, steps: int) -> float:
    """Seconds per async step: reserve 64 unknown ids, then commit them."""
    ids = np.arange(N_REQ, dtype=np.int64)
    toks = np.arange(N_REQ, dtype=np.int32)
    ones = np.ones(N_REQ, dtype=np.int64)

    def step(c: Any) -> None:
        assert c.schedule_batch(ids, ones)[0] == N_REQ
        c.commit_batch(ids, toks)

    return timed_steps(design, steps, 0, "admit_chunk", step)


def append_steps(design: str, steps: int) -> float:
    """Seconds per step of today's ``append_batch`` (ids known and computed)."""
    ids = np.arange(N_REQ, dtype=np.int64)
    toks = np.arange(N_REQ, dtype=np.int32)

    def step(c: Any) -> None:
        assert c.append_batch(ids, toks)

    return timed_steps(design, steps, 0, "admit", step)


def prefill(design: str, chunked: bool, reps: int) -> float:
    """Seconds per admission of a fresh 32K prompt (whole, or in 8K chunks), freed after."""
    c = make(design, 32768 // BS * 2 + 2)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 50_000, 32768, dtype=np.int32) for _ in range(reps)]
    t0 = clock()
    for i, p in enumerate(prompts):
        if chunked:
            assert c.admit_chunk(i, p, chunk=8192) is not None
            for _ in range(3):
                assert c.schedule(i, 8192) is not None
            c.finish(i)
        else:
            assert c.admit(i, p) is not None
            c.free(i)
        c.reset()
    return (clock() - t0) / reps


def workload_tree(ps: int) -> tuple[Any, np.ndarray]:
    """A ``RadixTree`` holding bench_radix's workload (300 requests, whole sequences),
    and a 3,289-token query: a request's prefix (system prompt, its suffix, output)."""
    tree = kvindex.RadixTree(ps)
    seqs = bench_radix.workload(300)
    off = 0
    for seq in seqs:
        al = seq[: len(seq) // ps * ps]
        tree.insert(al, np.arange(off, off + len(al), dtype=np.int32))
        off += len(al)
    query = next(q for q in seqs if len(q) >= 3289)[:3289]
    return tree, query


def int_width(reps: int) -> dict[str, float]:
    """Seconds per call with int32 and with int64 tokens (same values)."""
    rng = np.random.default_rng(2)
    seq = rng.integers(0, 50_000, 3289, dtype=np.int32)
    tree = kvindex.RadixTree(16)
    tree.insert(seq[: 3289 // 16 * 16], np.arange(3289 // 16 * 16, dtype=np.int32))
    rc = kvindex.RadixPrefixCache(4096, 16)
    assert rc.admit(0, seq) is not None
    rc.free(0)
    hc = kvindex.HashChainCache(4096, 16, algo="xxh3_128")
    system = rng.integers(0, 50_000, 2400, dtype=np.int32)
    prompt = np.concatenate([system, np.arange(305, dtype=np.int32)])
    assert hc.admit(0, prompt) is not None
    hc.free(0)
    trees = {ps: workload_tree(ps) for ps in (1, 16)}
    out: dict[str, float] = {}
    for width, dt in (("i32", np.int32), ("i64", np.int64)):
        q, p = seq.astype(dt), prompt.astype(dt)
        t0 = clock()
        for _ in range(reps):
            tree.match_prefix(q)
        out[f"radix_match_{width}"] = (clock() - t0) / reps
        for ps, (wt, wq) in trees.items():
            wq = wq.astype(dt)
            t0 = clock()
            for _ in range(reps):
                wt.match_prefix(wq)
            out[f"radix_match_tree_p{ps}_{width}"] = (clock() - t0) / reps
        t0 = clock()
        for _ in range(reps):
            rc.lookup(q)
        out[f"radix_lookup_{width}"] = (clock() - t0) / reps
        t0 = clock()
        for _ in range(reps):
            hc.admit(1, p)
            hc.free(1)
        out[f"hash_chain_admit_{width}"] = (clock() - t0) / reps
    return out


def best(fns: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Interleaved rounds; the fastest round of each."""
    out = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            out[k] = min(out[k], f())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--json", type=str, default=None)
    a = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    print(f"kvindex {kvindex.__version__}: {N_REQ} requests, block size {BS}")
    print(
        f"{'design':<18} {'decode':>9} {'+4 look':>9} {'ratio':>6} | "
        f"{'append':>9} {'async':>9} {'ratio':>6} | "
        f"{'32K whole':>10} {'8K chunks':>10} {'ratio':>6}"
    )
    for design in ["xxh3_128", "vllm_sha256_cbor", "radix"]:
        s, r, reps = a.steps, a.rounds, a.prefill_reps
        t = best(
            {
                "decode": lambda d=design, s=s: decode_steps(d, s, 0),
                "decode_lookahead4": lambda d=design, s=s: decode_steps(d, s, 4),
                "append_batch": lambda d=design, s=s: append_steps(d, s),
                "async": lambda d=design, s=s: async_steps(d, s),
                "prefill_whole": lambda d=design, n=reps: prefill(d, False, n),
                "prefill_chunked": lambda d=design, n=reps: prefill(d, True, n),
            },
            r,
        )
        t["ratio_lookahead"] = t["decode_lookahead4"] / t["decode"]
        t["ratio_async"] = t["async"] / t["append_batch"]
        t["ratio_chunked"] = t["prefill_chunked"] / t["prefill_whole"]
        results[design] = t
        us = 1e6
        print(
            f"{design:<18} {t['decode'] * us:>7.2f}us {t['decode_lookahead4'] * us:>7.2f}us "
            f"{t['ratio_lookahead']:>5.2f}x | {t['append_batch'] * us:>7.2f}us "
            f"{t['async'] * us:>7.2f}us {t['ratio_async']:>5.2f}x | "
            f"{t['prefill_whole'] * 1e3:>8.3f}ms {t['prefill_chunked'] * 1e3:>8.3f}ms "
            f"{t['ratio_chunked']:>5.2f}x"
        )
    w = {k: float("inf") for k in int_width(10)}
    for _ in range(a.rounds):
        for k, v in int_width(2000).items():
            w[k] = min(w[k], v)
    for k in (
        "radix_match",
        "radix_match_tree_p1",
        "radix_match_tree_p16",
        "radix_lookup",
        "hash_chain_admit",
    ):
        w[f"ratio_{k}"] = w[f"{k}_i64"] / w[f"{k}_i32"]
        print(
            f"{k:<20} int32 {w[k + '_i32'] * 1e6:>7.2f}us  int64 {w[k + '_i64'] * 1e6:>7.2f}us "
            f"{w['ratio_' + k]:>5.2f}x"
        )
    results["int_width"] = w
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
