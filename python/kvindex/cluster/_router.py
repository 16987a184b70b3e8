"""Routing policies over a :class:`~kvindex.ClusterIndex` (one decision per request)."""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvindex import _checks
from kvindex._core import ClusterIndex
from kvindex.exceptions import DTypeError, InvalidArgumentError, KvIndexError

POLICIES: tuple[str, ...] = ("kv", "random", "round_robin", "least_loaded", "approx")
"""Routing policy names."""

_Tokens = npt.NDArray[np.int32] | npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request went: ``worker`` (index slot), the leading blocks that worker holds
    according to the index (``overlap_blocks``) out of the prompt's full ``blocks``,
    and ``flagged`` when that worker's event-fed state is not known exactly (resyncing or
    degraded; ``approx`` decisions are estimates by design and never flagged).
    ``incarnation`` tells that worker from a later one in the same slot; ``number``
    is the router's count of decisions when it made this one (1, 2, ...), which tells
    :meth:`Router.finish` one decision from another with the same fields."""

    worker: int
    overlap_blocks: int
    blocks: int
    flagged: bool
    incarnation: int = 0
    number: int = 0


class Router:
    """Picks a worker for each request.

    ``kv`` (default) minimises ``overlap_weight * (blocks - overlap) + load`` — the
    blocks the worker still has to prefill plus its decode load (active blocks of the
    requests routed to it and not yet finished), as Dynamo's KV router does; ties
    rotate. ``least_loaded`` is the same with weight 0; ``random`` (seeded) and
    ``round_robin`` ignore the index. ``approx`` needs no event stream: the router
    records each decision's blocks in ``index`` (``store_hashes``) and removes them
    ``ttl`` seconds later, so the index must not be fed by a listener in that mode.

    Workers are the index's present slots; :meth:`finish` takes a request's load back,
    once per decision. With ``skip_unknown``, ``kv`` and ``least_loaded`` skip a worker
    of which the index knows nothing yet (``resyncing`` with no block: a late joiner
    bootstrapping from its snapshot or replay) while another is known: it is unknown,
    not empty. Either way a decision for a worker not known exactly is ``flagged``.

    Options are checked at construction: an unknown ``policy``, a negative or non-finite
    ``overlap_weight``, a ``ttl`` that is not a finite number of seconds > 0 raise
    ``InvalidArgumentError``; a value of the wrong type (``seed=True``, a string weight,
    a ``clock`` that is not callable, an ``index`` that is not a ``ClusterIndex``,
    a ``skip_unknown`` that is not a bool) raises ``DTypeError``.
    """

    def __init__(
        self,
        index: ClusterIndex,
        policy: str = "kv",
        *,
        overlap_weight: float = 1.0,
        seed: int = 0,
        ttl: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        skip_unknown: bool = False,
    ) -> None:
        if not isinstance(index, ClusterIndex):
            raise DTypeError(f"index must be a ClusterIndex, got {type(index).__name__}")
        policy = _checks.text("policy", policy)
        if not isinstance(skip_unknown, bool):
            raise DTypeError(f"skip_unknown must be a bool, got {type(skip_unknown).__name__}")
        self._skip_unknown = skip_unknown
        if policy not in POLICIES:
            raise InvalidArgumentError(
                f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}"
            )
        weight = _checks.real("overlap_weight", overlap_weight, low=0.0)
        seed = _checks.integer("seed", seed)
        self._ttl = _checks.real("ttl", ttl, low=0.0, low_open=True)
        if not callable(clock):
            raise DTypeError(f"clock must be callable, got {type(clock).__name__}")
        self.index = index
        self.policy = policy
        self._weight = 0.0 if policy == "least_loaded" else weight
        self._rng = random.Random(seed)
        self._clock = clock
        self._turn = 0
        self._load = np.zeros(0, dtype=np.float64)
        self._membership = -1
        self._incarnations: list[int] = []
        # (expiry, slot, the slot's worker incarnation, hashes) of approx decisions
        self._recorded: deque[tuple[float, int, int, npt.NDArray[np.uint64]]] = deque()
        # numbers of the decisions made and not finished yet
        self._open: set[int] = set()
        self.decisions = 0

    @property
    def load(self) -> npt.NDArray[np.float64]:
        """Decode load per slot (active blocks); NaN for empty slots. A copy."""
        self._sync_slots()
        return self._load.copy()

    def _sync_slots(self) -> None:
        """Re-reads the index's slots after workers were added or removed: a new worker
        (a new incarnation, even in a reused slot) starts unloaded, an empty slot is not
        eligible (NaN)."""
        membership = self.index.membership
        if membership == self._membership:
            return
        inc = self.index.incarnations()
        old, old_inc = self._load, self._incarnations
        load = np.full(len(inc), np.nan)
        for i, x in enumerate(inc):
            if x:
                same = i < len(old_inc) and old_inc[i] == x
                load[i] = old[i] if same else 0.0
        self._load = load
        self._incarnations = inc
        self._membership = membership

    def route(
        self,
        tokens: _Tokens,
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        mm_items: list[tuple[str, int, int]] | None = None,
    ) -> Decision | None:
        """Routes one request; None when the index has no worker. A bad argument raises
        a ``KvIndexError`` subclass with nothing changed (no turn taken, no load added)."""
        self._sync_slots()
        if self.policy == "approx":
            self._expire()
        turn = self._turn + 1
        if self.policy in ("kv", "least_loaded", "approx"):
            load = self._known_load()
            for attempt in range(2):
                try:
                    w, overlap, blocks = self.index.route(
                        tokens,
                        load,
                        overlap_weight=self._weight,
                        start=turn,
                        cache_salt=cache_salt,
                        lora=lora,
                        mm_items=mm_items,
                    )
                    break
                except KvIndexError:
                    # A worker was added or removed (by another thread) since the sync.
                    if attempt == 1 or self.index.membership == self._membership:
                        raise
                    self._sync_slots()
                    load = self._known_load()
            if w < 0:
                self._turn = turn
                return None
        else:
            # The prompt is checked (and its overlaps read) before the turn or the
            # random draw is taken.
            overlaps = self.index.overlaps(
                tokens, cache_salt=cache_salt, lora=lora, mm_items=mm_items
            )
            present = np.flatnonzero(~np.isnan(self._load))
            if len(present) == 0:
                self._turn = turn
                return None
            if self.policy == "random":
                w = int(present[self._rng.randrange(len(present))])
            else:
                w = int(present[turn % len(present)])
            overlap = int(overlaps[w]) if w < len(overlaps) else 0
            blocks = len(tokens) // self.index.block_size
        self._turn = turn
        if self.policy == "approx":
            hashes = self.index.hashes(tokens, cache_salt=cache_salt, lora=lora, mm_items=mm_items)
            self.index.store_hashes(w, hashes)
            self._recorded.append((self._clock() + self._ttl, w, self._incarnations[w], hashes))
        self._load[w] += blocks
        self.decisions += 1
        self._open.add(self.decisions)
        flagged = self.policy != "approx" and self.index.status(w) != "live"
        return Decision(w, overlap, blocks, flagged, self._incarnations[w], self.decisions)

    @property
    def open_decisions(self) -> int:
        """Decisions made and not finished yet."""
        return len(self._open)

    def _known_load(self) -> npt.NDArray[np.float64]:
        """The load the ``kv`` and ``least_loaded`` policies route on: a worker of which
        nothing is known yet (``resyncing`` and no block: a late joiner bootstrapping from
        its snapshot or replay) is not eligible while some other worker is known, since
        its blocks are unknown, not absent. A worker repairing a gap keeps its last known
        blocks and stays eligible."""
        if not self._skip_unknown or self.policy == "approx":
            return self._load
        statuses = self.index.statuses()
        n = len(self._load)  # a worker added since the last sync is routed next time
        unknown = [
            i
            for i, st in enumerate(statuses[:n])
            if st == "resyncing" and self.index.worker_info(i)["blocks"] == 0
        ]
        if not unknown or len(unknown) == sum(1 for st in statuses[:n] if st):
            return self._load
        load = self._load.copy()
        load[unknown] = np.nan
        return load

    def finish(self, decision: Decision) -> None:
        """Takes a finished request's blocks off its worker's load (nothing to take when
        that worker has left since). Each decision is finished once: finishing it again,
        or finishing a decision this router did not make, raises
        ``InvalidArgumentError`` with the load unchanged."""
        if not isinstance(decision, Decision):
            raise DTypeError(f"decision must be a Decision, got {type(decision).__name__}")
        if decision.number not in self._open:
            raise InvalidArgumentError(
                f"decision {decision.number} is not open on this router "
                "(already finished, or made by another router)"
            )
        self._open.discard(decision.number)
        self._sync_slots()
        w = decision.worker
        if w < len(self._incarnations) and self._incarnations[w] == decision.incarnation:
            self._load[w] = max(self._load[w] - decision.blocks, 0.0)

    def _expire(self) -> None:
        now = self._clock()
        rec = self._recorded
        while rec and rec[0][0] <= now:
            _, w, inc, hashes = rec.popleft()
            # A removed worker's blocks left with it; a later worker in its slot
            # never held these.
            if w < len(self._incarnations) and self._incarnations[w] == inc:
                self.index.remove_hashes(w, hashes)
