"""Executable model of vLLM 0.33's KV-cache lifecycle for one full-attention group.

It is the oracle for the engine-grade request lifecycle of kvindex's caches: chunked
prefill, lookahead slots, speculative drafts with rejection, async scheduling
(slots reserved for token ids not known yet), external hits with delayed caching,
preemption and resume. ``tests/request/test_lifecycle_model.py`` replays vLLM 0.33's own
traces (``tests/data/vllm_golden/vllm_lifecycle.json``) through it and checks every
answer, block table, free queue and KV event. Pure Python, written from the
behaviour of vLLM's ``KVCacheManager`` / ``BlockPool`` / ``FreeKVCacheBlockQueue``
and of the scheduler that drives them (not copied from them).

Two layers
==========
1. vLLM's own calls, same names and arguments, same answers:
   :meth:`VllmLifecycleModel.get_computed_blocks`, :meth:`~VllmLifecycleModel.allocate_slots`,
   :meth:`~VllmLifecycleModel.cache_blocks`, :meth:`~VllmLifecycleModel.free`, plus the
   request-side :meth:`~VllmLifecycleModel.append_output_token_ids`.
2. The scheduler-facing protocol proposed for kvindex (below): ``admit`` / ``schedule`` /
   ``commit_tokens`` / ``preempt`` / ``finish`` / ``finish_transfer`` and their batch forms,
   each a fixed sequence of layer-1 calls, exactly as ``vllm/v1/core/sched/scheduler.py``
   makes them. The Rust caches implement layer 2. ``LifecycleMachine`` in the test module
   runs every layer-2 call in random order against the model's invariants and event
   stream; run against a Rust cache as well, it becomes the differential test (results,
   block tables, free queues, events and stats compared after every step).

What the golden traces pin and what they do not: the 900 traced operations fix chunked
prefill, lookahead, drafts with rejection, preemption and resume, ``full_sequence_must_fit``
(in scenario ``sha256_cbor``/bs 2 some admissions are refused by it alone), free-queue
order and events. vLLM's whole-prompt KV-event traces (``vllm_kv_events.json``: cache salts, decode
steps, evictions, resets) replay through ``admit`` / ``append`` / ``finish`` as well.
Neither file uses a watermark, ``reserved_blocks``, external tokens or async
placeholders: those follow vLLM's ``allocate_slots`` / scheduler code as read, and are
pinned by the model's own tests.

vLLM semantics reproduced (single group, ``hash_block_size == block_size``)
===========================================================================
* Block 0 is the null block; ids ``1..num_blocks-1`` start in the free queue in id order.
* Free queue = vLLM's ``FreeKVCacheBlockQueue``: head is the next victim. ``get_new_blocks``
  pops from the head and lazily evicts a popped block that still has a hash (one
  ``BlockRemoved`` per physical block). ``touch`` removes a free hit block wherever it
  sits. ``free`` walks the table in reverse: blocks reaching ref 0 that have no hash are
  prepended (in that reversed order), cached ones appended (in that reversed order).
* Hash map: a hash may name several physical copies (no de-duplication); a lookup uses
  the first inserted copy; evicting one copy leaves the others hittable.
* ``get_computed_blocks``: longest run of cached block hashes from block 0, capped at
  ``num_tokens - 1`` tokens and block aligned; no side effects. Empty for
  ``skip_reading`` (prompt-logprobs) requests.
* ``allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
  num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
  full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)``:
  ``local = num_computed + num_new_computed``; ``total = min(local + external,
  max_model_len)``; the watermark (``int(watermark * num_blocks)`` blocks) applies to
  WAITING / PREEMPTED requests when ``has_scheduled_reqs``; with
  ``full_sequence_must_fit`` the whole sequence (``min(num_tokens, max_model_len)``) must
  fit in the free blocks (watermark included, ``reserved_blocks`` not); then
  ``need_slot = min(total + num_new_tokens + lookahead, max_model_len)`` must fit in
  ``free - reserved_blocks`` (watermark included), counting hit blocks that sit in the
  free queue as consumed. ``None`` = refused, nothing changed (hit blocks not touched).
  Otherwise: touch hits, append them, allocate blocks for external tokens, then
  ``cdiv(need_slot, block_size) - len(table)`` blocks for the rest; unless
  ``delay_cache_blocks``, cache every full block up to ``num_tokens_to_cache =
  min(total + num_new_tokens, request.num_tokens)``. That cap is what keeps lookahead
  slots, unverified drafts and not-yet-known token ids out of the cache. Returns the
  blocks of the last allocation only (vLLM leaves the external-token blocks out).
* A chunk's full blocks are cached when the chunk is *scheduled*, before its forward
  pass: another request admitted later in the same step hits them.
* Rejected drafts: ``num_computed`` rolls back; their slots stay in the table and the
  next ``allocate_slots`` reuses them (it allocates ``max(0, needed - held)``).
* ``free`` = finish or preempt. Preemption sets ``num_computed = 0`` and counts the
  preemption; the request resumes through ``get_computed_blocks`` with prompt + outputs.
* Prefix-cache stats are recorded when an admission succeeds: ``requests``, ``queries``
  (all ``num_tokens``), ``hits`` (local hit tokens); a request that was ever preempted
  counts in ``preempted_requests`` / ``preempted_queries`` / ``preempted_hits`` instead.
* KV events: one ``BlockStored`` per ``cache_full_blocks`` run (hashes as the low 64 bits,
  ``parent_block_hash`` = hash of the block before the run or ``None``, the run's token
  ids), one ``BlockRemoved`` per evicted physical block, ``AllBlocksCleared`` on reset.

Async scheduling and how it maps onto vLLM
==========================================
vLLM's async scheduler (``--async-scheduling``) schedules step k+1 before step k's sampled
token is known: ``num_computed_tokens`` already counts the in-flight token and the
request carries an output placeholder. ``allocate_slots`` then reserves the slot of a
token whose id is unknown, and ``num_tokens_to_cache = min(..., request.num_tokens)``
(``num_tokens`` counts known ids only) keeps every block holding an unknown id out of the
cache. When the id arrives, ``append_output_token_ids`` appends it and hashes any block it
fills; that block is *cached at the request's next* ``allocate_slots`` (vLLM caches only
inside ``allocate_slots`` / ``cache_blocks``), so a block is never visible before all its
ids are known, and becomes visible exactly one scheduling call after its last id lands.

The model states this with one counter per request, ``pending``: sampled tokens whose
ids are not committed yet. A ``schedule`` whose last non-draft position is the last
position of the sequence (known ids + pending placeholders) makes the step sample, so
``pending += 1``; ``commit_tokens`` turns pending placeholders (and accepted drafts) into
known ids. Positions ``>= num_tokens`` are placeholders; scheduling beyond
``num_tokens + pending`` is a caller error (no id will ever come for that slot).
The golden traces are the synchronous special case: every sampled id is committed right
after the step that sampled it. Drafts are only accepted when ``pending == 0`` (the
draft step follows the last committed token), as in vLLM's synchronous spec decode.

Proposed kvindex protocol (one Python->Rust call per operation family per step)
===============================================================================
All arrays numpy, ids ``int64``, tokens ``int32`` or ``int64``, results ``int32``::

    admit(request_ids, tokens, offsets, *, chunk=None, lookahead=0, must_fit=False,
          external_prefix=None, delay_cache=False, reserved_blocks=0,
          has_scheduled=True, cache_salt=None, lora=None, skip_reading=False)
        -> (num_admitted, hit_tokens[int32], scheduled[int32], block_ids, block_offsets)
      New requests (tokens = prompt) or preempted ones resuming (their prompt + outputs
      are kept; pass no tokens). In order, as vLLM's waiting loop: lookup; external tokens
      beyond the local hit from ``external_prefix`` (per request: leading tokens another
      tier holds; the cache subtracts the hit, so the caller needs no lookup first);
      allocate ``min(num_tokens - hit - external, chunk)`` tokens (0 with
      ``delay_cache``); stop at the first refusal; requests from ``num_admitted`` on are
      untouched (the caller keeps them waiting). ``admit(rid, prompt)`` with
      ``chunk=None`` is today's ``admit``.
    schedule(request_ids, num_new_tokens, *, lookahead=0, draft_tokens=None,
             draft_offsets=None, reserved_blocks=0)
        -> (num_scheduled, block_ids, block_offsets)
      Running requests, in order: the next prefill chunk or decode step (``num_new_tokens``
      includes the drafts, which are the last positions). Stops at the first refusal; the
      caller preempts (``preempt``) and calls again with the rest, as vLLM's running loop.
    commit_tokens(request_ids, tokens, offsets, num_rejected=None) -> None
      Sampled ids (accepted drafts first, then the bonus / sampled token) for the
      placeholders ``schedule`` reserved; ``num_rejected`` rolls back rejected drafts.
      Hashes each block whose last id is now known; the block is cached at the
      request's next ``schedule``. All-or-nothing validation: ids that do not fit the
      reserved placeholders, unknown / finished requests, rejecting more drafts than
      scheduled -> ``KvIndexError``, state unchanged.
    preempt(request_ids) / finish(request_ids) (= today's ``free_batch``) -> None
    finish_transfer(request_ids) -> None
      External KV landed for ``delay_cache`` admissions: cache their blocks now.
    lookup(tokens) -> int; block_tables / slot_mapping / free_queue / take_events /
    take_stats / check_invariants unchanged.

Today's calls are the one-chunk special case: ``admit(rid, prompt)`` =
``admit(..., chunk=None)`` (whole prompt scheduled now, every full prompt block
cached, the step samples); ``append(rid, toks)`` / ``append_batch`` = ids that are
known and computed in the same call: ``commit_tokens(toks)`` (the first fills the
sampled placeholder) fused with ``schedule(len(toks))`` capped at the new
``num_tokens``, so every full block is cached at once and the step samples again (what
:meth:`VllmLifecycleModel.append` does; the tests check that ``admit`` + ``append`` +
``finish`` give ``HashChainModel``'s block tables, free queue and cache exactly).
The model's public methods carry these names, one request per call plus
``admit_batch`` / ``schedule_batch`` / ``commit_batch`` with the batch semantics above,
so the Rust side can be compared call for call.

Not modelled: several KV-cache groups (hybrid, sliding window, Mamba), EAGLE's dropped
last hit block, ``kv_cache_report_mode="full"``, multimodal and prompt-embeds extra keys
(LoRA and cache salt are), ``evict_blocks``, the scheduler's deferred return of a
finished request's blocks while a GPU step is in flight, failed KV transfers, and async
scheduling combined with drafts (drafts need ``pending == 0``). ``max_model_len``
defaults to unbounded; the remote-KV request that vLLM sends back through its waiting
queue (where the watermark would apply) continues with ``schedule``.

Caller errors raise :class:`LifecycleError` and leave the model unchanged; refusals
(out of blocks) return ``None``.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "Admitted",
    "LifecycleError",
    "Request",
    "Status",
    "VllmLifecycleModel",
    "apply_commit",
    "check_commit",
    "check_schedule",
    "make_hasher",
]

_NONE = -1
_MASK64 = (1 << 64) - 1


class LifecycleError(ValueError):
    """A caller error (the Rust side raises a ``KvIndexError`` subclass); nothing changed."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _low64(h: bytes) -> int:
    return int.from_bytes(h, "big") & _MASK64


# ---------------------------------------------------------------------------- hashing

Hasher = Callable[[object], bytes]


def make_hasher(algo: str) -> Hasher:
    """vLLM 0.33's ``--prefix-caching-hash-algo`` functions: object -> digest."""
    if algo == "sha256":
        return lambda obj: hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()
    if algo in ("sha256_cbor", "xxhash_cbor"):
        import cbor2

        if algo == "sha256_cbor":
            return lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
        import xxhash

        return lambda obj: xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))
    if algo == "xxhash":
        import xxhash

        return lambda obj: xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=5))
    raise LifecycleError(f"unknown hash algo {algo!r}")


# ---------------------------------------------------------------------------- requests


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    FINISHED = "finished"


@dataclass
class Request:
    """vLLM's ``Request`` as the KV cache sees it."""

    rid: str | int
    tokens: list[int]  # prompt + committed outputs (known ids): ``all_token_ids``
    num_prompt_tokens: int
    cache_salt: str | None = None
    lora: tuple[str, str] | None = None
    skip_reading: bool = False
    status: Status = Status.WAITING
    num_computed: int = 0
    num_preemptions: int = 0
    spec: list[int] = field(default_factory=list)  # drafts of the step in flight
    pending: int = 0  # sampled placeholders whose ids are not committed yet
    hashes: list[bytes] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


def check_schedule(
    r: Request, num_new_tokens: int, drafts: list[int], lookahead: int, reserved: int
) -> int:
    """Validate a step for ``r``; returns the placeholders it adds (1 if it samples)."""
    if r.spec:
        raise LifecycleError("commit the drafts of the previous step first")
    if num_new_tokens < 1 or lookahead < 0 or reserved < 0:
        raise LifecycleError("num_new_tokens must be >= 1, lookahead and reserved >= 0")
    if len(drafts) >= num_new_tokens:
        raise LifecycleError("drafts must leave at least one non-draft token")
    end = r.num_computed + num_new_tokens - len(drafts)
    last = r.num_tokens + r.pending
    if end > last:
        raise LifecycleError(f"schedules position {end - 1} but the sequence ends at {last - 1}")
    if drafts and (end != last or r.pending):
        raise LifecycleError("drafts must follow the last committed token")
    return int(end == last)


def check_commit(r: Request, ids: list[int], num_rejected: int) -> None:
    """Validate committing ``ids`` (accepted drafts first) and rejecting ``num_rejected``."""
    if not 0 <= num_rejected <= len(r.spec):
        raise LifecycleError(f"rejects {num_rejected} of {len(r.spec)} drafts")
    accepted = len(r.spec) - num_rejected
    if len(ids) < accepted or ids[:accepted] != r.spec[:accepted]:
        raise LifecycleError("the accepted drafts must lead the committed ids")
    if len(ids) - accepted > r.pending:
        raise LifecycleError(
            f"{len(ids) - accepted} sampled ids for {r.pending} reserved placeholders"
        )


def apply_commit(r: Request, ids: list[int], num_rejected: int) -> None:
    """Counters of a validated commit (the caller appends and hashes the ids)."""
    accepted = len(r.spec) - num_rejected
    r.num_computed -= num_rejected
    r.pending -= len(ids) - accepted
    r.spec = []


@dataclass(frozen=True)
class Admitted:
    """Result of a successful :meth:`VllmLifecycleModel.admit`."""

    hit: int  # local prefix-cache hit tokens
    scheduled: int  # tokens scheduled for compute in this step
    new_blocks: list[int]  # every block this call allocated, in table order


# ---------------------------------------------------------------------------- the model


class VllmLifecycleModel:
    """vLLM 0.33 ``KVCacheManager`` + ``BlockPool`` (one full-attention group) + scheduler calls."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hash_algo: str = "sha256",
        seed: str = "vllm-none-hash",
        watermark: float = 0.0,
        max_model_len: int | None = None,
        enable_caching: bool = True,
    ) -> None:
        if num_blocks < 2 or block_size < 1:
            raise LifecycleError("need num_blocks >= 2 and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_fn = make_hasher(hash_algo)
        self.none_hash = self.hash_fn(seed)
        self.watermark_blocks = int(watermark * num_blocks)
        self.max_model_len = max_model_len if max_model_len is not None else 1 << 62
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, list[int]] = {}  # hash -> physical copies, first inserted first
        # Free queue: a doubly linked list over block ids with two sentinels.
        self._head, self._tail = num_blocks, num_blocks + 1
        self._prev = [_NONE] * (num_blocks + 2)
        self._next = [_NONE] * (num_blocks + 2)
        self._next[self._head], self._prev[self._tail] = self._tail, self._head
        self.num_free = 0
        for b in range(1, num_blocks):
            self._link_before(self._tail, b)
        self.requests: dict[str | int, Request] = {}
        self.req_blocks: dict[str | int, list[int]] = {}
        self.num_cached_block: dict[str | int, int] = {}
        self.events: list[dict[str, Any]] = []
        self.stats = dict.fromkeys(
            (
                "requests",
                "queries",
                "hits",
                "preempted_requests",
                "preempted_queries",
                "preempted_hits",
            ),
            0,
        )
        self.stats_reset = False

    # ------------------------------------------------------------------ free queue
    def _link_before(self, at: int, b: int) -> None:
        p = self._prev[at]
        self._prev[b], self._next[b] = p, at
        self._next[p] = b
        self._prev[at] = b
        self.num_free += 1

    def _unlink(self, b: int) -> None:
        p, n = self._prev[b], self._next[b]
        assert p != _NONE, f"block {b} is not in the free queue"
        self._next[p], self._prev[n] = n, p
        self._prev[b] = self._next[b] = _NONE
        self.num_free -= 1

    def free_queue(self) -> list[int]:
        """Free block ids, head (next victim) first."""
        out, cur = [], self._next[self._head]
        while cur != self._tail:
            out.append(cur)
            cur = self._next[cur]
        return out

    # ------------------------------------------------------------------ block pool
    def _hash_blocks(self, r: Request) -> None:
        """vLLM's request block hasher: hash every newly full block of ``r.tokens``."""
        bs = self.block_size
        for i in range(len(r.hashes), len(r.tokens) // bs):
            keys: tuple[tuple[str, ...], ...] = ()
            if r.lora is not None:
                keys += (("lora", r.lora[0], r.lora[1]),)
            if i == 0 and r.cache_salt:
                keys += (("cache_salt", r.cache_salt),)
            parent = r.hashes[-1] if r.hashes else self.none_hash
            blk = tuple(r.tokens[i * bs : (i + 1) * bs])
            r.hashes.append(self.hash_fn((parent, blk, keys or None)))

    def _get_new_blocks(self, n: int) -> list[int]:
        assert n <= self.num_free, "allocate_slots checked capacity first"
        out = []
        for _ in range(n):
            b = self._next[self._head]
            self._unlink(b)
            h = self.block_hash[b]
            if h is not None:  # lazy eviction of a cached idle block
                copies = self.cached[h]
                copies.remove(b)
                if not copies:
                    del self.cached[h]
                self.block_hash[b] = None
                self.events.append({"type": "BlockRemoved", "block_hashes": [_low64(h)]})
            self.ref[b] = 1
            out.append(b)
        return out

    def _touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self._unlink(b)
            self.ref[b] += 1

    def _free_blocks(self, ordered: Sequence[int]) -> None:
        unhashed: list[int] = []
        for b in ordered:
            self.ref[b] -= 1
            assert self.ref[b] >= 0
            if self.ref[b] == 0:
                if self.block_hash[b] is None:
                    unhashed.append(b)
                else:
                    self._link_before(self._tail, b)
        at = self._next[self._head]
        for b in unhashed:
            self._link_before(at, b)

    def _cache_full_blocks(self, r: Request, num_cached: int, num_full: int) -> None:
        if num_cached >= num_full:
            return
        blocks = self.req_blocks[r.rid]
        new_hashes = []
        for i in range(num_cached, num_full):
            b, h = blocks[i], r.hashes[i]
            assert self.block_hash[b] is None
            self.block_hash[b] = h
            self.cached.setdefault(h, []).append(b)
            new_hashes.append(_low64(h))
        bs = self.block_size
        self.events.append(
            {
                "type": "BlockStored",
                "block_hashes": new_hashes,
                "parent_block_hash": _low64(r.hashes[num_cached - 1]) if num_cached else None,
                "token_ids": list(r.tokens[num_cached * bs : num_full * bs]),
            }
        )

    # ------------------------------------------------------------------ vLLM's KVCacheManager calls
    def add_request(
        self,
        rid: str | int,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        skip_reading: bool = False,
    ) -> Request:
        """A new WAITING request (vLLM's ``Request.__init__``: hashes the prompt's full blocks)."""
        if rid in self.requests:
            raise LifecycleError(f"request {rid!r} already exists")
        if len(tokens) == 0:
            raise LifecycleError("empty prompt")
        r = Request(rid, [int(t) for t in tokens], len(tokens), cache_salt, lora, skip_reading)
        self._hash_blocks(r)
        self.requests[rid] = r
        return r

    def get_computed_blocks(self, rid: str | int) -> tuple[list[int], int]:
        """Longest cached prefix: (hit block ids, hit tokens). No side effects."""
        return self._hit(self.requests[rid])

    def _hit(self, r: Request) -> tuple[list[int], int]:
        if not self.enable_caching or r.skip_reading:
            return [], 0
        max_blocks = (r.num_tokens - 1) // self.block_size
        hit: list[int] = []
        for h in r.hashes[:max_blocks]:
            copies = self.cached.get(h)
            if not copies:
                break
            hit.append(copies[0])
        return hit, len(hit) * self.block_size

    def _num_blocks_to_allocate(
        self, rid: str | int, num_tokens: int, new_computed: list[int]
    ) -> int:
        held = len(self.req_blocks.get(rid, ()))
        evictable = sum(1 for b in new_computed if self.ref[b] == 0)
        return max(_cdiv(num_tokens, self.block_size) - len(new_computed) - held, 0) + evictable

    def allocate_slots(
        self,
        rid: str | int,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[int] | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> list[int] | None:
        """vLLM's ``allocate_slots``: the new blocks, or ``None`` (refused, nothing changed)."""
        r = self.requests[rid]
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise LifecycleError("num_new_tokens must be > 0 without external tokens")
        new_computed = list(new_computed_blocks or ())
        local = r.num_computed + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and r.status in (Status.WAITING, Status.PREEMPTED):
            watermark = self.watermark_blocks
        if full_sequence_must_fit:
            full = min(r.num_tokens, self.max_model_len)
            need = self._num_blocks_to_allocate(rid, full, new_computed)
            if need + watermark > self.num_free:
                return None
        need_slot = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        need = self._num_blocks_to_allocate(rid, need_slot, new_computed)
        if need + watermark > self.num_free - reserved_blocks:
            return None
        table = self.req_blocks.setdefault(rid, [])
        if new_computed or num_external_computed_tokens > 0:
            assert not table, "only a new (or resuming) request adopts hit blocks"
            self._touch(new_computed)
            table.extend(new_computed)
            self.num_cached_block[rid] = len(table)
            if num_external_computed_tokens > 0:
                ext = _cdiv(local + num_external_computed_tokens, self.block_size) - len(table)
                table.extend(self._get_new_blocks(ext))
        n_new = _cdiv(need_slot, self.block_size) - len(table)
        new_blocks = self._get_new_blocks(n_new) if n_new > 0 else []
        table.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(rid, min(total + num_new_tokens, r.num_tokens))
        return new_blocks

    def cache_blocks(self, rid: str | int, num_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_tokens`` tokens."""
        r = self.requests[rid]
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = min(num_tokens, len(r.hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self._cache_full_blocks(r, num_cached, num_full)
        self.num_cached_block[rid] = num_full

    def free(self, rid: str | int) -> None:
        """Release the request's blocks, tail first."""
        blocks = self.req_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        self._free_blocks(list(reversed(blocks)))

    def append_output_token_ids(self, rid: str | int, token_ids: Sequence[int]) -> None:
        r = self.requests[rid]
        r.tokens.extend(int(t) for t in token_ids)
        self._hash_blocks(r)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while any request holds blocks."""
        if self.num_blocks - self.num_free != 1:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self.events.append({"type": "AllBlocksCleared"})
        self.stats_reset = True
        return True

    def take_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    def take_stats(self) -> dict[str, int]:
        out = dict(self.stats)
        for k in self.stats:
            self.stats[k] = 0
        return out

    # ------------------------------------------------------------------ scheduler-facing protocol
    def _req(self, rid: str | int, *statuses: Status) -> Request:
        r = self.requests.get(rid)
        if r is None:
            raise LifecycleError(f"unknown request {rid!r}")
        if statuses and r.status not in statuses:
            raise LifecycleError(f"request {rid!r} is {r.status.value}")
        return r

    def block_table(self, rid: str | int) -> list[int]:
        return list(self.req_blocks.get(rid, ()))

    def lookup(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> int:
        """Tokens a prompt would hit now (no side effects)."""
        r = Request("", [int(t) for t in tokens], len(tokens), cache_salt, lora)
        self._hash_blocks(r)
        return self._hit(r)[1]

    def admit(
        self,
        rid: str | int,
        tokens: Sequence[int] | None = None,
        *,
        chunk: int | None = None,
        lookahead: int = 0,
        must_fit: bool = False,
        external_prefix: int = 0,
        delay_cache: bool = False,
        reserved_blocks: int = 0,
        has_scheduled: bool = True,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        skip_reading: bool = False,
    ) -> Admitted | None:
        """Admit a new request (``tokens`` = prompt) or resume a preempted one (no tokens).

        vLLM's waiting loop: ``get_computed_blocks`` (local hit), then the external tokens
        beyond it: ``ext = max(0, min(external_prefix, limit) - hit)`` where
        ``external_prefix`` is how many leading tokens an offload tier / prefill worker
        holds and ``limit`` is ``num_tokens - 1`` (``num_tokens`` with ``delay_cache``:
        the whole prompt may be transferred, its last token is recomputed afterwards);
        then ``allocate_slots`` for ``min(num_tokens - hit - ext, chunk)`` tokens, or 0
        with ``delay_cache`` (the KV arrives later, see :meth:`finish_transfer`; without
        external tokens ``delay_cache`` does nothing). ``None``: refused, nothing changed
        (a new request is not registered)."""
        if chunk is not None and chunk < 1:
            raise LifecycleError("chunk must be >= 1")
        if lookahead < 0 or external_prefix < 0 or reserved_blocks < 0:
            raise LifecycleError("negative lookahead / external prefix / reserved blocks")
        if tokens is None:
            r = self._req(rid, Status.PREEMPTED)
            new = False
        else:
            r = self.add_request(
                rid, tokens, cache_salt=cache_salt, lora=lora, skip_reading=skip_reading
            )
            new = True
        hit_blocks, hit = self.get_computed_blocks(rid)
        limit = r.num_tokens if delay_cache else r.num_tokens - 1
        ext = max(0, min(external_prefix, limit) - hit)
        delay = delay_cache and ext > 0
        n = 0 if delay else r.num_tokens - hit - ext
        if chunk is not None:
            n = min(n, chunk)
        res = self.allocate_slots(
            rid,
            n,
            hit,
            hit_blocks,
            num_lookahead_tokens=lookahead,
            num_external_computed_tokens=ext,
            delay_cache_blocks=delay,
            full_sequence_must_fit=must_fit,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=has_scheduled,
        )
        if res is None:
            if new:
                del self.requests[rid]
            return None
        preempted = r.num_preemptions > 0
        if not r.skip_reading and self.enable_caching:
            p = "preempted_" if preempted else ""
            self.stats[p + "requests"] += 1
            self.stats[p + "queries"] += r.num_tokens
            self.stats[p + "hits"] += hit
        r.num_computed = hit + ext + n
        if delay:
            r.status = Status.WAITING_FOR_REMOTE_KVS
        else:
            r.status = Status.RUNNING
            if r.num_computed == r.num_tokens:
                r.pending += 1  # the step computes the last position: it samples
        return Admitted(hit, n, self.block_table(rid)[len(hit_blocks) :])

    def admit_batch(
        self, rids: Sequence[str | int], prompts: Sequence[Sequence[int] | None], **kw: Any
    ) -> list[Admitted]:
        """In order, as vLLM's waiting loop; stops at the first refusal
        (``len(result)`` = requests admitted, the rest untouched). Caller errors are
        checked for every request before any is admitted."""
        if len(set(rids)) != len(rids) or len(prompts) != len(rids):
            raise LifecycleError("distinct ids, one prompt (or None to resume) each")
        for rid, toks in zip(rids, prompts, strict=True):
            if toks is None:
                self._req(rid, Status.PREEMPTED)
            elif rid in self.requests or len(toks) == 0:
                raise LifecycleError(f"request {rid!r} exists or has an empty prompt")
        out: list[Admitted] = []
        for rid, toks in zip(rids, prompts, strict=True):
            res = self.admit(rid, toks, **kw)
            if res is None:
                break
            out.append(res)
        return out

    def finish_transfer(self, rid: str | int) -> None:
        """External KV of a ``delay_cache`` admission landed: cache its blocks, run it.

        As vLLM's ``_update_waiting_for_remote_kv``: ``num_computed`` is capped at
        ``num_tokens - 1`` (the last token is recomputed for its logits), the blocks up to
        it are cached, and the request continues with ``schedule`` (vLLM sends it through
        its waiting queue again, without a second lookup)."""
        r = self._req(rid, Status.WAITING_FOR_REMOTE_KVS)
        r.num_computed = min(r.num_computed, r.num_tokens - 1)
        if self.enable_caching:
            self.cache_blocks(rid, r.num_computed)
        r.status = Status.RUNNING

    def schedule(
        self,
        rid: str | int,
        num_new_tokens: int,
        *,
        lookahead: int = 0,
        draft_token_ids: Sequence[int] = (),
        reserved_blocks: int = 0,
    ) -> list[int] | None:
        """A running request's next prefill chunk or decode step (drafts = last positions).

        Returns the new blocks or ``None`` (refused: nothing changed, drafts dropped)."""
        r = self._req(rid, Status.RUNNING)
        drafts = [int(t) for t in draft_token_ids]
        samples = check_schedule(r, num_new_tokens, drafts, lookahead, reserved_blocks)
        res = self.allocate_slots(
            rid,
            num_new_tokens,
            num_lookahead_tokens=lookahead,
            reserved_blocks=reserved_blocks,
        )
        if res is None:
            return None
        r.num_computed += num_new_tokens
        r.spec = drafts
        r.pending += samples
        return res

    def commit_tokens(
        self, rid: str | int, token_ids: Sequence[int], num_rejected: int = 0
    ) -> None:
        """The ids sampled for the step in flight: accepted drafts, then sampled tokens."""
        r = self._req(rid, Status.RUNNING)
        ids = [int(t) for t in token_ids]
        check_commit(r, ids, num_rejected)
        apply_commit(r, ids, num_rejected)
        self.append_output_token_ids(rid, ids)

    def append(self, rid: str | int, token_ids: Sequence[int]) -> bool:
        """Today's ``append``: decode ids known and computed in one go (the first fills the
        placeholder the last step sampled); every full block is cached at once and the step
        samples the next token. ``False`` (nothing changed) when a block is not free."""
        r = self._req(rid, Status.RUNNING)
        if r.spec or r.pending > 1 or r.num_computed != r.num_tokens or not token_ids:
            raise LifecycleError("append needs a request with every known id computed")
        held = len(self.req_blocks.get(rid, ()))
        need = _cdiv(r.num_tokens + len(token_ids), self.block_size) - held
        if max(need, 0) > self.num_free:
            return False
        self.append_output_token_ids(rid, token_ids)
        res = self.allocate_slots(rid, len(token_ids))
        assert res is not None
        r.num_computed = r.num_tokens
        r.pending = 1
        return True

    def preempt(self, rid: str | int) -> None:
        """vLLM's ``_preempt_request``: free, PREEMPTED, ``num_computed = 0``."""
        r = self._req(rid, Status.RUNNING, Status.WAITING_FOR_REMOTE_KVS)
        self.free(rid)
        r.status = Status.PREEMPTED
        r.num_computed = 0
        r.num_preemptions += 1
        r.spec = []
        r.pending = 0  # in-flight samples of a preempted request are discarded

    def finish(self, rid: str | int) -> None:
        """Finished or aborted: blocks back to the pool (a preempted request holds none)."""
        r = self._req(rid, Status.RUNNING, Status.PREEMPTED, Status.WAITING_FOR_REMOTE_KVS)
        self.free(rid)
        r.status = Status.FINISHED

    # ------------------------------------------------------------------ batch forms
    def schedule_batch(
        self,
        rids: Sequence[str | int],
        num_new_tokens: Sequence[int],
        *,
        lookahead: int = 0,
        drafts: Sequence[Sequence[int]] | None = None,
    ) -> list[list[int]]:
        """In order; stops at the first refusal. ``len(result)`` = requests scheduled."""
        if len(set(rids)) != len(rids) or len(num_new_tokens) != len(rids):
            raise LifecycleError("distinct ids, one count each")
        for i, rid in enumerate(rids):  # caller errors first: all or nothing
            d = [int(t) for t in drafts[i]] if drafts else []
            check_schedule(self._req(rid, Status.RUNNING), num_new_tokens[i], d, lookahead, 0)
        out: list[list[int]] = []
        for i, rid in enumerate(rids):
            res = self.schedule(
                rid,
                num_new_tokens[i],
                lookahead=lookahead,
                draft_token_ids=drafts[i] if drafts else (),
            )
            if res is None:
                break
            out.append(res)
        return out

    def commit_batch(
        self,
        rids: Sequence[str | int],
        token_ids: Sequence[Sequence[int]],
        num_rejected: Sequence[int] | None = None,
    ) -> None:
        """All or nothing: every request is validated before any is changed."""
        if len(set(rids)) != len(rids) or len(token_ids) != len(rids):
            raise LifecycleError("distinct ids, one id list each")
        rej = list(num_rejected) if num_rejected is not None else [0] * len(rids)
        for rid, ids, k in zip(rids, token_ids, rej, strict=True):
            check_commit(self._req(rid, Status.RUNNING), [int(t) for t in ids], k)
        for rid, ids, k in zip(rids, token_ids, rej, strict=True):
            self.commit_tokens(rid, ids, k)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        q = self.free_queue()
        assert len(q) == self.num_free == len(set(q)), "free queue length / duplicates"
        assert 0 not in q, "null block queued"
        holders = [0] * self.num_blocks
        for blocks in self.req_blocks.values():
            for b in blocks:
                holders[b] += 1
        qs = set(q)
        for b in range(1, self.num_blocks):
            assert self.ref[b] == holders[b], f"block {b}: ref {self.ref[b]} != {holders[b]}"
            assert (self.ref[b] == 0) == (b in qs), f"block {b}: ref 0 iff queued"
        n_hashed = 0
        for h, copies in self.cached.items():
            assert copies, "empty copy list"
            for b in copies:
                assert self.block_hash[b] == h
                n_hashed += 1
        assert n_hashed == sum(h is not None for h in self.block_hash)
        assert self.block_hash[0] is None
        for rid, blocks in self.req_blocks.items():
            r = self.requests[rid]
            nc = self.num_cached_block.get(rid, 0)
            for i, b in enumerate(blocks):
                if i < nc:
                    assert self.block_hash[b] == r.hashes[i], f"{rid}: block {i} hash"
                else:
                    assert self.block_hash[b] is None, f"{rid}: block {i} cached too early"
            assert nc * self.block_size <= r.num_tokens, "a block with unknown ids is cached"
