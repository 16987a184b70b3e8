"""Replays with one request at a time: the infinite-capacity ceiling and the seed examples.

:func:`replay_in_order` admits each request in request-id order, appends its whole output,
and frees it before the next one starts — no concurrency, so every earlier sequence is
cached (both designs have inserted it by then). With infinite capacity this is the most
a design can hit on a workload; with the radix design at page size 1 it is the workload's
**theoretical maximum hit rate** (token-exact, capped at ``n - 1`` per prompt), the
reference Mooncake's paper uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from kvindex.protocol import make_cache
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.ledger import ExactMatcher, HitTally
from kvindex.simulate.workloads import Tokens, Workload

__all__ = ["replay_in_order", "theoretical_max", "theoretical_max_hit_rate"]


def replay_in_order(
    seqs: Workload | Sequence[tuple[Tokens, Tokens]],
    design: str,
    block_size: int,
    *,
    num_blocks: int | None = None,
    losses: bool = True,
    per_request: bool = False,
    progress: Callable[[int], None] | None = None,
    **cache_kw: Any,
) -> HitTally:
    """Replays ``(prompt, output)`` pairs (or a workload) one at a time through a fresh cache.

    ``num_blocks`` is the usable pool (default: everything fits). ``losses`` computes the
    granularity / full-hit split (needs an :class:`ExactMatcher`); ``per_request`` keeps
    each admission's split in :attr:`HitTally.per_request`; ``progress(1)`` is called after
    each request.
    """
    listed: Sequence[tuple[Tokens, Tokens]] | None = None
    if isinstance(seqs, Workload):
        wl = seqs
        n = len(wl)
        total = sum(r.prompt_len + r.output_len for r in wl.requests)
        worst = max(r.prompt_len + r.output_len for r in wl.requests)
    else:
        listed = seqs
        n = len(seqs)
        total = sum(len(p) + len(o) for p, o in seqs)
        worst = max(len(p) + len(o) for p, o in seqs)

    def pairs() -> Iterator[tuple[Tokens, Tokens]]:
        if listed is not None:
            return iter(listed)
        return ((wl.prompt(i), wl.output(i)) for i in range(n))

    if num_blocks is not None:
        if -(-worst // block_size) > num_blocks:
            raise SimulationError(f"{num_blocks} blocks of {block_size} cannot hold a request")
        tally = _replay(
            pairs(), design, block_size, num_blocks, losses, per_request, progress, cache_kw
        )
        assert tally is not None  # only a trial returns None
        return tally
    # "Everything fits": a pool of every block of every sequence never evicts, but most
    # workloads share prefixes, and building (and paging in) a pool of millions of blocks
    # costs more than the replay itself. So first try a pool of an eighth of that: if no
    # cached block was ever evicted (or reallocated), every hit is what the full pool gives;
    # otherwise replay again with the full pool.
    full = -(-total // block_size) + n
    small = min(full, max(2 * -(-worst // block_size), full // 8))
    if small < full:
        tally = _replay(
            pairs(), design, block_size, small, losses, per_request, None, cache_kw, trial=True
        )
        if tally is not None:
            if progress is not None:
                progress(n)
            return tally
    tally = _replay(pairs(), design, block_size, full, losses, per_request, progress, cache_kw)
    assert tally is not None  # only a trial returns None
    return tally


def _replay(
    pairs: Iterator[tuple[Tokens, Tokens]],
    design: str,
    block_size: int,
    num_blocks: int,
    losses: bool,
    per_request: bool,
    progress: Callable[[int], None] | None,
    cache_kw: dict[str, Any],
    *,
    trial: bool = False,
) -> HitTally | None:
    """:func:`replay_in_order` on a pool of ``num_blocks``. A ``trial`` (of a pool smaller
    than everything) returns ``None`` if a cached block was evicted or a request did not
    fit; otherwise a request that does not fit raises :class:`SimulationError`."""
    cache = make_cache(design, num_blocks + 1, block_size, **cache_kw)
    matcher = ExactMatcher() if losses else None
    tally = HitTally(block_size, per_request=[] if per_request else None, losses=losses)
    for rid, (prompt, output) in enumerate(pairs):
        exact = matcher.match_and_insert(prompt) if matcher is not None else 0
        adm = cache.admit(rid, prompt)
        if adm is None:
            if trial:
                return None
            raise SimulationError(f"request {rid} does not fit in {num_blocks} blocks")
        tally.add(len(prompt), adm.num_cached_tokens, exact)
        if len(output) and not cache.append(rid, output):
            if trial:
                return None
            raise SimulationError(f"request {rid}'s output does not fit in {num_blocks} blocks")
        cache.free(rid)
        if matcher is not None and len(output):
            matcher.insert(np.concatenate((prompt, output)))
        if progress is not None:
            progress(1)
    if trial and cache.stats["evictions"]:
        return None
    return tally


def theoretical_max(workload: Workload, progress: Callable[[int], None] | None = None) -> HitTally:
    """The workload's theoretical maximum: what ``replay_in_order(workload, "radix", 1,
    losses=False)`` hits, computed on a bare radix tree (:class:`ExactMatcher`) instead of
    a cache with a pool for every token.

    Each prompt of ``n`` tokens hits its token-exact match against every earlier request's
    prompt and output, capped at ``n - 1`` (the last prompt token is always computed); then
    its prompt and output are inserted. That is the radix design at page size 1 with an
    infinite pool, one request at a time.
    """
    matcher = ExactMatcher()
    tally = HitTally(1, losses=False)
    for rid in range(len(workload)):
        prompt = workload.prompt(rid)
        n = len(prompt)
        hit = min(matcher.match(prompt), n - 1) if n else 0
        tally.add(n, hit, 0)
        output = workload.output(rid)
        matcher.insert(np.concatenate((prompt, output)) if len(output) else prompt)
        if progress is not None:
            progress(1)
    return tally


def theoretical_max_hit_rate(
    workload: Workload, progress: Callable[[int], None] | None = None
) -> float:
    """The workload's theoretical maximum hit rate: radix, page size 1, infinite capacity,
    one request at a time in arrival order (see :func:`theoretical_max`)."""
    return theoretical_max(workload, progress).hit_rate
