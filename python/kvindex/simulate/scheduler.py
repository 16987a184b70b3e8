"""The continuous-batching model that drives a prefix cache through a workload.

Time advances in steps (one forward pass). Each step, in this order:

1. **Arrivals** join the back of the waiting queue: a request at its arrival step, a
   follow-up turn its think time after the turn it follows has finished.
2. **Decode**: every running request whose prefill is done computes one output token
   (one ``append_batch`` call for all of them). If blocks run short, the most recently
   admitted running request is **preempted** (it goes back to the front of the queue and is
   later re-admitted with its prompt and the output so far, recomputing what the cache no
   longer holds), and the batch is retried.
3. **Prefill**: requests admitted earlier continue their prefill (chunked prefill, in
   admission order) within the per-step token budget left after decode.
4. **Admission**, in arrival order (first come, first served, no skipping): while the
   budget is not spent and fewer than ``max_running`` requests run, the head of the queue is
   admitted — the cache hits its longest cached prefix; its uncached tokens start
   prefilling in this step's budget. If the cache is out of blocks the head **waits**
   (counted once per step) and admission stops for this step.
5. A request whose prefill completed decodes from the next step on.
6. Requests that produced their last output token are **freed** (their blocks stay cached).

**Chunk semantics** (``radix_insert="schedule"``, the default): both designs are driven
through the engine-lifecycle calls, so both see vLLM's chunk semantics: a prefill chunk's
full blocks are cacheable (hittable by other requests) from the step that schedules them.
Admission is ``admit_chunk(chunk=budget left)`` (``resume`` for a preempted request) and
allocates blocks for that chunk only; later chunks are one ``schedule_batch`` call per
step; when a chunk's blocks run short the most recently admitted running request is
preempted (``preempt``) and the rest retried, as vLLM's running loop does. Decode blocks
are cached as they fill (hash chain) or when the request is freed or preempted (radix:
``checkpoint``, then ``preempt``).

**Alternative model** ``radix_insert="prefill"`` / ``"finish"`` (whole-prompt admission,
the model of earlier reports, kept for comparison): ``admit`` allocates the whole prompt
at once and preemption frees the request; the hash chain caches every full prompt block at
admission, before its KV exists (a request admitted right after hits tokens still being
prefilled), while the radix tree inserts the prompt when its prefill completes
(``checkpoint``, SGLang's ``cache_unfinished_req``) or only when the request is freed. The
two designs then see different chunk semantics: on identical long prompts arriving
together the hash chain hits and the radix tree does not.

A step with nothing running and nothing waiting jumps to the next arrival. Capacity is in
blocks of the pool (kvindex's null block excluded); every request must fit alone
(``ceil((prompt + output) / block_size)`` blocks), so the model always makes progress. The
index's CPU time is measured around its own calls only (admission, chunk schedules,
free, preempt, checkpoint — failed admission attempts included: per request; append_batch:
per decode step) and reported apart from the exact figures. A waiting head's admission is
not called again while nothing was freed, preempted, checkpointed, scheduled or admitted
since it failed (it would fail the same way; see :func:`simulate_run`), so only attempts
that could succeed are timed.

Evictions count cached blocks that lost their hash (radix: tree pages evicted). Under the
chunk semantics they are the cache's own count (``stats["evictions"]``: a hash that two
physical copies hold counts once per copy). Under the alternative model they are the
cached block hashes that each admit / append_batch call removed for good, derived from
``num_cached_blocks`` and the blocks each call caches. ``tests/simulate/test_simulate.py`` checks
both against the caches' KV events.

**More capacity can lower the hit rate** under the alternative model. Capacity changes the
schedule: a small pool makes a request wait until an earlier one finishes, a large one runs
them together. Two identical prompts arriving together under the radix design with
``radix_insert="finish"``: in a pool that holds one of them the second waits and then hits
the whole prompt; in a larger pool both run at once and the second hits nothing
(``test_more_capacity_can_lower_the_hit_rate``). Under the chunk semantics the second hits
the first's scheduled chunks in both designs, whatever the pool.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from kvindex.protocol import PrefixCache, make_cache
from kvindex.simulate.capacity import Capacity
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.ledger import ExactMatcher, HitTally
from kvindex.simulate.workloads import SENTINEL, Request, Tokens, Workload

__all__ = [
    "RADIX_INSERT",
    "RunResult",
    "RunSpec",
    "Timing",
    "check_spec",
    "infinite_blocks",
    "simulate_run",
]

#: ``"schedule"``: both designs on vLLM's chunk semantics (a chunk's blocks are cacheable
#: from the step that schedules them); ``"prefill"`` / ``"finish"``: the alternative
#: whole-prompt-admission model, named for when its radix tree inserts a prompt.
RADIX_INSERT: tuple[str, ...] = ("schedule", "prefill", "finish")
_SENTINEL = np.array([SENTINEL], dtype=np.int32)


@runtime_checkable
class _CountsCached(Protocol):
    @property
    def num_cached_blocks(self) -> int: ...


@runtime_checkable
class _Checkpoints(Protocol):
    def checkpoint(self, request_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One simulated configuration."""

    design: str
    block_size: int
    capacity: Capacity
    max_running: int = 64
    max_batched_tokens: int = 8192
    hash_algo: str = "xxh3_128"
    policy: str = "lru"
    radix_insert: str = "schedule"

    def cache_kwargs(self) -> dict[str, Any]:
        """Keywords of :func:`kvindex.make_cache` for this design."""
        if self.design == "hash_chain":
            return {"algo": self.hash_algo}
        return {"policy": self.policy}

    def label(self) -> str:
        """``design bs=B cap=...`` for progress lines."""
        return f"{self.design} bs={self.block_size} cap={self.capacity.label}"


@dataclass(slots=True)
class Timing:
    """Measured wall-clock costs (not reproducible, reported apart from the exact figures).

    ``request_ns[rid]`` is the index time spent on request ``rid`` (admission, failed
    attempts included, its prefill chunks' share of each ``schedule_batch``, preempt, free,
    checkpoint); ``step_ns`` one entry per decode step (append_batch). The
    medians are robust against the other processes of a shared machine (a call descheduled
    for a few ms moves the mean, not the median).
    """

    request_ns: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def admissions(self) -> int:
        """Requests that took index time."""
        return sum(1 for x in self.request_ns if x)

    @property
    def decode_steps(self) -> int:
        """Decode steps (append_batch calls that succeeded)."""
        return len(self.step_ns)

    def as_dict(self, requests: int) -> dict[str, float]:
        """µs of index time per request and per decode step: mean, median, 10th and 90th
        percentile."""
        req = np.asarray(self.request_ns, dtype=np.float64) / 1e3
        step = np.asarray(self.step_ns, dtype=np.float64) / 1e3

        def pct(a: npt.NDArray[np.float64], q: float) -> float:
            return float(np.percentile(a, q)) if len(a) else 0.0

        return {
            "index_us_per_request": float(req.sum()) / max(requests, 1),
            "index_us_per_request_median": pct(req, 50),
            "index_us_per_request_p10": pct(req, 10),
            "index_us_per_request_p90": pct(req, 90),
            "index_us_per_step": float(step.sum()) / max(len(step), 1),
            "index_us_per_step_median": pct(step, 50),
            "index_seconds": float(req.sum() + step.sum()) / 1e6,
            "wall_seconds": self.wall_s,
        }


@dataclass(slots=True)
class RunResult:
    """Everything one run measured. All fields but :attr:`timing` are exact."""

    spec: RunSpec
    usable_blocks: int
    tally: HitTally
    prefill_tokens: int = 0
    resumed_tokens: int = 0
    resumed_hit_tokens: int = 0
    evicted_blocks: int = 0
    waits: int = 0
    requests_waited: int = 0
    preemptions: int = 0
    peak_blocks: int = 0
    steps: int = 0
    decode_tokens: int = 0
    timing: Timing = field(default_factory=Timing)

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool: usable blocks × block size."""
        return self.usable_blocks * self.spec.block_size

    def as_dict(self) -> dict[str, Any]:
        """Every figure; measured times under ``"timing"``."""
        spec = asdict(self.spec)
        cap = spec.pop("capacity")
        d: dict[str, Any] = {
            **spec,
            "capacity": cap["label"],
            "capacity_kind": cap["kind"],
            "capacity_tokens": self.capacity_tokens,
            "usable_blocks": self.usable_blocks,
            **self.tally.as_dict(),
            "prefill_tokens": self.prefill_tokens,
            "resumed_tokens": self.resumed_tokens,
            "resumed_hit_tokens": self.resumed_hit_tokens,
            "evicted_blocks": self.evicted_blocks,
            "waits": self.waits,
            "requests_waited": self.requests_waited,
            "preemptions": self.preemptions,
            "peak_blocks": self.peak_blocks,
            "peak_usage": self.peak_blocks / max(self.usable_blocks, 1),
            "steps": self.steps,
            "decode_tokens": self.decode_tokens,
        }
        d["timing"] = self.timing.as_dict(self.tally.requests)
        return d


def infinite_blocks(workload: Workload, block_size: int) -> int:
    """Blocks for ``inf``: every request's final size at once (nothing ever evicted)."""
    return sum(-(-(r.prompt_len + r.output_len) // block_size) for r in workload.requests)


class _Live:
    """A request's progress through the scheduler."""

    __slots__ = (
        "admitted_once",
        "decoding",
        "generated",
        "held",
        "out0",
        "output",
        "prefill_left",
        "prompt",
        "req",
        "waited",
    )

    def __init__(self, req: Request, prompt: Tokens, output: Tokens, out0: int = 0) -> None:
        self.req = req
        self.prompt = prompt
        self.output = output
        #: First output token when the outputs are consecutive (see ``_Decoding``).
        self.out0 = out0
        self.generated = 0
        self.held = 0
        self.prefill_left = 0
        self.decoding = False
        self.admitted_once = False
        self.waited = False

    def sequence(self) -> Tokens:
        """Prompt plus the output generated so far."""
        if self.generated == 0:
            return self.prompt
        return np.concatenate((self.prompt, self.output[: self.generated]))


class _Decoding:
    """The running requests past their prefill, in running order, as the arrays of one
    ``append_batch`` call, advanced in place each decode step.

    The ``k`` steps since the last :meth:`rebuild` are applied to the :class:`_Live` objects
    (``generated``, ``held``) only by :meth:`sync`, which must be followed by a rebuild
    before the next step. With a ``workload`` whose outputs are the base class's ranges the
    next tokens are an int32 array incremented in place (``consecutive``: every request's
    ``out0`` is its first output token); otherwise they are gathered.
    For the hash chain, ``hist[r]`` counts requests whose ``(held + 1) % block_size == r``
    at the rebuild: ``hist[-k % block_size]`` of them fill a block at step ``k``.
    """

    __slots__ = ("b", "consecutive", "hash_chain", "hist", "ids", "k", "lives", "toks", "until")

    def __init__(self, block_size: int, hash_chain: bool, consecutive: bool) -> None:
        self.b = block_size
        self.hash_chain = hash_chain
        self.consecutive = consecutive
        self.lives: list[_Live] = []
        self.ids = np.zeros(0, dtype=np.int64)
        self.toks = np.zeros(0, dtype=np.int32)
        self.hist: dict[int, int] = {}
        self.k = 0
        self.until = 0

    def sync(self) -> None:
        """Writes the steps taken since the last rebuild into the requests."""
        k = self.k
        if k:
            for lv in self.lives:
                lv.generated += k
                lv.held += k
            self.k = 0

    def rebuild(self, running: list[_Live]) -> None:
        """Syncs, then takes the decoding requests of ``running``, in its order."""
        self.sync()
        lives: list[_Live] = []
        ids: list[int] = []
        toks: list[int] = []
        until = 1 << 62
        hist: dict[int, int] = {}
        b = self.b
        hash_chain = self.hash_chain
        for lv in running:
            if not lv.decoding:
                continue
            lives.append(lv)
            req = lv.req
            gen = lv.generated
            ids.append(req.rid)
            toks.append(lv.out0 + gen)
            left = req.output_len - gen
            if left < until:
                until = left
            if hash_chain:
                r = (lv.held + 1) % b
                hist[r] = hist.get(r, 0) + 1
        self.lives = lives
        if not lives:
            return
        self.ids = np.array(ids, dtype=np.int64)
        if self.consecutive:
            self.toks = np.array(toks, dtype=np.int32)
        self.until = until
        self.hist = hist

    def tokens(self) -> Tokens:
        """Each request's next output token."""
        if self.consecutive:
            return self.toks
        k = self.k
        return np.fromiter(
            (lv.output[lv.generated + k] for lv in self.lives),
            dtype=np.int32,
            count=len(self.lives),
        )

    def filled(self) -> int:
        """Requests whose token of this step fills a block (hash chain only)."""
        return self.hist.get(-self.k % self.b, 0)

    def advance(self) -> None:
        """Every request generated its token."""
        self.k += 1
        self.until -= 1
        if self.consecutive:
            self.toks += 1

    def finishing(self) -> bool:
        """Whether a request generated its last token in this step."""
        return bool(self.lives) and self.until == 0


def check_spec(workload: Workload, spec: RunSpec) -> int:
    """Validates ``spec`` against ``workload``; returns the usable blocks of its pool.

    Raises :class:`SimulationError` for an unknown design or radix insert mode, a bad
    scheduler limit, or a pool smaller than the largest request.
    """
    from kvindex.protocol import DESIGNS

    if spec.design not in DESIGNS:
        raise SimulationError(
            f"unknown design {spec.design!r}; expected one of {', '.join(DESIGNS)}"
        )
    if spec.block_size < 1:
        raise SimulationError(f"block size must be >= 1, got {spec.block_size}")
    if spec.max_running < 1:
        raise SimulationError(f"max_running must be >= 1, got {spec.max_running}")
    if spec.max_batched_tokens < spec.max_running:
        raise SimulationError(
            f"max_batched_tokens ({spec.max_batched_tokens}) must be >= max_running "
            f"({spec.max_running}): every running request decodes a token per step"
        )
    if spec.radix_insert not in RADIX_INSERT:
        raise SimulationError(f"radix_insert must be one of {', '.join(RADIX_INSERT)}")
    b = spec.block_size
    usable = spec.capacity.usable_blocks(b, infinite_blocks(workload, b))
    worst = max(workload.requests, key=lambda r: r.prompt_len + r.output_len)
    need = -(-(worst.prompt_len + worst.output_len) // b)
    if need > usable:
        raise SimulationError(
            f"capacity {spec.capacity.label} gives {usable:,} blocks of {b} tokens "
            f"({usable * b:,} tokens), below request {worst.rid}'s need of {need:,} blocks "
            f"({worst.prompt_len:,} prompt + {worst.output_len:,} output tokens)"
        )
    return usable


def simulate_run(
    workload: Workload,
    spec: RunSpec,
    *,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    extra_cache_kw: dict[str, Any] | None = None,
    inspect: Callable[[PrefixCache], None] | None = None,
    skip_futile_retries: bool = True,
) -> RunResult:
    """Replays ``workload`` through a fresh cache of ``spec`` (see the module docstring).

    A queue head whose admission failed is retried each step, but the call is skipped (the
    step still counts as a wait) while nothing was freed, checkpointed or admitted since
    the failure: a failed admission changes nothing, and decode steps only take blocks and
    cache blocks of output tokens no waiting prompt holds, so the call would fail again.
    The figures are the same either way (``skip_futile_retries=False`` makes every call;
    tests compare); only the measured index time leaves those calls out.

    ``progress(n)`` is called with the number of requests that just finished.
    ``check_every > 0`` runs the cache's ``check_invariants`` every that many steps and at
    the end; ``extra_cache_kw`` go to :func:`kvindex.make_cache` and ``inspect(cache)`` is
    called after the run (tests: events, stats). Raises :class:`SimulationError` if a request
    cannot fit at all.
    """
    t_start = time.perf_counter()
    b = spec.block_size
    usable = check_spec(workload, spec)
    cache: PrefixCache = make_cache(
        spec.design, usable + 1, b, **spec.cache_kwargs(), **(extra_cache_kw or {})
    )
    counts = cast(_CountsCached, cache)
    hash_chain = spec.design == "hash_chain"
    chunked = spec.radix_insert == "schedule"
    checkpoint = (
        cache.checkpoint
        if not hash_chain and spec.radix_insert == "prefill" and isinstance(cache, _Checkpoints)
        else None
    )
    matcher = ExactMatcher()
    res = RunResult(spec, usable, HitTally(b))
    tm = res.timing
    perf = time.perf_counter_ns
    req_ns = [0] * len(workload.requests)
    tm.request_ns = req_ns
    step_ns = tm.step_ns

    reqs = workload.requests
    followers, arrivals = workload.arrival_queue()
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    finished = 0
    now = 0
    # Bumped by every free, checkpoint and admission: what can let a failed admission pass.
    version = 0
    blocked: tuple[_Live | None, int] = (None, -1)
    # Running requests with prefill left, in running order (step 3 walks only these).
    prefilling: list[_Live] = []

    def admit_chunk(lv: _Live, budget: int) -> int:
        """Admits (or resumes) ``lv`` with a first chunk of at most ``budget`` tokens;
        returns the tokens scheduled, -1 when refused (chunk semantics)."""
        nonlocal version, blocked
        if skip_futile_retries and blocked[0] is lv and blocked[1] == version:
            return -1
        rid = lv.req.rid
        t0 = perf()
        if lv.admitted_once:
            adm = cache.resume(rid, chunk=budget)
        else:
            adm = cache.admit_chunk(rid, lv.prompt, chunk=budget)
        req_ns[rid] += perf() - t0
        if adm is None:
            blocked = (lv, version)
            return -1
        version += 1
        hit, take = adm[0], adm[1]
        n = len(lv.prompt) + lv.generated
        if lv.admitted_once:
            res.resumed_tokens += n
            res.resumed_hit_tokens += hit
        else:
            lv.admitted_once = True
            res.tally.add(n, hit, matcher.match_and_insert(lv.prompt))
        res.prefill_tokens += n - hit
        lv.held = n
        lv.prefill_left = n - hit - take
        return take

    def admit(lv: _Live) -> bool:
        nonlocal version, blocked
        if skip_futile_retries and blocked[0] is lv and blocked[1] == version:
            return False
        tokens = lv.sequence()
        n = len(tokens)
        rid = lv.req.rid
        dup = 0
        before = counts.num_cached_blocks
        if hash_chain and n % b == 0 and matcher.match(tokens) == n:
            # A fully cached block-aligned prompt recomputes its last block into a copy
            # that adds no new cached hash (the full-hit rule); see the eviction count below.
            dup = int(cache.lookup(np.concatenate((tokens, _SENTINEL))) == n)
        t0 = perf()
        adm = cache.admit(rid, tokens)
        req_ns[rid] += perf() - t0
        if adm is None:
            blocked = (lv, version)
            return False
        version += 1
        hit = adm.num_cached_tokens
        after = counts.num_cached_blocks
        if hash_chain:
            res.evicted_blocks += (n // b - hit // b - dup) - (after - before)
        else:
            res.evicted_blocks += before - after
        if lv.admitted_once:
            res.resumed_tokens += n
            res.resumed_hit_tokens += hit
        else:
            lv.admitted_once = True
            res.tally.add(n, hit, matcher.match_and_insert(tokens))
        res.prefill_tokens += n - hit
        lv.held = n
        lv.prefill_left = n - hit
        return True

    # A finished request's sequence only extends its prompt (already in the matcher) with
    # outputs that, under this promise, no later prompt of a non-follower holds.
    finish_unseen = workload.outputs_only_in_followers

    def release(lv: _Live, at_finish: bool = False) -> None:
        nonlocal version
        version += 1
        rid = lv.req.rid
        t0 = perf()
        cache.free(rid)
        req_ns[rid] += perf() - t0
        if not (at_finish and finish_unseen and rid not in followers):
            matcher.insert(lv.sequence())

    def preempt_last() -> _Live:
        """Preempts the most recently admitted running request and requeues it (the
        decode set must be synced first)."""
        nonlocal version, prefilling
        victim = running.pop()
        if chunked:
            version += 1
            rid = victim.req.rid
            t0 = perf()
            if not hash_chain:
                cache.checkpoint(rid)  # its decode pages stay hittable, as after a free
            cache.preempt(rid)
            req_ns[rid] += perf() - t0
            matcher.insert(victim.sequence())
        else:
            release(victim)
        res.preemptions += 1
        if prefilling and prefilling[-1] is victim:
            prefilling.pop()
        victim.decoding = False
        victim.prefill_left = 0
        victim.held = 0
        waiting.appendleft(victim)
        return victim

    def prefill_chunks(budget: int, prefilled: list[_Live]) -> int:
        """Chunk semantics, step 3: schedules the next chunk of the requests in
        ``prefilling`` (one ``schedule_batch`` call, preempting from the back while blocks
        run short); returns the budget left."""
        nonlocal version, prefilling
        todo = prefilling
        while todo and budget > 0:
            takes: list[int] = []
            left = budget
            for lv in todo:
                if left <= 0:
                    break
                take = min(lv.prefill_left, left)
                takes.append(take)
                left -= take
            batch = todo[: len(takes)]
            ids = np.fromiter((lv.req.rid for lv in batch), dtype=np.int64, count=len(batch))
            t0 = perf()
            done = cache.schedule_batch(ids, np.array(takes, dtype=np.int64))[0]
            spent = perf() - t0
            for lv in batch[: max(done, 1)]:
                req_ns[lv.req.rid] += spent // max(done, 1)
            if done:
                version += 1
            for lv, take in zip(batch[:done], takes[:done], strict=True):
                budget -= take
                lv.prefill_left -= take
                if not lv.prefill_left:
                    prefilled.append(lv)
            if done == len(batch):
                break
            dset.sync()
            victim = preempt_last()
            dset.rebuild(running)
            todo = [lv for lv in batch[done:] if lv is not victim]
        prefilling = [lv for lv in prefilling if lv.prefill_left]
        return budget

    # The decoding requests as arrays (one append_batch per step without a Python loop over
    # them); rebuilt when the set changes.
    consecutive = type(workload).output is Workload.output
    dset = _Decoding(b, hash_chain, consecutive)
    out_start = workload.output_start
    dirty = False

    while finished < len(reqs):
        while arrivals and arrivals[0][0] <= now:
            rid = heapq.heappop(arrivals)[1]
            waiting.append(
                _Live(
                    reqs[rid],
                    workload.prompt(rid),
                    workload.output(rid),
                    out_start(rid) if consecutive else 0,
                )
            )
        if not running and not waiting:
            if not arrivals:
                raise RuntimeError("scheduler stalled: no request left to arrive")
            now = arrivals[0][0]
            continue
        res.steps += 1
        budget = spec.max_batched_tokens

        # 2. Decode, preempting the latest admitted request while blocks run short.
        if dirty:
            dset.rebuild(running)
            dirty = False
        spent = 0
        while dset.lives:
            toks = dset.tokens()
            before = 0 if chunked else counts.num_cached_blocks
            t0 = perf()
            ok = cache.append_batch(dset.ids, toks)
            spent += perf() - t0
            if ok:
                step_ns.append(spent)
                if chunked:
                    break
                after = counts.num_cached_blocks
                if hash_chain:
                    res.evicted_blocks += dset.filled() - (after - before)
                else:
                    res.evicted_blocks += before - after
                break
            dset.sync()
            preempt_last()
            dset.rebuild(running)
        ndec = len(dset.lives)
        if ndec:
            res.decode_tokens += ndec
            budget -= ndec
            dset.advance()

        # 3. Chunked prefill of requests admitted in earlier steps.
        prefilled: list[_Live] = []
        if chunked:
            if prefilling and budget > 0:
                budget = prefill_chunks(budget, prefilled)
        elif prefilling and budget > 0:
            for lv in prefilling:
                if budget <= 0:
                    break
                take = min(lv.prefill_left, budget)
                budget -= take
                lv.prefill_left -= take
                if not lv.prefill_left:
                    prefilled.append(lv)
            if prefilled:
                prefilling = [lv for lv in prefilling if lv.prefill_left]

        # 4. First-come-first-served admission.
        while waiting and budget > 0 and len(running) < spec.max_running:
            lv = waiting[0]
            if chunked:
                take = admit_chunk(lv, budget)
                if take >= 0:
                    waiting.popleft()
                    running.append(lv)
                    budget -= take
                    if lv.prefill_left:
                        prefilling.append(lv)
                    else:
                        prefilled.append(lv)
                    continue
            if chunked or not admit(lv):
                res.waits += 1
                if not lv.waited:
                    lv.waited = True
                    res.requests_waited += 1
                break
            waiting.popleft()
            running.append(lv)
            take = min(lv.prefill_left, budget)
            budget -= take
            lv.prefill_left -= take
            if lv.prefill_left:
                prefilling.append(lv)
            else:
                prefilled.append(lv)
        res.peak_blocks = max(res.peak_blocks, usable - cache.num_free_blocks)

        # 5. Prefill done: decode from the next step (radix: insert the prompt now).
        maybe_done = dset.finishing()
        if prefilled:
            dirty = True
            for lv in prefilled:
                lv.decoding = True
                if lv.generated < lv.req.output_len:
                    if checkpoint is not None:
                        rid = lv.req.rid
                        t0 = perf()
                        checkpoint(rid)
                        req_ns[rid] += perf() - t0
                        version += 1
                else:
                    maybe_done = True

        # 6. Free finished requests; release the turns that follow them.
        if maybe_done:
            dset.sync()
            dirty = True
            done = [lv for lv in running if lv.decoding and lv.generated >= lv.req.output_len]
            running = [
                lv for lv in running if not (lv.decoding and lv.generated >= lv.req.output_len)
            ]
            for lv in done:
                release(lv, at_finish=True)
                for f in followers.get(lv.req.rid, ()):
                    heapq.heappush(arrivals, (now + 1 + reqs[f].arrival, f))
            finished += len(done)
            if progress is not None and done:
                progress(len(done))
        if check_every and res.steps % check_every == 0:
            cache.check_invariants()
        now += 1

    if chunked:
        res.evicted_blocks = int(cache.stats["evictions"])
    if cache.num_requests:
        raise RuntimeError(f"{cache.num_requests} requests still held after the run")
    if check_every:
        cache.check_invariants()
    if inspect is not None:
        inspect(cache)
    tm.wall_s = time.perf_counter() - t_start
    return res
