"""Workloads the simulator replays: requests with token content, arrival and dependencies.

A :class:`Workload` is a list of :class:`Request` records plus the means to materialise each
request's prompt and output tokens on demand (a 60M-token trace is not kept in memory as
tokens). Token ranges never overlap:

* prompt content: ``[0, 2**30)`` (the chat generator draws from a 32,000-token vocabulary;
  a trace maps its block ids to disjoint 512-token ranges),
* output tokens: ``[2**30, 2**31 - 1)``, a fresh range per request — generated text is
  unique to its request (so a block filled during decode is always new content); a
  multi-turn conversation's next prompt contains the previous turn's output tokens,
* ``2**31 - 1`` is never a token (the simulator's sentinel).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex.simulate.errors import SimulationError

__all__ = [
    "OUTPUT_BASE",
    "SENTINEL",
    "ArrayWorkload",
    "Request",
    "Workload",
    "chat_workload",
]

Tokens = npt.NDArray[np.int32]

#: First output token id; prompt content stays below it.
OUTPUT_BASE = 1 << 30
#: A token id no workload uses.
SENTINEL = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload.

    ``arrival`` is the step at which it joins the queue; for a follow-up (``after >= 0``)
    it is the think time, in steps, after request ``after`` finishes. ``after`` always
    names an earlier request, so request-id order is a valid arrival order.
    """

    rid: int
    prompt_len: int
    output_len: int
    arrival: int
    after: int = -1
    kind: str = "request"


class Workload:
    """Requests plus their token content (subclasses say where prompts come from).

    :attr:`outputs_only_in_followers` is a promise a workload may make: a request's output
    tokens appear only in prompts of requests that follow it (``after`` chains), and output
    ranges do not overlap. The simulator then does not show a finished request without
    followers to its exact matcher (no later prompt can match past its prompt, which the
    matcher already holds). False (no promise) for workloads built by hand.
    """

    #: See the class docstring; the chat generator and Mooncake traces set it.
    outputs_only_in_followers: bool = False

    def __init__(
        self,
        name: str,
        requests: list[Request],
        output_offsets: npt.NDArray[np.int64],
        params: dict[str, Any],
    ) -> None:
        self.name = name
        self.requests = requests
        self.params = params
        self._out = output_offsets
        for i, r in enumerate(requests):
            if r.rid != i:
                raise SimulationError(f"request {i} has rid {r.rid}; rids must be 0..n-1")
            if r.after >= i:
                raise SimulationError(f"request {i} follows request {r.after}, not an earlier one")
        end = int(output_offsets[-1]) + requests[-1].output_len if requests else 0
        if OUTPUT_BASE + end >= SENTINEL:
            raise SimulationError("too many output tokens for the int32 token range")

    def __len__(self) -> int:
        return len(self.requests)

    def prompt(self, rid: int) -> Tokens:
        """Prompt tokens of request ``rid`` (int32, C-contiguous)."""
        raise NotImplementedError

    def output_start(self, rid: int) -> int:
        """First output token of request ``rid`` (its outputs are consecutive from there)."""
        return OUTPUT_BASE + int(self._out[rid])

    def output(self, rid: int) -> Tokens:
        """Output tokens of request ``rid``: a range unique to it."""
        start = OUTPUT_BASE + int(self._out[rid])
        return np.arange(start, start + self.requests[rid].output_len, dtype=np.int32)

    def arrival_queue(self) -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
        """The requests a replay starts from: those that follow another (``after >= 0``),
        by the rid they follow, in rid order; and a heap (``heapq``) of ``(arrival, rid)``
        of the others."""
        followers: dict[int, list[int]] = {}
        arrivals: list[tuple[int, int]] = []
        for r in self.requests:
            if r.after >= 0:
                followers.setdefault(r.after, []).append(r.rid)
            else:
                arrivals.append((r.arrival, r.rid))
        heapq.heapify(arrivals)
        return followers, arrivals

    def summary(self) -> dict[str, Any]:
        """Counts for reports: requests, prompt/output tokens, kinds, the largest request."""
        kinds: dict[str, int] = {}
        for r in self.requests:
            kinds[r.kind] = kinds.get(r.kind, 0) + 1
        return {
            "name": self.name,
            "requests": len(self.requests),
            "prompt_tokens": sum(r.prompt_len for r in self.requests),
            "output_tokens": sum(r.output_len for r in self.requests),
            "max_request_tokens": max(
                (r.prompt_len + r.output_len for r in self.requests), default=0
            ),
            "kinds": dict(sorted(kinds.items())),
            "params": self.params,
        }


class ArrayWorkload(Workload):
    """A workload whose prompts are stored as arrays."""

    def __init__(
        self,
        name: str,
        requests: list[Request],
        prompts: list[Tokens],
        output_offsets: npt.NDArray[np.int64],
        params: dict[str, Any],
    ) -> None:
        super().__init__(name, requests, output_offsets, params)
        self._prompts = prompts

    def prompt(self, rid: int) -> Tokens:
        """Prompt tokens of request ``rid``."""
        return self._prompts[rid]


_VOCAB = 32_000


@dataclass(slots=True)
class _Draft:
    """A request before rids are assigned (sorted by nominal arrival time)."""

    time: float
    kind: str
    prompt: Tokens
    output_len: int
    output_offset: int
    parent: _Draft | None = None
    think: int = 0
    rid: int = -1


def chat_workload(num_requests: int = 1000, seed: int = 0, *, mean_gap: float = 4.0) -> Workload:
    """A seeded multi-tenant chat workload (the simulator's default).

    Sessions arrive as a Poisson process (``mean_gap`` steps apart) and are one of:

    * a conversation (55%): one of 6 tenants' system prompts (300–2,500 tokens, Zipf
      popularity) and 1 + Geometric(0.3) turns (at most 8); turn *k*'s prompt is the system
      prompt plus every earlier user message and output plus a new user message; a turn
      arrives a think time (1 + Exp(30) steps) after the previous one finishes; one turn in
      ten is regenerated (the same prompt again, 1 + Exp(10) steps after the answer — the
      full-hit case), and the conversation continues from the new answer;
    * a few-shot request (20%): one of 4 templates (800–3,000 tokens) plus a question;
    * a long-document question (25%): one of 6 documents (3,000–10,000 tokens, Zipf) plus a
      question.

    User messages and questions are lognormal (median ~90 and ~55 tokens); outputs are
    lognormal (median ~90 tokens, 4–600). Requests are numbered in nominal arrival order
    and the first ``num_requests`` are kept. The same ``seed`` gives the same workload.
    """
    if num_requests < 1:
        raise SimulationError(f"num_requests must be >= 1, got {num_requests}")
    if mean_gap <= 0:
        raise SimulationError(f"mean_gap must be > 0, got {mean_gap}")
    rng = np.random.default_rng(seed)

    def text(n: int) -> Tokens:
        return rng.integers(0, _VOCAB, int(n), dtype=np.int32)

    def zipf(n: int) -> npt.NDArray[np.float64]:
        w = 1.0 / np.arange(1, n + 1)
        return np.asarray(w / w.sum(), dtype=np.float64)

    def lognormal(median: float, lo: int, hi: int) -> int:
        return int(np.clip(round(rng.lognormal(math.log(median), 0.7)), lo, hi))

    tenants = [text(int(rng.integers(300, 2501))) for _ in range(6)]
    templates = [text(int(rng.integers(800, 3001))) for _ in range(4)]
    docs = [text(int(rng.integers(3000, 10_001))) for _ in range(6)]
    tenant_p, doc_p = zipf(len(tenants)), zipf(len(docs))

    drafts: list[_Draft] = []
    out_next = 0
    clock = 0.0

    def new_output() -> tuple[int, int]:
        nonlocal out_next
        n = lognormal(90, 4, 600)
        off = out_next
        out_next += n
        return n, off

    while True:
        if len(drafts) >= num_requests:
            times = np.fromiter((d.time for d in drafts), dtype=np.float64, count=len(drafts))
            # Later sessions start after `clock`: once it passes the n-th smallest arrival
            # time, the first n requests are final.
            if clock >= float(np.partition(times, num_requests - 1)[num_requests - 1]):
                break
        clock += float(rng.exponential(mean_gap))
        kind = rng.choice(3, p=[0.55, 0.20, 0.25])
        if kind == 0:
            system = tenants[int(rng.choice(len(tenants), p=tenant_p))]
            turns = min(int(rng.geometric(0.3)), 8)
            history: list[Tokens] = [system]
            parent: _Draft | None = None
            t = clock
            for _ in range(turns):
                history.append(text(lognormal(90, 4, 1500)))
                n, off = new_output()
                think = 1 + int(rng.exponential(30.0))
                prompt = np.concatenate(history)
                if parent is not None:
                    # Nominal time only orders requests; the scheduler uses `think`.
                    t = parent.time + parent.output_len + len(prompt) / 4096 + think
                d = _Draft(t, "chat", prompt, n, off, parent, think if parent else 0)
                drafts.append(d)
                if rng.random() < 0.1:
                    # "Regenerate": the same prompt again once the answer is in; the
                    # conversation goes on from the new answer.
                    n, off = new_output()
                    think = 1 + int(rng.exponential(10.0))
                    t = d.time + d.output_len + think
                    d = _Draft(t, "regenerate", prompt, n, off, d, think)
                    drafts.append(d)
                history.append(np.arange(OUTPUT_BASE + off, OUTPUT_BASE + off + n, dtype=np.int32))
                parent = d
        elif kind == 1:
            prompt = np.concatenate(
                [templates[int(rng.integers(len(templates)))], text(lognormal(55, 4, 400))]
            )
            n, off = new_output()
            drafts.append(_Draft(clock, "few-shot", prompt, n, off))
        else:
            prompt = np.concatenate(
                [docs[int(rng.choice(len(docs), p=doc_p))], text(lognormal(55, 4, 400))]
            )
            n, off = new_output()
            drafts.append(_Draft(clock, "document", prompt, n, off))

    drafts.sort(key=lambda d: d.time)  # stable: a parent's time is always smaller
    drafts = drafts[:num_requests]
    for i, d in enumerate(drafts):
        d.rid = i
    requests: list[Request] = []
    for d in drafts:
        if d.parent is None:
            requests.append(Request(d.rid, len(d.prompt), d.output_len, int(d.time), -1, d.kind))
        else:
            requests.append(
                Request(d.rid, len(d.prompt), d.output_len, d.think, d.parent.rid, d.kind)
            )
    offsets = np.array([d.output_offset for d in drafts], dtype=np.int64)
    params = {"num_requests": num_requests, "seed": seed, "mean_gap": mean_gap}
    wl = ArrayWorkload("chat", requests, [d.prompt for d in drafts], offsets, params)
    # A turn's prompt holds the outputs of the turns it follows only; offsets only grow.
    wl.outputs_only_in_followers = True
    return wl
