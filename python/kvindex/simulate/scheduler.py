"""The continuous-batching model that drives a prefix cache through a workload.

Time advances in steps (one forward pass). Each step, in this order (one method each of the
scheduler object :func:`simulate_run` builds, :class:`ChunkedPrefill` or
:class:`WholePromptAdmission`, one class per scheduling model below):

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
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex.protocol import PrefixCache, make_cache
from kvindex.simulate.capacity import Capacity
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.ledger import ExactMatcher, HitTally
from kvindex.simulate.workloads import SENTINEL, Request, Tokens, Workload

__all__ = [
    "RADIX_INSERT",
    "ChunkedPrefill",
    "RunResult",
    "RunSpec",
    "Timing",
    "WholePromptAdmission",
    "check_spec",
    "infinite_blocks",
    "simulate_run",
]

#: ``"schedule"``: both designs on vLLM's chunk semantics (a chunk's blocks are cacheable
#: from the step that schedules them); ``"prefill"`` / ``"finish"``: the alternative
#: whole-prompt-admission model, named for when its radix tree inserts a prompt.
RADIX_INSERT: tuple[str, ...] = ("schedule", "prefill", "finish")
_SENTINEL = np.array([SENTINEL], dtype=np.int32)


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
    usable = check_spec(workload, spec)
    cache: PrefixCache = make_cache(
        spec.design, usable + 1, spec.block_size, **spec.cache_kwargs(), **(extra_cache_kw or {})
    )
    model = ChunkedPrefill if spec.radix_insert == "schedule" else WholePromptAdmission
    scheduler = model(workload, spec, usable, cache, skip_futile_retries, progress)
    scheduler.run(check_every)
    if cache.num_requests:
        raise RuntimeError(f"{cache.num_requests} requests still held after the run")
    if check_every:
        cache.check_invariants()
    if inspect is not None:
        inspect(cache)
    scheduler.res.timing.wall_s = time.perf_counter() - t_start
    return scheduler.res


class _Scheduler:
    """One run of the continuous-batching model: the state between steps, and one method
    per phase of a step (the module docstring's numbering). The two scheduling models
    (:class:`ChunkedPrefill`, :class:`WholePromptAdmission`) differ only in how a request
    is admitted, how its prefill proceeds, how it is preempted and how evictions are
    counted: the hooks after :meth:`free_finished`."""

    def __init__(
        self,
        workload: Workload,
        spec: RunSpec,
        usable: int,
        cache: PrefixCache,
        skip_futile_retries: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.workload = workload
        self.spec = spec
        self.usable = usable
        self.cache = cache
        self.b = spec.block_size
        self.hash_chain = spec.design == "hash_chain"
        self.skip_futile_retries = skip_futile_retries
        self.progress = progress
        self.matcher = ExactMatcher()
        self.res = RunResult(spec, usable, HitTally(self.b))
        self.req_ns = [0] * len(workload.requests)
        self.res.timing.request_ns = self.req_ns
        self.followers, self.arrivals = workload.arrival_queue()
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        # Running requests with prefill left, in running order (step 3 walks only these).
        self.prefilling: list[_Live] = []
        self.finished = 0
        self.now = 0
        # Bumped by every free, checkpoint and admission: what can let a failed admission
        # pass.
        self.version = 0
        self.blocked: tuple[_Live | None, int] = (None, -1)
        # A finished request's sequence only extends its prompt (already in the matcher)
        # with outputs that, under this promise, no later prompt of a non-follower holds.
        self.finish_unseen = workload.outputs_only_in_followers
        # The decoding requests as arrays (one append_batch per step without a Python loop
        # over them); rebuilt when the set changes.
        self.consecutive = type(workload).output is Workload.output
        self.dset = _Decoding(self.b, self.hash_chain, self.consecutive)
        self.dirty = False

    def run(self, check_every: int) -> None:
        """Steps until every request has finished."""
        res = self.res
        n = len(self.workload.requests)
        while self.finished < n:
            self.arrive()
            if not self.running and not self.waiting:
                if not self.arrivals:
                    raise RuntimeError("scheduler stalled: no request left to arrive")
                self.now = self.arrivals[0][0]
                continue
            res.steps += 1
            budget = self.decode(self.spec.max_batched_tokens)
            prefilled: list[_Live] = []
            budget = self.prefill(budget, prefilled)
            self.admit_waiting(budget, prefilled)
            res.peak_blocks = max(res.peak_blocks, self.usable - self.cache.num_free_blocks)
            if self.start_decoding(prefilled):
                self.free_finished()
            if check_every and res.steps % check_every == 0:
                self.cache.check_invariants()
            self.now += 1
        self.finish_run()

    # 1.
    def arrive(self) -> None:
        """Arrivals join the back of the waiting queue."""
        wl = self.workload
        arrivals = self.arrivals
        while arrivals and arrivals[0][0] <= self.now:
            rid = heapq.heappop(arrivals)[1]
            self.waiting.append(
                _Live(
                    wl.requests[rid],
                    wl.prompt(rid),
                    wl.output(rid),
                    wl.output_start(rid) if self.consecutive else 0,
                )
            )

    # 2.
    def decode(self, budget: int) -> int:
        """One ``append_batch`` for every decoding request, preempting the latest admitted
        request while blocks run short; returns the budget left."""
        dset = self.dset
        if self.dirty:
            dset.rebuild(self.running)
            self.dirty = False
        cache = self.cache
        perf = time.perf_counter_ns
        spent = 0
        while dset.lives:
            toks = dset.tokens()
            before = self.cached_before_call()
            t0 = perf()
            ok = cache.append_batch(dset.ids, toks)
            spent += perf() - t0
            if ok:
                self.res.timing.step_ns.append(spent)
                self.decoded(before)
                break
            dset.sync()
            self.preempt_last()
            dset.rebuild(self.running)
        ndec = len(dset.lives)
        if ndec:
            self.res.decode_tokens += ndec
            budget -= ndec
            dset.advance()
        return budget

    # 3.
    def prefill(self, budget: int, prefilled: list[_Live]) -> int:
        """Requests admitted in earlier steps continue their prefill; those that complete
        go to ``prefilled``. Returns the budget left."""
        if self.prefilling and budget > 0:
            budget = self.prefill_chunks(budget, prefilled)
        return budget

    # 4.
    def admit_waiting(self, budget: int, prefilled: list[_Live]) -> None:
        """First-come-first-served admission while the budget and ``max_running`` allow;
        a head the cache cannot admit waits and stops admission for this step."""
        waiting = self.waiting
        running = self.running
        res = self.res
        while waiting and budget > 0 and len(running) < self.spec.max_running:
            lv = waiting[0]
            take = -1 if self.futile(lv) else self.admit(lv, budget)
            if take < 0:
                self.blocked = (lv, self.version)
                res.waits += 1
                if not lv.waited:
                    lv.waited = True
                    res.requests_waited += 1
                break
            self.version += 1
            waiting.popleft()
            running.append(lv)
            budget -= take
            if lv.prefill_left:
                self.prefilling.append(lv)
            else:
                prefilled.append(lv)

    # 5.
    def start_decoding(self, prefilled: list[_Live]) -> bool:
        """Requests whose prefill completed decode from the next step on; returns whether
        a request may have finished (generated its last token, or has none to generate)."""
        maybe_done = self.dset.finishing()
        if prefilled:
            self.dirty = True
            for lv in prefilled:
                lv.decoding = True
                if lv.generated < lv.req.output_len:
                    self.prefill_complete(lv)
                else:
                    maybe_done = True
        return maybe_done

    # 6.
    def free_finished(self) -> None:
        """Frees the requests that produced their last token and releases the turns that
        follow them."""
        self.dset.sync()
        self.dirty = True

        def done(lv: _Live) -> bool:
            return lv.decoding and lv.generated >= lv.req.output_len

        finished = [lv for lv in self.running if done(lv)]
        self.running = [lv for lv in self.running if not done(lv)]
        reqs = self.workload.requests
        for lv in finished:
            self.release(lv, at_finish=True)
            for f in self.followers.get(lv.req.rid, ()):
                heapq.heappush(self.arrivals, (self.now + 1 + reqs[f].arrival, f))
        self.finished += len(finished)
        if self.progress is not None and finished:
            self.progress(len(finished))

    def futile(self, lv: _Live) -> bool:
        """Whether ``lv``'s admission failed and nothing changed since (it would fail
        again)."""
        return (
            self.skip_futile_retries and self.blocked[0] is lv and self.blocked[1] == self.version
        )

    def release(self, lv: _Live, at_finish: bool = False) -> None:
        """Frees ``lv``'s blocks (they stay cached) and records its sequence."""
        self.version += 1
        rid = lv.req.rid
        t0 = time.perf_counter_ns()
        self.cache.free(rid)
        self.req_ns[rid] += time.perf_counter_ns() - t0
        if not (at_finish and self.finish_unseen and rid not in self.followers):
            self.matcher.insert(lv.sequence())

    def preempt_last(self) -> _Live:
        """Preempts the most recently admitted running request and requeues it at the front
        (the decode set must be synced first)."""
        victim = self.running.pop()
        self.preempt(victim)
        self.res.preemptions += 1
        if self.prefilling and self.prefilling[-1] is victim:
            self.prefilling.pop()
        victim.decoding = False
        victim.prefill_left = 0
        victim.held = 0
        self.waiting.appendleft(victim)
        return victim

    def record_admission(self, lv: _Live, n: int, hit: int, tokens: Tokens) -> None:
        """Counts an admission of ``n`` tokens (``tokens``: the first admission's prompt)
        with ``hit`` cached."""
        res = self.res
        if lv.admitted_once:
            res.resumed_tokens += n
            res.resumed_hit_tokens += hit
        else:
            lv.admitted_once = True
            res.tally.add(n, hit, self.matcher.match_and_insert(tokens))
        res.prefill_tokens += n - hit
        lv.held = n

    # The scheduling model's hooks.
    def admit(self, lv: _Live, budget: int) -> int:
        """Admits the queue head ``lv``; returns the tokens it prefills in this step's
        ``budget``, -1 when the cache refused it."""
        raise NotImplementedError

    def prefill_chunks(self, budget: int, prefilled: list[_Live]) -> int:
        """Step 3 over a non-empty ``prefilling`` and a positive budget."""
        raise NotImplementedError

    def preempt(self, victim: _Live) -> None:
        """Takes the running request ``victim`` off the cache."""
        raise NotImplementedError

    def cached_before_call(self) -> int:
        """The cache's cached block count before a decode call, where evictions are
        derived from it."""
        return 0

    def decoded(self, before: int) -> None:
        """After a decode call that succeeded."""

    def prefill_complete(self, lv: _Live) -> None:
        """``lv``'s prefill completed and it has tokens to generate."""

    def finish_run(self) -> None:
        """After the last step."""


class ChunkedPrefill(_Scheduler):
    """vLLM's chunk semantics for both designs (``radix_insert="schedule"``): admission
    is ``admit_chunk`` (``resume`` after a preemption) for a first chunk of the budget
    left, later chunks one ``schedule_batch`` per step, a preemption ``preempt`` (radix:
    ``checkpoint`` first); evictions are the cache's own count."""

    def admit(self, lv: _Live, budget: int) -> int:
        rid = lv.req.rid
        cache = self.cache
        t0 = time.perf_counter_ns()
        if lv.admitted_once:
            adm = cache.resume(rid, chunk=budget)
        else:
            adm = cache.admit_chunk(rid, lv.prompt, chunk=budget)
        self.req_ns[rid] += time.perf_counter_ns() - t0
        if adm is None:
            return -1
        hit, take = adm[0], adm[1]
        n = len(lv.prompt) + lv.generated
        self.record_admission(lv, n, hit, lv.prompt)
        lv.prefill_left = n - hit - take
        return int(take)

    def prefill_chunks(self, budget: int, prefilled: list[_Live]) -> int:
        """Schedules the next chunk of the requests in ``prefilling`` (one
        ``schedule_batch`` call, preempting from the back while blocks run short)."""
        perf = time.perf_counter_ns
        req_ns = self.req_ns
        todo = self.prefilling
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
            done = self.cache.schedule_batch(ids, np.array(takes, dtype=np.int64))[0]
            spent = perf() - t0
            for lv in batch[: max(done, 1)]:
                req_ns[lv.req.rid] += spent // max(done, 1)
            if done:
                self.version += 1
            for lv, take in zip(batch[:done], takes[:done], strict=True):
                budget -= take
                lv.prefill_left -= take
                if not lv.prefill_left:
                    prefilled.append(lv)
            if done == len(batch):
                break
            self.dset.sync()
            victim = self.preempt_last()
            self.dset.rebuild(self.running)
            todo = [lv for lv in batch[done:] if lv is not victim]
        self.prefilling = [lv for lv in self.prefilling if lv.prefill_left]
        return budget

    def preempt(self, victim: _Live) -> None:
        self.version += 1
        rid = victim.req.rid
        t0 = time.perf_counter_ns()
        if not self.hash_chain:
            self.cache.checkpoint(rid)  # its decode pages stay hittable, as after a free
        self.cache.preempt(rid)
        self.req_ns[rid] += time.perf_counter_ns() - t0
        self.matcher.insert(victim.sequence())

    def finish_run(self) -> None:
        self.res.evicted_blocks = int(self.cache.stats["evictions"])


class WholePromptAdmission(_Scheduler):
    """The alternative model (``radix_insert="prefill"`` / ``"finish"``): ``admit``
    allocates the whole prompt at once, its prefill then proceeds within each step's
    budget without cache calls, a preemption frees the request; the radix tree inserts
    the prompt when its prefill completes (``"prefill"``: ``checkpoint``) or only when the
    request is freed (``"finish"``). Evictions are the cached block hashes each admit /
    append_batch call removed for good."""

    def count_evictions(self, before: int, cached: int) -> None:
        """A call that left the cache ``before`` cached blocks and cached ``cached`` new
        ones (hash chain) removed the difference; the radix tree counts what it lost."""
        after = self.cache.num_cached_blocks
        if self.hash_chain:
            self.res.evicted_blocks += cached - (after - before)
        else:
            self.res.evicted_blocks += before - after

    def admit(self, lv: _Live, budget: int) -> int:
        cache = self.cache
        b = self.b
        tokens = lv.sequence()
        n = len(tokens)
        rid = lv.req.rid
        dup = 0
        before = cache.num_cached_blocks
        if self.hash_chain and n % b == 0 and self.matcher.match(tokens) == n:
            # A fully cached block-aligned prompt recomputes its last block into a copy
            # that adds no new cached hash (the full-hit rule); see the eviction count below.
            dup = int(cache.lookup(np.concatenate((tokens, _SENTINEL))) == n)
        t0 = time.perf_counter_ns()
        adm = cache.admit(rid, tokens)
        self.req_ns[rid] += time.perf_counter_ns() - t0
        if adm is None:
            return -1
        hit = adm.num_cached_tokens
        self.count_evictions(before, n // b - hit // b - dup)
        self.record_admission(lv, n, hit, tokens)
        take = min(n - hit, budget)
        lv.prefill_left = n - hit - take
        return take

    def prefill_chunks(self, budget: int, prefilled: list[_Live]) -> int:
        """Advances the requests in ``prefilling``, in order, within ``budget``."""
        for lv in self.prefilling:
            if budget <= 0:
                break
            take = min(lv.prefill_left, budget)
            budget -= take
            lv.prefill_left -= take
            if not lv.prefill_left:
                prefilled.append(lv)
        if prefilled:
            self.prefilling = [lv for lv in self.prefilling if lv.prefill_left]
        return budget

    def preempt(self, victim: _Live) -> None:
        self.release(victim)

    def cached_before_call(self) -> int:
        return self.cache.num_cached_blocks

    def decoded(self, before: int) -> None:
        self.count_evictions(before, self.dset.filled())

    def prefill_complete(self, lv: _Live) -> None:
        if not self.hash_chain and self.spec.radix_insert == "prefill":
            rid = lv.req.rid
            t0 = time.perf_counter_ns()
            self.cache.checkpoint(rid)
            self.req_ns[rid] += time.perf_counter_ns() - t0
            self.version += 1
