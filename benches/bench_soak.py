"""Soak test: millions of mixed operations on each cache with a steady
working set; no memory growth, invariants at checkpoints, exact accounting after
every operation.

Workload (seeded: ``random.Random`` for decisions, numpy for token data). Prompts
come from a fixed population — 16 shared system prompts of 256-1,536 tokens, each
followed by one of 512 suffixes of 1-300 tokens; every fifth prompt carries one of
37 cache salts and every eleventh one of 3 LoRAs (extra keys for the hash chain,
namespaces for the radix tree, which come and go as their nodes are evicted) — so the
set of cacheable prefixes is bounded; decode tokens are random. At most 32 requests
run; each stops after 16-400 decode tokens. An "op" is one Python call into the
cache (the getters the checks read are not counted).

Caches (``--caches``; each runs in its own subprocess, so each RSS figure is that
cache's alone):

- ``hash_chain``: ``HashChainCache(1536, 16)`` (xxh3); ``hash_chain_sha``: the same
  with ``vllm_sha256_cbor`` (the SHA-256 modes keep a per-block prefix memo);
- ``radix_prefix``: ``RadixPrefixCache(1536, 16)``; ``radix_prefix_1``:
  ``RadixPrefixCache(24576, 1)``;
- ``radix``: raw ``RadixTree(1)`` over 40,960 slots; ``radix_16``: ``RadixTree(16)``
  over 2,560 pages.

The pools are small enough to run short now and then (about 1 % of admissions are
refused; a few appends fail; 0.2 % of raw-tree requests find every slot locked and
give up), so the refusal paths are soaked too.

Request-level ops: ``admit`` (2 % with ``skip_reading``), ``append`` (1-8 tokens),
``append_batch`` (every running request: one token each, or 0-3 via ``offsets``),
``free``, ``free_batch``, ``lookup``, ``evict_blocks`` of 1-8 idle blocks (hash
chain) / ``evict`` (radix), ``checkpoint`` (radix), ``block_tables`` (into a reused
``out``) / ``slot_mapping``, ``take_stats``, ``take_events`` every 64 ops (events on;
``--no-events`` turns them off), caller errors that must raise and leave the cache
unchanged (duplicate admit, unknown free/append, repeated batch id, evicting a held
block, reset while running), and on average every ``--reset-every`` ops a drain:
free every request, then ``reset``. A failed ``admit``/``append`` (pool short) frees
the oldest request next.

Raw tree ops: a request ``match_prefix`` + ``lock``s a prompt + decode tokens, takes
slots for the miss from a Python slot pool (``evict`` when short), and finishes with
``insert`` + ``unlock`` (``to_free`` goes back to the pool); mixed with ``probe``,
direct ``insert`` of a population prompt (with a priority), ``evict``,
``path_slots``, extra ``lock``/``unlock`` pairs, errors (unlock without a lock, a
slot passed twice, a stale handle), ``take_events`` and periodic ``reset``. The tree
is kept under 3/4 of the slots by evicting.

Accounting, checked after EVERY op (cheap: a few O(1) getters against a Python
model of who holds what):

- ``HashChainCache``: ``num_free_blocks + |in use| == num_blocks - 1``, where "in
  use" is the set of distinct block ids in running requests' tables (the model's
  ref counts, kept from ``Admission.block_ids`` and from ``request_blocks`` when a
  table grows; a newly allocated block must not already be in use), and
  ``num_requests`` equals the model's. Free blocks include cached-but-idle ones, so
  this is "free + cached idle + in use == capacity".
- ``RadixPrefixCache``: ``num_unused_blocks + num_cached_blocks + Σ private ==
  num_blocks - 1``, a request's private pages being ``ceil(tokens / bs) - cached /
  bs`` (its table past its locked tree path), and ``num_free_blocks ==
  num_unused_blocks + evictable_size / bs``.
- ``RadixTree``: ``free pages (pool) + total_size / ps + Σ pages held by running
  requests == capacity``, and ``total_size == evictable_size + protected_size``.

Checkpoints (every ``--checkpoint`` ops, default 100,000): ``check_invariants()``
and the full form of the identity from the id sets: hash chain — free queue and
in-use set are disjoint and together exactly blocks 1..N-1, every in-use block's
``ref_count`` and every table equal the model's, free blocks split into cached idle
(``block_hash`` set) and uncached; radix — free pages ∪ tree pages ∪ private pages
is exactly 1..N-1, disjoint; raw tree — pool ∪ ``all_slots()`` ∪ running requests'
slots is exactly the slot range, locked paths keep their slots.

Memory:

- RSS (``/proc/self/statm``), sampled right after each checkpoint: the first sample
  at or after 10 % of the ops is the warm-up figure, the last the end figure; the
  run fails if end > 1.05 × warm-up.
- Right after every reset (cache and driver empty): the C heap in use (glibc
  ``mallinfo2``, byte-exact; numpy's small-buffer cache is pre-filled so that it
  does not creep) and the Python object count (``sys.getallocatedblocks``). The
  "drift" is the largest sample of the second half minus the largest of the first
  half (after warm-up): a leak of b bytes per op shows as about b × ops / 2.

Usage: python benches/bench_soak.py [--ops N] [--caches LIST] [--json PATH]
       [--checkpoint K] [--reset-every R] [--seed S] [--no-events]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import kvindex
from kvindex import (
    BlockInUseError,
    DuplicateRequestError,
    InvalidArgumentError,
    LockError,
    StaleHandleError,
    UnknownRequestError,
)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process (bytes)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        )
    ]


def _load_mallinfo2() -> Callable[[], Any] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn  # type: ignore[no-any-return]


_mallinfo2 = _load_mallinfo2()


def heap_bytes() -> int:
    """C heap bytes in use (glibc: small/arena chunks + mmapped chunks); -1 if unknown."""
    if _mallinfo2 is None:
        return -1
    m = _mallinfo2()
    return int(m.uordblks + m.hblkhd)


def prefill_numpy_cache() -> None:
    """Fills numpy's cache of small data buffers (up to 7 per size below 1 KiB, about
    3.6 MiB, kept allocated when arrays die). Otherwise it fills slowly as a workload
    happens to free arrays of new sizes, and the C heap creeps up by ~100 KiB over a
    million ops without any leak."""
    for n in range(1, 1025):
        arrs = [np.empty(n, np.uint8) for _ in range(8)]
        del arrs


FILL_ROUNDS = 16


class AccountingError(AssertionError):
    """The cache's counters disagree with the model of who holds what."""


# ------------------------------------------------------------------------ workload


class Population:
    """A fixed set of prompts (shared system prompts + suffixes), their salts, and a
    buffer of random decode tokens."""

    def __init__(self, seed: int, n_sys: int = 16, n_prompts: int = 512) -> None:
        g = np.random.default_rng(seed)
        systems = [
            g.integers(0, 50_000, int(g.integers(256, 1537)), dtype=np.int32) for _ in range(n_sys)
        ]
        self.prompts: list[np.ndarray] = []
        self.salts: list[str | None] = []
        self.loras: list[tuple[str, str] | None] = []
        for j in range(n_prompts):
            suffix = g.integers(0, 50_000, int(g.integers(1, 301)), dtype=np.int32)
            self.prompts.append(np.concatenate([systems[j % n_sys], suffix]))
            # Salts and LoRAs make namespaces (radix) / extra keys (hash chain); many
            # distinct salts on few prompts each make namespaces come and go.
            self.salts.append(f"salt{j % 37}" if j % 5 == 0 else None)
            self.loras.append((f"lora{j % 3}", f"/adapters/{j % 3}") if j % 11 == 0 else None)
        self.decode = g.integers(0, 50_000, 1 << 20, dtype=np.int32)

    def ns(self, j: int) -> str | None:
        """Tree namespace of prompt ``j`` (raw radix tree): its salt or LoRA name."""
        lora = self.loras[j]
        return self.salts[j] or (lora[0] if lora else None)

    def tokens(self, rng: random.Random, k: int) -> np.ndarray:
        off = rng.randrange(len(self.decode) - k)
        return self.decode[off : off + k]


class Soak:
    """Common driver state. Subclasses implement ``step`` (some ops, each followed by
    ``done()``), ``check_cheap`` and ``check_full``."""

    name = ""

    def __init__(self, seed: int, max_live: int = 32) -> None:
        self.rng = random.Random(seed)
        self.pop = Population(seed)
        self.max_live = max_live
        self.ops = 0
        self.counts: dict[str, int] = {}
        self.next_id = 1
        # (op, RSS, C heap, Python objects) right after each reset: the cache and the
        # driver are empty then, so these samples differ only by leaks and by
        # high-water capacities (a Vec that doubled once).
        self.reset_samples: list[tuple[int, int, int, int]] = []
        self.records = 0  # checkpoint samples the driver keeps (see sample_empty)

    def sample_empty(self, cache: Any, events: bool) -> None:
        if events:  # the event buffer is part of the state: drain it first
            cache.take_events()
            self.done("take_events")
        self.fresh_containers()
        # Python objects less the driver's own records kept so far (a reset sample is a
        # tuple + 4 ints, a checkpoint sample a tuple + 3 ints).
        objects = sys.getallocatedblocks() - 5 * len(self.reset_samples) - 4 * self.records
        self.reset_samples.append((self.ops, rss_bytes(), heap_bytes(), objects))

    def done(self, op: str) -> None:
        self.ops += 1
        self.counts[op] = self.counts.get(op, 0) + 1
        self.check_cheap()

    def step(self) -> None:
        raise NotImplementedError

    def fill_to_capacity(self) -> None:
        """Warm-up: cache distinct 2,048-token sequences until the whole pool has been
        cached ``FILL_ROUNDS`` times over, then reset. Per-pool structures reach their
        largest size here instead of at a random later point: the hash chain's block
        map (a hashbrown table) doubles once more after some rounds of churn, when
        deleted-entry tombstones use up its spare room — a one-time capacity step
        (+1 MiB for 8,192 blocks) that is not a leak but would move RSS by ~5 %."""
        raise NotImplementedError

    def fresh_containers(self) -> None:
        """Replaces the driver's emptied dicts (a dict keeps its table when emptied)."""

    def check_cheap(self) -> None:
        raise NotImplementedError

    def check_full(self) -> dict[str, int]:
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        return {}


class RequestSoak(Soak):
    """``HashChainCache`` / ``RadixPrefixCache`` through the shared request interface."""

    def __init__(
        self,
        kind: str,
        num_blocks: int,
        bs: int,
        seed: int,
        events: bool,
        reset_every: int,
        algo: str = "xxh3_128",
    ) -> None:
        super().__init__(seed)
        self.kind = kind
        self.name = f"{kind} ({num_blocks:,} blocks of {bs})"
        if kind == "hash_chain":
            self.name = f"hash_chain {algo} ({num_blocks:,} blocks of {bs})"
        self.bs = bs
        self.n = num_blocks
        self.events = events
        self.reset_every = reset_every
        self.cache: Any
        if kind == "hash_chain":
            self.cache = kvindex.HashChainCache(num_blocks, bs, algo=algo, enable_events=events)
        else:
            self.cache = kvindex.RadixPrefixCache(num_blocks, bs, enable_events=events)
        self.hc = kind == "hash_chain"
        # rid -> [tokens, decode budget left, cached tokens (radix), block list (hash chain)]
        self.live: dict[int, list[Any]] = {}
        self.inuse: dict[int, int] = {}  # hash chain: block -> holders
        self.private = 0  # radix: Σ pages past each request's locked tree path
        self.draining = False
        self.pressure = False
        self.out_buf = np.zeros((self.max_live, 4096 // bs + 512), dtype=np.int32)
        self.n_events = 0
        self.fails = 0
        self.hits = 0
        self.queries = 0

    def fresh_containers(self) -> None:
        assert not self.live and not self.inuse
        self.live, self.inuse = {}, {}

    def fill_to_capacity(self) -> None:
        c = self.cache
        base = self.pop.tokens(self.rng, 2048).copy()
        for i in range(FILL_ROUNDS * (-(-(self.n - 1) * self.bs // len(base)) + 1)):
            base[0] = 1_000_000 + i
            rid = self.next_id
            self.next_id += 1
            adm = c.admit(rid, base)
            if adm is None:
                raise AccountingError("warm-up fill: admission refused on an idle pool")
            self._register(rid, len(base), 0, adm)
            self.done("warm_fill")
            self._free(rid)
            if self.events:  # drained as it goes: a big buffer would inflate the RSS base
                c.take_events()
                self.done("take_events")
        c.reset()
        self.done("reset")

    # -- model updates
    def _register(self, rid: int, ntok: int, budget: int, adm: Any) -> None:
        hit = adm.num_cached_tokens
        st: list[Any] = [ntok, budget, hit, []]
        self.live[rid] = st
        if self.hc:
            blocks = adm.block_ids.tolist()
            if len(blocks) != self._pages(ntok):
                raise AccountingError(f"admit: {len(blocks)} blocks for {ntok} tokens")
            self._add_blocks(st, blocks, hit // self.bs)
        else:
            self.private += self._pages(ntok) - hit // self.bs

    def _pages(self, ntok: int) -> int:
        return -(-ntok // self.bs)

    def _add_blocks(self, st: list[Any], new: list[int], fresh_from: int) -> None:
        inuse = self.inuse
        for i, b in enumerate(new):
            c = inuse.get(b, 0)
            if i >= fresh_from and c:
                raise AccountingError(f"newly allocated block {b} is held by {c} requests")
            inuse[b] = c + 1
        st[3].extend(new)

    def _grow(self, rid: int, k: int) -> None:
        st = self.live[rid]
        old = st[0]
        st[0] = old + k
        st[1] -= k
        grow = self._pages(old + k) - self._pages(old)
        if grow:
            if self.hc:
                tbl = self.cache.request_blocks(rid)
                have = len(st[3])
                if len(tbl) != have + grow:
                    raise AccountingError(f"request {rid}: table {len(tbl)}, want {have + grow}")
                self._add_blocks(st, tbl[have:].tolist(), 0)
            else:
                self.private += grow

    def _drop(self, rid: int) -> None:
        st = self.live.pop(rid)
        if self.hc:
            inuse = self.inuse
            for b in st[3]:
                c = inuse[b] - 1
                if c:
                    inuse[b] = c
                else:
                    del inuse[b]
        else:
            self.private -= self._pages(st[0]) - st[2] // self.bs

    # -- checks
    def check_cheap(self) -> None:
        c = self.cache
        if c.num_requests != len(self.live):
            raise AccountingError(f"num_requests {c.num_requests} != {len(self.live)}")
        if self.hc:
            if c.num_free_blocks + len(self.inuse) != self.n - 1:
                raise AccountingError(
                    f"free {c.num_free_blocks} + in use {len(self.inuse)} != {self.n - 1}"
                )
        else:
            unused, cached = c.num_unused_blocks, c.num_cached_blocks
            if unused + cached + self.private != self.n - 1:
                raise AccountingError(
                    f"unused {unused} + tree {cached} + private {self.private} != {self.n - 1}"
                )
            if c.num_free_blocks != unused + c.evictable_size // self.bs:
                raise AccountingError("num_free_blocks != unused + evictable pages")

    def check_full(self) -> dict[str, int]:
        c = self.cache
        c.check_invariants()
        everything = set(range(1, self.n))
        if self.hc:
            free = c.free_queue().tolist()
            fs = set(free)
            if len(fs) != len(free) or len(free) != c.num_free_blocks:
                raise AccountingError("free queue has repeats or disagrees with num_free_blocks")
            if fs & self.inuse.keys() or fs | self.inuse.keys() != everything:
                raise AccountingError("free queue and in-use blocks do not partition the pool")
            for rid, st in self.live.items():
                if c.request_blocks(rid).tolist() != st[3]:
                    raise AccountingError(f"request {rid}: table differs from the model")
                if c.num_tokens(rid) != st[0]:
                    raise AccountingError(f"request {rid}: num_tokens differs")
            for b, k in self.inuse.items():
                if c.ref_count(b) != k:
                    raise AccountingError(f"block {b}: ref_count {c.ref_count(b)}, model {k}")
            cached_idle = sum(c.block_hash(b) is not None for b in free)
            cached_used = sum(c.block_hash(b) is not None for b in self.inuse)
            if c.num_cached_blocks > cached_idle + cached_used:
                raise AccountingError("more distinct cached hashes than hashed blocks")
            return {
                "free_uncached": len(free) - cached_idle,
                "cached_idle": cached_idle,
                "in_use": len(self.inuse),
            }
        free = c.free_blocks().tolist()
        tree = c.cached_blocks().tolist()
        priv: list[int] = []
        for rid, st in self.live.items():
            tbl = c.request_blocks(rid).tolist()
            if len(tbl) != self._pages(st[0]) or c.num_cached_tokens(rid) != st[2]:
                raise AccountingError(f"request {rid}: table / cached prefix differ")
            priv.extend(tbl[st[2] // self.bs :])
        parts = free + tree + priv
        if len(parts) != self.n - 1 or set(parts) != everything:
            raise AccountingError(
                f"free {len(free)} + tree {len(tree)} + private {len(priv)} pages "
                f"do not partition the pool of {self.n - 1}"
            )
        if len(tree) != c.num_cached_blocks or len(free) != c.num_unused_blocks:
            raise AccountingError("page lists disagree with the counters")
        return {"free": len(free), "tree": len(tree), "private": len(priv)}

    # -- ops
    def _admit(self) -> None:
        rng = self.rng
        rid = self.next_id
        self.next_id += 1
        j = rng.randrange(len(self.pop.prompts))
        prompt = self.pop.prompts[j]
        skip = rng.random() < 0.02
        adm = self.cache.admit(
            rid, prompt, cache_salt=self.pop.salts[j], lora=self.pop.loras[j], skip_reading=skip
        )
        if adm is None:
            self.fails += 1
            self.pressure = True
            self.done("admit_none")
            return
        self.hits += adm.num_cached_tokens
        self.queries += len(prompt)
        self._register(rid, len(prompt), rng.randrange(16, 401), adm)
        self.done("admit")

    def _free(self, rid: int) -> None:
        self.cache.free(rid)
        self._drop(rid)
        self.done("free")

    def _error(self) -> None:
        rng, c = self.rng, self.cache
        r = rng.randrange(6)
        cached = c.num_cached_blocks
        live = list(self.live)
        try:
            if r == 0 and live:
                c.admit(live[0], self.pop.prompts[0])
            elif r == 1:
                c.free(10**12 + rng.randrange(1000))
            elif r == 2 and self.hc and self.inuse:
                c.evict_blocks([next(iter(self.inuse))])
            elif r == 3 and live:
                c.append_batch(np.array([live[0], live[0]], np.int64), np.ones(2, np.int32))
            elif r == 4 and live:
                c.reset()
            else:
                c.append(10**12, np.ones(1, np.int32))
        except (DuplicateRequestError, UnknownRequestError, BlockInUseError, InvalidArgumentError):
            pass
        else:
            raise AssertionError(f"error op {r} did not raise")
        if c.num_cached_blocks != cached:
            raise AccountingError("a failed call changed the cached set")
        self.done("error")

    def step(self) -> None:
        rng, c, live = self.rng, self.cache, self.live
        if self.events and self.ops % 64 == 63:
            self.n_events += len(c.take_events())
            self.done("take_events")
            return
        if self.draining:
            if live:
                if len(live) > 1 and rng.random() < 0.5:
                    ids = list(live)
                    c.free_batch(np.array(ids, np.int64))
                    for rid in ids:
                        self._drop(rid)
                    self.done("free_batch")
                else:
                    self._free(next(iter(live)))
            else:
                c.reset()
                self.draining = False
                if c.num_cached_blocks != 0:
                    raise AccountingError("reset left cached blocks")
                self.done("reset")
                self.sample_empty(c, self.events)
            return
        if self.pressure and live:
            self.pressure = False
            self._free(next(iter(live)))
            return
        if self.reset_every and rng.random() < 1.0 / self.reset_every:
            self.draining = True
        x = rng.random()
        if not live or (x < 0.12 and len(live) < self.max_live):
            self._admit()
        elif x < 0.42:
            rid = rng.choice(list(live)) if len(live) > 1 else next(iter(live))
            k = 1 if rng.random() < 0.7 else rng.randrange(1, 9)
            if c.append(rid, self.pop.tokens(rng, k)):
                self._grow(rid, k)
                self.done("append")
                if live[rid][1] <= 0:
                    self._free(rid)
            else:
                self.pressure = True
                self.fails += 1
                self.done("append_false")
        elif x < 0.67:
            ids = list(live)
            if rng.random() < 0.8:
                ks = [1] * len(ids)
                ok = c.append_batch(np.array(ids, np.int64), self.pop.tokens(rng, len(ids)))
            else:
                ks = [rng.randrange(4) for _ in ids]
                offs = np.zeros(len(ids) + 1, np.int64)
                np.cumsum(ks, out=offs[1:])
                ok = c.append_batch(
                    np.array(ids, np.int64), self.pop.tokens(rng, int(offs[-1])), offs
                )
            if ok:
                for rid, k in zip(ids, ks, strict=True):
                    if k:
                        self._grow(rid, k)
                self.done("append_batch")
                for rid in ids:
                    if live[rid][1] <= 0:
                        self._free(rid)
            else:
                self.pressure = True
                self.fails += 1
                self.done("append_batch_false")
        elif x < 0.77 or len(live) >= self.max_live:
            if len(live) > 3 and rng.random() < 0.1:
                ids = rng.sample(list(live), rng.randrange(2, 4))
                c.free_batch(np.array(ids, np.int64))
                for rid in ids:
                    self._drop(rid)
                self.done("free_batch")
            else:
                self._free(rng.choice(list(live)))
        elif x < 0.87:
            j = rng.randrange(len(self.pop.prompts))
            c.lookup(self.pop.prompts[j], cache_salt=self.pop.salts[j], lora=self.pop.loras[j])
            self.done("lookup")
        elif x < 0.91:
            if self.hc:
                ids = []
                for _ in range(rng.randrange(1, 9)):
                    b = rng.randrange(1, self.n)
                    if b not in self.inuse:
                        ids.append(b)
                got = c.evict_blocks(np.array(ids, np.int64))
                if not 0 <= got <= len(ids):
                    raise AccountingError(f"evict_blocks returned {got} for {len(ids)}")
                self.done("evict_blocks")
            else:
                c.evict(rng.randrange(1, 1025))
                self.done("evict")
        elif x < 0.95:
            ids = list(live)
            if rng.random() < 0.5:
                out = self.out_buf[: len(ids)]
                c.block_tables(np.array(ids, np.int64), out.shape[1], out=out)
                self.done("block_tables")
            else:
                ql = np.ones(len(ids), np.int64)
                sm = c.slot_mapping(np.array(ids, np.int64), ql)
                if len(sm) != len(ids):
                    raise AccountingError("slot_mapping length")
                self.done("slot_mapping")
        elif x < 0.97 and not self.hc:
            rid = rng.choice(list(live))
            c.checkpoint(rid)
            st = live[rid]
            new_cached = c.num_cached_tokens(rid)
            self.private -= (new_cached - st[2]) // self.bs
            st[2] = new_cached
            self.done("checkpoint")
        elif x < 0.985:
            self._error()
        else:
            c.take_stats()
            self.done("take_stats")

    def summary(self) -> dict[str, Any]:
        return {
            "hit_rate": self.hits / max(1, self.queries),
            "failed_admit_or_append": self.fails,
            "events": self.n_events,
        }


class SlotPool:
    """Python free stack of pages for the raw radix tree (page ``p`` = slots
    ``p*ps .. p*ps+ps-1``)."""

    def __init__(self, num_pages: int, ps: int) -> None:
        self.ps = ps
        self.pages = np.arange(num_pages, dtype=np.int32)[::-1].copy()
        self.top = num_pages
        self.offs = np.arange(ps, dtype=np.int32)

    def alloc(self, n: int) -> np.ndarray:
        k = -(-n // self.ps)
        if k > self.top:
            raise AccountingError("slot pool overdrawn")
        pg = self.pages[self.top - k : self.top][::-1].copy()
        self.top -= k
        if self.ps == 1:
            return pg
        return (pg[:, None] * self.ps + self.offs).reshape(-1)[:n].copy()

    def free(self, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        pg = np.unique(slots // self.ps) if self.ps > 1 else slots
        self.pages[self.top : self.top + len(pg)] = pg
        self.top += len(pg)


class TreeSoak(Soak):
    """The raw ``RadixTree`` with a Python slot pool."""

    def __init__(self, ps: int, capacity_pages: int, seed: int, events: bool, reset_every: int):
        super().__init__(seed)
        self.name = f"radix tree (page {ps}, {capacity_pages * ps:,} slots)"
        self.ps = ps
        self.cap = capacity_pages
        self.tree = kvindex.RadixTree(ps, enable_events=events)
        self.pool = SlotPool(capacity_pages, ps)
        self.events = events
        self.reset_every = reset_every
        # rid -> (tokens, matched slots, own slots, node, ns)
        self.live: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int, str | None]] = {}
        self.private = 0  # pages
        self.extra_locks: list[int] = []
        self.stale: list[int] = []
        self.draining = False
        self.hits = 0
        self.queries = 0
        self.n_events = 0
        self.refused = 0
        self.max_tree = capacity_pages * ps * 3 // 4

    def fill_to_capacity(self) -> None:
        t = self.tree
        i = 0
        for _ in range(FILL_ROUNDS):
            while self.pool.top * self.ps >= 2048:
                toks = self.pop.tokens(self.rng, 2048).copy()
                toks[0] = 1_000_000 + i
                i += 1
                r = t.insert(toks, self.pool.alloc(len(toks)))
                self.pool.free(r.to_free)
                self.done("warm_fill")
                if self.events:
                    t.take_events()
                    self.done("take_events")
            self.pool.free(t.evict(t.total_size))
            self.done("evict")
        self.pool.free(t.reset())
        self.done("reset")

    def check_cheap(self) -> None:
        t = self.tree
        total = t.total_size
        if total != t.evictable_size + t.protected_size:
            raise AccountingError("total_size != evictable + protected")
        if self.pool.top + total // self.ps + self.private != self.cap:
            raise AccountingError(
                f"free {self.pool.top} + tree {total // self.ps} + running {self.private} "
                f"pages != {self.cap}"
            )

    def check_full(self) -> dict[str, int]:
        t = self.tree
        t.check_invariants()
        tree_slots = t.all_slots()
        own = [r[2] for r in self.live.values()]
        ps = self.ps
        tree_pages = np.unique(tree_slots // ps)
        if len(tree_pages) * ps != len(tree_slots):
            raise AccountingError("tree pages are not whole")
        own_pages = [np.unique(o // ps) for o in own]
        allp = np.concatenate([self.pool.pages[: self.pool.top], tree_pages, *own_pages])
        if len(allp) != self.cap or not np.array_equal(np.sort(allp), np.arange(self.cap)):
            raise AccountingError("pool, tree and running requests do not partition the slots")
        for toks, matched, _, node, _ in self.live.values():
            if not np.array_equal(t.path_slots(node), matched):
                raise AccountingError("a locked path's slots changed")
            del toks
        if t.protected_size < max((len(r[1]) for r in self.live.values()), default=0):
            raise AccountingError("protected_size below a locked path")
        return {
            "free_pages": int(self.pool.top),
            "tree_pages": len(tree_pages),
            "running_pages": self.private,
            "nodes": t.num_nodes,
        }

    def _take(self, n: int) -> np.ndarray | None:
        short = -(-n // self.ps) - self.pool.top
        if short > 0:
            fr = self.tree.evict(short * self.ps)
            self.pool.free(fr)
            self.done("evict")
            if -(-n // self.ps) > self.pool.top:
                return None
        return self.pool.alloc(n)

    def _start(self) -> None:
        rng, t = self.rng, self.tree
        j = rng.randrange(len(self.pop.prompts))
        ns = self.pop.ns(j)
        gen = self.pop.tokens(rng, rng.randrange(16, 401))
        toks = np.concatenate([self.pop.prompts[j], gen])
        m = t.match_prefix(toks, ns)
        self.done("match_prefix")
        hit, matched, node = m.hit_len, m.slots, m.node
        self.hits += hit
        self.queries += len(toks)
        t.lock(node)
        self.done("lock")
        own = self._take(len(toks) - hit)
        if own is None:  # everything left is locked: give up this one
            self.refused += 1
            t.unlock(node)
            self.done("unlock")
            return
        rid = self.next_id
        self.next_id += 1
        self.live[rid] = (toks, matched, own, node, ns)
        self.private += -(-len(own) // self.ps)

    def _finish(self, rid: int) -> None:
        toks, matched, own, node, ns = self.live.pop(rid)
        r = self.tree.insert(toks, np.concatenate([matched, own]), ns)
        to_free = r.to_free
        self.pool.free(to_free)
        self.private -= -(-len(own) // self.ps)
        self.done("insert")
        self.tree.unlock(node)
        self.done("unlock")
        if rid % 8 == 0:
            self.stale.append(node)
            if len(self.stale) > 16:
                self.stale.pop(0)

    def _trim(self) -> None:
        over = self.tree.total_size - self.max_tree
        if over > 0:
            self.pool.free(self.tree.evict(over))
            self.done("evict")

    def step(self) -> None:
        rng, t, live = self.rng, self.tree, self.live
        if self.events and self.ops % 64 == 63:
            self.n_events += len(t.take_events())
            self.done("take_events")
            return
        if self.draining:
            if self.extra_locks:
                t.unlock(self.extra_locks.pop())
                self.done("unlock")
            elif live:
                self._finish(next(iter(live)))
            else:
                self.pool.free(t.reset())
                self.draining = False
                self.stale.clear()
                if t.total_size != 0 or self.private != 0:
                    raise AccountingError("reset left tokens")
                self.done("reset")
                self.sample_empty(t, self.events)
            return
        if self.reset_every and rng.random() < 1.0 / self.reset_every:
            self.draining = True
        x = rng.random()
        if not live or (x < 0.3 and len(live) < self.max_live):
            self._start()
        elif x < 0.55 or len(live) >= self.max_live:
            self._finish(rng.choice(list(live)))
            self._trim()
        elif x < 0.7:
            j = rng.randrange(len(self.pop.prompts))
            t.probe(self.pop.prompts[j], self.pop.ns(j))
            self.done("probe")
        elif x < 0.8:
            j = rng.randrange(len(self.pop.prompts))
            toks = self.pop.prompts[j]
            n = len(toks) // self.ps * self.ps
            slots = self._take(n)
            if slots is not None:
                r = t.insert(toks[:n], slots, self.pop.ns(j), priority=rng.randrange(3))
                self.pool.free(r.to_free)
                self.done("insert")
                self._trim()
        elif x < 0.86:
            self.pool.free(t.evict(rng.randrange(1, 2049)))
            self.done("evict")
        elif x < 0.92:
            if self.extra_locks and rng.random() < 0.5:
                t.unlock(self.extra_locks.pop(rng.randrange(len(self.extra_locks))))
                self.done("unlock")
            elif len(self.extra_locks) < 8:
                node = live[rng.choice(list(live))][3]
                t.lock(node)
                self.extra_locks.append(node)
                self.done("lock")
            else:
                self.done_noop()
        elif x < 0.96:
            rid = rng.choice(list(live))
            if len(t.path_slots(live[rid][3])) != len(live[rid][1]):
                raise AccountingError("path_slots length")
            self.done("path_slots")
        else:
            self._error()

    def done_noop(self) -> None:
        self.tree.lock_ref(0)
        self.done("lock_ref")

    def _error(self) -> None:
        rng, t = self.rng, self.tree
        total = t.total_size
        r = rng.randrange(3)
        if r == 0:
            # A fresh leaf with no lock of its own: unlocking it must fail.
            toks = self.pop.tokens(rng, 8 * self.ps)
            slots = self._take(len(toks))
            if slots is None:
                self.done_noop()
                return
            ins = t.insert(toks, slots)
            self.pool.free(ins.to_free)
            self.done("insert")
            m = t.match_prefix(toks)
            self.done("match_prefix")
            total = t.total_size
            try:
                t.unlock(m.node)
            except LockError:
                pass
            else:
                raise AssertionError("unlock without a lock did not raise")
        elif r == 1:
            toks = self.pop.tokens(rng, 4 * self.ps)
            slots = self._take(len(toks))
            if slots is None:
                self.done_noop()
                return
            total = t.total_size  # _take may have evicted
            bad = slots.copy()
            bad[-1] = bad[0]  # a slot passed twice: rejected, nothing changes
            try:
                t.insert(toks, bad)
            except InvalidArgumentError:
                pass
            else:
                raise AssertionError("insert with a repeated slot did not raise")
            self.pool.free(slots)
        else:
            if not self.stale:
                self.done_noop()
                return
            h = self.stale[rng.randrange(len(self.stale))]
            try:
                t.lock_ref(h)
            except StaleHandleError:
                pass  # evicted since
        if t.total_size != total:
            raise AccountingError("a failed call changed the tree")
        self.done("error")

    def summary(self) -> dict[str, Any]:
        return {
            "hit_rate": self.hits / max(1, self.queries),
            "events": self.n_events,
            "refused_starts": self.refused,
        }


# ------------------------------------------------------------------------ driver


def leak_drift(samples: list[tuple[int, int, int, int]]) -> dict[str, int]:
    """Growth between the first and the second half of the empty-state samples: the
    largest C heap (bytes) / Python object count of the second half minus those of the
    first. A one-time capacity step falls in one half; a leak grows both maxima
    linearly, so the difference is about (leak per op) × (ops / 2). Without samples
    (no resets) both are 0."""
    if len(samples) < 2:
        return {"heap_drift": 0, "objects_drift": 0}
    h = len(samples) // 2
    first, second = samples[:h], samples[h:]
    return {
        "heap_drift": max(s[2] for s in second) - max(s[2] for s in first),
        "objects_drift": max(s[3] for s in second) - max(s[3] for s in first),
    }


def run_soak(
    soak: Soak, ops: int, checkpoint: int, warmup_frac: float = 0.1, log: bool = True
) -> dict[str, Any]:
    """Runs ``ops`` ops; returns the figures. Raises on an accounting/invariant failure.

    Memory is sampled right after each checkpoint's full check (so the check's own
    temporaries are in every sample alike): the warm-up figure is the first sample at
    or after ``warmup_frac * ops``, the end figure the one after the final check."""
    prefill_numpy_cache()
    soak.fill_to_capacity()
    warm_at = int(ops * warmup_frac)
    warm: tuple[int, int, int] | None = None
    series: list[tuple[int, int, int]] = []
    checkpoints = 0
    last_parts: dict[str, int] = {}
    next_cp = checkpoint
    t0 = time.perf_counter()
    t_check = 0.0
    while soak.ops < ops:
        soak.step()
        if soak.ops >= next_cp or soak.ops >= ops:
            next_cp += checkpoint
            c0 = time.perf_counter()
            last_parts = soak.check_full()
            t_check += time.perf_counter() - c0
            checkpoints += 1
            series.append((soak.ops, rss_bytes(), heap_bytes()))
            soak.records += 1
            if warm is None and soak.ops >= warm_at:
                warm = series[-1]
            if log and checkpoints % 10 == 0:
                el = time.perf_counter() - t0
                print(
                    f"  {soak.name}: {soak.ops:,} ops, {el:.0f} s, RSS "
                    f"{series[-1][1] / 2**20:.1f} MiB, heap {series[-1][2] / 2**20:.1f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
    wall = time.perf_counter() - t0
    assert warm is not None
    end = series[-1]
    after = [s for s in series if s[0] >= warm[0]]
    rs = [s for s in soak.reset_samples if s[0] >= warm[0]]
    drift = leak_drift(rs)
    # Robust RSS figures: medians over the ten checkpoints from the warm-up point and
    # over the last ten (single samples move by a few % with what is live).
    k = max(1, min(10, len(series) // 10))
    i0 = series.index(warm)
    rss_warm_med = int(np.median([s[1] for s in series[i0 : i0 + k]]))
    rss_end_med = int(np.median([s[1] for s in series[-k:]]))
    return {
        "cache": soak.name,
        "ops": soak.ops,
        "wall_s": wall,
        "check_s": t_check,
        "ops_per_s": soak.ops / wall,
        "checkpoints_passed": checkpoints,
        "warm_at_op": warm[0],
        "rss_warm": warm[1],
        "rss_end": end[1],
        "rss_ratio": end[1] / warm[1],
        "rss_max_after_warm": max(s[1] for s in after),
        "rss_warm_median": rss_warm_med,
        "rss_end_median": rss_end_med,
        "rss_median_ratio": rss_end_med / rss_warm_med,
        "heap_warm": warm[2],
        "heap_end": end[2],
        "heap_max_after_warm": max(s[2] for s in after),
        "heap_min_after_warm": min(s[2] for s in after),
        "series": series,
        "reset_samples": soak.reset_samples,
        "resets_after_warm": len(rs),
        **drift,
        "final_partition": last_parts,
        "op_counts": dict(sorted(soak.counts.items())),
        **soak.summary(),
    }


def make_soak(kind: str, seed: int, events: bool, reset_every: int) -> Soak:
    """The soak configurations. Sizes are chosen so that the pool runs short now and
    then (about 1 % of admissions refused, a few appends; 0.2 % of raw-tree requests
    find every slot locked), so the refusal paths run too."""
    if kind == "hash_chain":
        return RequestSoak("hash_chain", 1536, 16, seed, events, reset_every)
    if kind == "hash_chain_sha":
        # The SHA-256 modes use the prefix memo (a second per-block structure).
        return RequestSoak("hash_chain", 1536, 16, seed, events, reset_every, "vllm_sha256_cbor")
    if kind == "radix_prefix":
        return RequestSoak("radix_prefix", 1536, 16, seed, events, reset_every)
    if kind == "radix_prefix_1":
        return RequestSoak("radix_prefix", 24576, 1, seed, events, reset_every)
    if kind == "radix":
        return TreeSoak(1, 40960, seed, events, reset_every)
    if kind == "radix_16":
        return TreeSoak(16, 2560, seed, events, reset_every)
    raise SystemExit(f"unknown cache {kind!r}")


CACHES = ("hash_chain", "hash_chain_sha", "radix_prefix", "radix_prefix_1", "radix", "radix_16")


def run_one(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    soak = make_soak(kind, args.seed, not args.no_events, args.reset_every)
    r = run_soak(soak, args.ops, args.checkpoint)
    r["ok"] = r["rss_median_ratio"] <= 1.05
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ops", type=int, default=10_000_000, help="ops per cache")
    ap.add_argument(
        "--caches",
        default="hash_chain,hash_chain_sha,radix_prefix,radix",
        help="comma list of " + ", ".join(CACHES),
    )
    ap.add_argument("--checkpoint", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reset-every", type=int, default=200_000, help="mean ops between resets")
    ap.add_argument("--no-events", action="store_true")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run every cache in this process (default: one subprocess each, so that each "
        "RSS figure is that cache's alone)",
    )
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    kinds = args.caches.split(",")
    for k in kinds:
        if k not in CACHES:
            raise SystemExit(f"unknown cache {k!r}")
    results: dict[str, Any] = {
        "ops_per_cache": args.ops,
        "checkpoint_every": args.checkpoint,
        "seed": args.seed,
        "events": not args.no_events,
        "python": platform.python_version(),
        "kvindex": kvindex.__version__,
        "runs": {},
    }
    failed = []
    for kind in kinds:
        if args.in_process or len(kinds) == 1:
            r = run_one(kind, args)
        else:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "r.json")
                cmd = [sys.executable, __file__, "--caches", kind, "--json", out]
                cmd += ["--ops", str(args.ops), "--checkpoint", str(args.checkpoint)]
                cmd += ["--seed", str(args.seed), "--reset-every", str(args.reset_every)]
                cmd += ["--no-events"] if args.no_events else []
                rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
                if not os.path.exists(out):
                    raise SystemExit(f"{kind}: soak failed (exit {rc}), see stderr above")
                with open(out) as f:
                    r = json.load(f)["runs"][kind]
        if not r["ok"]:
            failed.append(kind)
        results["runs"][kind] = r
        if args.in_process or len(kinds) == 1:
            skip = ("op_counts", "series", "reset_samples")
            brief = {k: v for k, v in r.items() if k not in skip}
            print(f"{kind}: {json.dumps(brief)}", file=sys.stderr, flush=True)
    mib = 2**20
    print(
        f"\n### Soak: {args.ops:,} ops per cache (seed {args.seed}; accounting after every op, "
        f"invariants every {args.checkpoint:,})\n"
    )
    print(
        "| cache | ops/s | wall s | checkpoints | RSS warm-up MiB | RSS end MiB | end/warm "
        "| median end/warm | RSS max MiB | C heap warm-up MiB | C heap end MiB | resets | "
        "heap drift at resets KiB | objects drift | hit rate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["runs"].values():
        print(
            f"| {r['cache']} | {r['ops_per_s']:,.0f} | {r['wall_s']:.0f} | "
            f"{r['checkpoints_passed']} | {r['rss_warm'] / mib:.1f} | {r['rss_end'] / mib:.1f} | "
            f"{r['rss_ratio']:.3f} | {r['rss_median_ratio']:.3f} | "
            f"{r['rss_max_after_warm'] / mib:.1f} | "
            f"{r['heap_warm'] / mib:.2f} | {r['heap_end'] / mib:.2f} | "
            f"{r['resets_after_warm']} | {r['heap_drift'] / 1024:+.1f} | "
            f"{r['objects_drift']:+d} | {r['hit_rate']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if failed:
        raise SystemExit(f"RSS (median of 10 checkpoints) grew more than 5 %: {failed}")


if __name__ == "__main__":
    main()
