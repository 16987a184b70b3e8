"""Routing policies over a :class:`~kvindex.ClusterIndex` (one decision per request)."""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvindex._core import ClusterIndex
from kvindex.exceptions import DTypeError, KvIndexError

POLICIES: tuple[str, ...] = ("kv", "random", "round_robin", "least_loaded", "approx")
"""Routing policy names."""

_Tokens = npt.NDArray[np.int32] | npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request went: ``worker`` (index slot), the leading blocks that worker holds
    according to the index (``overlap_blocks``) out of the prompt's full ``blocks``,
    and ``flagged`` when that worker's event-fed state is not known exactly (resyncing or
    degraded; ``approx`` decisions are estimates by design and never flagged).
    ``incarnation`` tells that worker from a later one in the same slot."""

    worker: int
    overlap_blocks: int
    blocks: int
    flagged: bool
    incarnation: int = 0


class Router:
    """Picks a worker for each request.

    ``kv`` (default) minimises ``overlap_weight * (blocks - overlap) + load`` — the
    blocks the worker still has to prefill plus its decode load (active blocks of the
    requests routed to it and not yet finished), as Dynamo's KV router does; ties
    rotate. ``least_loaded`` is the same with weight 0; ``random`` (seeded) and
    ``round_robin`` ignore the index. ``approx`` needs no event stream: the router
    records each decision's blocks in ``index`` (``store_hashes``) and removes them
    ``ttl`` seconds later, so the index must not be fed by a listener in that mode.

    Workers are the index's present slots; :meth:`finish` takes a request's load back.
    With ``skip_unknown``, ``kv`` and ``least_loaded`` skip a worker of which the index
    knows nothing yet (``resyncing`` with no block: a late joiner bootstrapping from its
    snapshot or replay) while another is known: it is unknown, not empty. Either way a
    decision for a worker not known exactly is ``flagged``.
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
        if not isinstance(skip_unknown, bool):
            raise DTypeError(f"skip_unknown must be a bool, got {type(skip_unknown).__name__}")
        self._skip_unknown = skip_unknown
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if not (overlap_weight >= 0 and math.isfinite(overlap_weight)) or ttl <= 0:
            raise ValueError("overlap_weight must be finite and >= 0, ttl > 0")
        self.index = index
        self.policy = policy
        self._weight = 0.0 if policy == "least_loaded" else overlap_weight
        self._rng = random.Random(seed)
        self._ttl = ttl
        self._clock = clock
        self._turn = 0
        self._load = np.zeros(0, dtype=np.float64)
        self._membership = -1
        self._incarnations: list[int] = []
        # (expiry, slot, the slot's worker incarnation, hashes) of approx decisions
        self._recorded: deque[tuple[float, int, int, npt.NDArray[np.uint64]]] = deque()
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
        """Routes one request; None when the index has no worker."""
        self._sync_slots()
        if self.policy == "approx":
            self._expire()
        self._turn += 1
        if self.policy in ("kv", "least_loaded", "approx"):
            load = self._known_load()
            for attempt in range(2):
                try:
                    w, overlap, blocks = self.index.route(
                        tokens,
                        load,
                        overlap_weight=self._weight,
                        start=self._turn,
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
                return None
        else:
            present = np.flatnonzero(~np.isnan(self._load))
            if len(present) == 0:
                return None
            if self.policy == "random":
                w = int(present[self._rng.randrange(len(present))])
            else:
                w = int(present[self._turn % len(present)])
            overlaps = self.index.overlaps(
                tokens, cache_salt=cache_salt, lora=lora, mm_items=mm_items
            )
            overlap = int(overlaps[w]) if w < len(overlaps) else 0
            blocks = len(tokens) // self.index.block_size
        self._load[w] += blocks
        self.decisions += 1
        if self.policy == "approx":
            hashes = self.index.hashes(tokens, cache_salt=cache_salt, lora=lora, mm_items=mm_items)
            self.index.store_hashes(w, hashes)
            self._recorded.append((self._clock() + self._ttl, w, self._incarnations[w], hashes))
        flagged = self.policy != "approx" and self.index.status(w) != "live"
        return Decision(w, overlap, blocks, flagged, self._incarnations[w])

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
        """Takes a finished request's blocks off its worker's load (ignored when that
        worker has left since)."""
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
