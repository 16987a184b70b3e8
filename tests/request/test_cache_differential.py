"""Differential tests: ``HashChainCache`` vs ``RadixPrefixCache``.

Both are driven through the same random admit / append / free operations with
``page_size == block_size`` via the shared :class:`kvindex.PrefixCache`
protocol. Where their semantics agree they must report the same hit lengths:

* **Agree** — without eviction pressure, when the radix cache makes sequences
  shareable at the same moments as the hash chain (``checkpoint`` after admit
  and after every append; the hash chain registers full blocks at those
  points), or when requests run one at a time (everything is registered by
  the time the next one arrives). Both cap hits at ``num_tokens - 1`` and
  count whole blocks/pages only, so hits, table lengths and slot-mapping
  lengths agree exactly.
* **Differ, by design** —
  1. *when*: without ``checkpoint`` the radix cache inserts at ``free``
     (SGLang), so a concurrent request with the same prompt hits 0 where the
     hash chain already hits;
  2. *eviction*: under pressure the hash chain reuses free blocks from the
     free-queue head (lazy, block by block, leaf-most first) and the radix
     cache evicts whole LRU leaves when short, so hits diverge; both stay
     bounded by an ideal infinite cache;
  3. *granularity*: a radix cache with page_size 1 hits token-exact prefixes,
     never fewer tokens than a hash chain with any block size.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvindex

BASES = [list(range(1000, 1064)), list(range(2000, 2040)), [5] * 48]
SALTS = [None, None, "tenant"]


@st.composite
def prompt(draw: st.DrawFn) -> list[int]:
    base = draw(st.sampled_from(BASES))
    cut = draw(st.integers(0, len(base)))
    tail = draw(st.lists(st.integers(0, 3), max_size=20))
    toks = base[:cut] + tail
    return toks or [1]


@st.composite
def ops(draw: st.DrawFn) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["admit", "admit", "append", "free"]))
        if kind == "admit":
            out.append(("admit", draw(prompt()), draw(st.sampled_from(SALTS))))
        elif kind == "append":
            out.append(
                (
                    "append",
                    draw(st.integers(0, 9)),
                    draw(st.lists(st.integers(0, 3), min_size=1, max_size=12)),
                )
            )
        else:
            out.append(("free", draw(st.integers(0, 9))))
    return out


def a32(xs: list[int]) -> np.ndarray:
    return np.asarray(xs, dtype=np.int32)


def ideal_hit(
    seen: list[tuple[str | None, list[int]]], toks: list[int], salt: str | None, bs: int
) -> int:
    """Hit of an infinite cache holding the full blocks of every sequence seen."""
    cap = (len(toks) - 1) // bs * bs
    best = 0
    for s_salt, s in seen:
        if s_salt != salt:
            continue
        n = 0
        while n + bs <= min(cap, len(s)) and s[n : n + bs] == toks[n : n + bs]:
            n += bs
        best = max(best, n)
    return best


def drive(
    program: list[tuple[object, ...]],
    bs: int,
    num_blocks: int,
    checkpoint: bool,
    sequential: bool = False,
) -> list[tuple[int | None, int | None, int]]:
    """Runs the same program on both caches; returns (hash hit, radix hit, ideal) per admit."""
    hc: kvindex.PrefixCache = kvindex.make_cache("hash_chain", num_blocks, bs)
    rc = kvindex.make_cache("radix", num_blocks, bs)
    assert isinstance(rc, kvindex.RadixPrefixCache)
    running: list[int] = []
    toks_of: dict[int, list[int]] = {}
    salt_of: dict[int, str | None] = {}
    seen: list[tuple[str | None, list[int]]] = []
    hits: list[tuple[int | None, int | None, int]] = []
    next_id = 0

    def finish(rid: int) -> None:
        hc.free(rid)
        rc.free(rid)
        running.remove(rid)
        seen.append((salt_of[rid], toks_of[rid]))

    for op in program:
        if op[0] == "admit":
            toks, salt = op[1], op[2]
            assert isinstance(toks, list)
            if sequential:
                for rid in list(running):
                    finish(rid)
            rid = next_id
            next_id += 1
            ideal = ideal_hit(seen + [(salt_of[r], toks_of[r]) for r in running], toks, salt, bs)  # type: ignore[arg-type]
            if -(-len(toks) // bs) > num_blocks - 1:
                # Larger than the whole pool: both caches refuse it for good (an error,
                # nothing changed); counted as refused.
                for c in (hc, rc):
                    with pytest.raises(kvindex.RequestTooLargeError):
                        c.admit(rid, a32(toks), cache_salt=salt)  # type: ignore[arg-type]
                hits.append((None, None, ideal))
                continue
            a = hc.admit(rid, a32(toks), cache_salt=salt)  # type: ignore[arg-type]
            b = rc.admit(rid, a32(toks), cache_salt=salt)  # type: ignore[arg-type]
            hits.append((a and a.num_cached_tokens, b and b.num_cached_tokens, ideal))
            if a is not None and b is not None:
                running.append(rid)
                toks_of[rid] = list(toks)
                salt_of[rid] = salt  # type: ignore[assignment]
                if checkpoint:
                    rc.checkpoint(rid)
                assert len(a.block_ids) == len(b.block_ids)
            else:
                # keep both caches in the same request set; what one of them
                # admitted is cached after this free
                for c, adm in ((hc, a), (rc, b)):
                    if adm is not None:
                        c.free(rid)
                        seen.append((salt, list(toks)))  # type: ignore[arg-type]
        elif op[0] == "append" and running:
            i, extra = op[1], op[2]
            assert isinstance(i, int) and isinstance(extra, list)
            rid = running[i % len(running)]
            ok_a = hc.append(rid, a32(extra))
            ok_b = rc.append(rid, a32(extra))
            if ok_a and ok_b:
                toks_of[rid] = toks_of[rid] + extra
                if checkpoint:
                    rc.checkpoint(rid)
                ids = np.array([rid], np.int64)
                q = np.array([len(extra)], np.int64)
                assert len(hc.slot_mapping(ids, q)) == len(rc.slot_mapping(ids, q)) == len(extra)
                assert hc.request_blocks(rid).shape == rc.request_blocks(rid).shape
            else:
                finish(rid)  # cannot grow in one of them: finish it in both
        elif op[0] == "free" and running:
            i = op[1]
            assert isinstance(i, int)
            finish(running[i % len(running)])
        hc.check_invariants()
        rc.check_invariants()
    return hits


BIG = 4096


@settings(max_examples=150)
@given(program=ops(), bs=st.sampled_from([1, 4, 16]))
def test_same_hits_with_checkpoints(program: list[tuple[object, ...]], bs: int) -> None:
    for h, r, ideal in drive(program, bs, BIG, checkpoint=True):
        assert h == r == ideal


@settings(max_examples=150)
@given(program=ops(), bs=st.sampled_from([1, 4, 16]))
def test_same_hits_when_requests_run_one_at_a_time(
    program: list[tuple[object, ...]], bs: int
) -> None:
    for h, r, ideal in drive(program, bs, BIG, checkpoint=False, sequential=True):
        assert h == r == ideal


@settings(max_examples=150)
@given(program=ops(), bs=st.sampled_from([1, 4, 16]))
def test_radix_without_checkpoint_never_hits_more(
    program: list[tuple[object, ...]], bs: int
) -> None:
    """Finish-only insertion shares later than admit-time registration."""
    for h, r, ideal in drive(program, bs, BIG, checkpoint=False):
        assert h is not None and r is not None
        assert r <= h == ideal


@settings(max_examples=150)
@given(program=ops(), bs=st.sampled_from([1, 4]), num_blocks=st.integers(4, 40), ckpt=st.booleans())
def test_under_pressure_both_bounded_by_ideal(
    program: list[tuple[object, ...]], bs: int, num_blocks: int, ckpt: bool
) -> None:
    for h, r, ideal in drive(program, bs, num_blocks, checkpoint=ckpt):
        for hit in (h, r):
            assert hit is None or (hit <= ideal and hit % bs == 0)


def test_concurrent_same_prompt_differs_by_design() -> None:
    p = a32(range(40))
    hc = kvindex.HashChainCache(64, 4)
    rc = kvindex.RadixPrefixCache(64, 4)
    for c in (hc, rc):
        c.admit(1, p)
    a, b = hc.admit(2, p), rc.admit(2, p)
    assert a is not None and b is not None
    assert (a.num_cached_tokens, b.num_cached_tokens) == (36, 0), "radix shares at finish"
    rc.free(2)
    rc.checkpoint(1)
    b3 = rc.admit(3, p)
    assert b3 is not None and b3.num_cached_tokens == 36, "checkpoint shares a running prompt"


@settings(max_examples=100)
@given(program=ops(), bs=st.sampled_from([4, 16]))
def test_token_level_radix_hits_at_least_block_hash(
    program: list[tuple[object, ...]], bs: int
) -> None:
    hc = kvindex.HashChainCache(BIG, bs)
    rc = kvindex.RadixPrefixCache(BIG * bs, 1)
    running: list[int] = []
    for rid, op in enumerate(program):
        if op[0] == "admit":
            toks = op[1]
            assert isinstance(toks, list)
            a = hc.admit(rid, a32(toks))
            b = rc.admit(rid, a32(toks))
            assert a is not None and b is not None
            assert b.num_cached_tokens >= a.num_cached_tokens
            rc.checkpoint(rid)
            running.append(rid)
        elif op[0] == "free" and running:
            i = op[1]
            assert isinstance(i, int)
            rid2 = running.pop(i % len(running))
            hc.free(rid2)
            rc.free(rid2)
