"""Hit accounting: where the prompt tokens that matched but were not hit went.

For every first admission of a prompt of ``n`` tokens the simulator knows ``H``, the tokens
the design hit, and ``E``, the token-exact longest match of the prompt against every
sequence shown to the cache so far (:class:`ExactMatcher`: a kvindex radix tree at page
size 1 that never evicts, run in lockstep — prompts are shown at admission and
whole sequences, prompt plus output, when they are freed). Then, with block size ``B``:

* ``G = ⌊E/B⌋·B`` — the block-aligned match; ``E − G`` tokens are **lost to block
  granularity** (the hash-chain design note's 30 matching tokens of which 16 hit: 14 lost);
* ``C = min(G, ⌊(n−1)/B⌋·B)`` — the full-hit rule (the last prompt token is always
  computed, and hits are block-aligned, so a fully cached block-aligned prompt recomputes
  its whole last block); ``G − C`` tokens are **lost to the full-hit rule**;
* ``C − H`` tokens were **not cached**: evicted, or not inserted yet (the radix design
  inserts when a prompt's prefill completes or the request finishes, and the simulator shows
  prompts to the matcher at admission).

So ``E − H`` = granularity + full-hit + not cached, each ``>= 0``. (Should a design ever hit
more than the matcher saw — e.g. hash-chain blocks filled during decode of a request still
running — ``E`` is raised to ``H``, which leaves nothing to attribute for that request.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex._core import RadixTree
from kvindex.simulate.workloads import Tokens

__all__ = ["ExactMatcher", "HitTally", "RequestHit"]


class ExactMatcher:
    """Token-exact longest-prefix match against everything inserted (never evicts).

    A bare :class:`kvindex.RadixTree` at page size 1: no block pool behind it, so building
    one costs nothing whatever the workload's size, and a match plus an insert is one call.
    Each inserted token gets a fresh slot number (the tree only needs them distinct);
    ``capacity``, if given, bounds the tokens passed to :meth:`insert` and
    :meth:`match_and_insert` over the matcher's life.
    """

    _SLOT_LIMIT = (1 << 31) - 1

    def __init__(self, capacity: int | None = None) -> None:
        self._tree = RadixTree(1)
        self._next = 0
        self._limit = self._SLOT_LIMIT if capacity is None else min(capacity, self._SLOT_LIMIT)

    def match(self, tokens: Tokens) -> int:
        """Length of the longest inserted prefix of ``tokens`` (no side effects)."""
        return self._tree.probe(tokens)

    def _slots(self, n: int) -> npt.NDArray[np.int32]:
        start = self._next
        if start + n > self._limit:
            raise RuntimeError("exact matcher ran out of slot numbers (capacity too small)")
        self._next = start + n
        return np.arange(start, start + n, dtype=np.int32)

    def insert(self, tokens: Tokens) -> None:
        """Adds ``tokens`` as a sequence."""
        if len(tokens):
            self._tree.insert(tokens, self._slots(len(tokens)))

    def match_and_insert(self, tokens: Tokens) -> int:
        """:meth:`match` then :meth:`insert`, in one pass over the tree."""
        if not len(tokens):
            return 0
        return self._tree.insert(tokens, self._slots(len(tokens))).prefix_len


@dataclass(frozen=True, slots=True)
class RequestHit:
    """One admission's split of its exact match ``E`` (see the module docstring)."""

    prompt_tokens: int
    hit: int
    exact: int
    lost_granularity: int
    lost_full_hit: int
    not_cached: int


@dataclass(slots=True)
class HitTally:
    """Sums of :class:`RequestHit` over a run's first admissions."""

    block_size: int
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    exact_tokens: int = 0
    lost_granularity: int = 0
    lost_full_hit: int = 0
    not_cached: int = 0
    per_request: list[RequestHit] | None = field(default=None)
    #: Whether the exact match (and so the loss split) was computed; when not, the exact and
    #: loss fields are meaningless and :meth:`as_dict` reports them as ``None``.
    losses: bool = True

    def add(self, n: int, hit: int, exact: int) -> RequestHit:
        """Accounts one admission of an ``n``-token prompt that hit ``hit`` tokens."""
        b = self.block_size
        e = max(min(exact, n), hit)
        g = e // b * b
        c = min(g, (n - 1) // b * b)
        rh = RequestHit(n, hit, e, e - g, g - c, c - hit)
        self.requests += 1
        self.prompt_tokens += n
        self.hit_tokens += hit
        self.exact_tokens += e
        self.lost_granularity += rh.lost_granularity
        self.lost_full_hit += rh.lost_full_hit
        self.not_cached += rh.not_cached
        if self.per_request is not None:
            self.per_request.append(rh)
        return rh

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every figure, with shares of the prompt tokens (loss figures ``None`` when they
        were not computed)."""
        p = self.prompt_tokens or 1
        if not self.losses:
            return {
                "requests": self.requests,
                "prompt_tokens": self.prompt_tokens,
                "hit_tokens": self.hit_tokens,
                "hit_rate": self.hit_rate,
                **dict.fromkeys(
                    (
                        "exact_match_tokens",
                        "exact_match_rate",
                        "lost_granularity",
                        "lost_granularity_share",
                        "lost_full_hit",
                        "lost_full_hit_share",
                        "not_cached",
                        "not_cached_share",
                    )
                ),
            }
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "exact_match_tokens": self.exact_tokens,
            "exact_match_rate": self.exact_tokens / p,
            "lost_granularity": self.lost_granularity,
            "lost_granularity_share": self.lost_granularity / p,
            "lost_full_hit": self.lost_full_hit,
            "lost_full_hit_share": self.lost_full_hit / p,
            "not_cached": self.not_cached,
            "not_cached_share": self.not_cached / p,
        }
