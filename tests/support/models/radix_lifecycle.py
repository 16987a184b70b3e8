"""The engine lifecycle of ``tests/support/models/vllm_lifecycle.py`` on a token-level radix tree.

Same scheduler-facing protocol (``admit`` / ``schedule`` / ``commit_tokens`` / ``preempt``
/ ``finish`` / ``lookup``), same request bookkeeping (drafts, async placeholders and
their validation are shared with the vLLM model), but the cache is SGLang's: a radix
tree over page-aligned token keys (``models.radix_model.RadixModel``) whose values are
KV slot ids, requests holding a lock on their deepest cached node.

Insertion follows SGLang's per-chunk ``cache_unfinished_req(req, chunked=True)``: the key
is the request's tokens so far, page aligned; ``insert`` reports how much the tree
already had; the request's own copies of those pages (between what it had already
protected and that prefix) are freed; ``match_prefix`` re-finds the node, the request's
slot row is rewritten with the tree's slots, the old node unlocked and the new one
locked. What differs from SGLang is only *when*: the insert runs at the moment vLLM
caches (when the chunk is scheduled, up to ``min(num_computed + num_new, num_tokens)``,
so lookahead slots, unverified drafts and unknown ids stay out), instead of at the next
scheduling round. With that timing, equal page and block sizes and unbounded capacity,
both designs hold exactly the same set of cacheable token prefixes after every call and
every admission hits the same number of tokens (``tests/request/test_lifecycle_model.py``
checks it on random workloads).

``finish`` inserts nothing more: SGLang's ``cache_finished_req`` would also insert the
committed tail, which in synchronous decoding is already in the tree and in async
decoding holds ids vLLM never caches (they arrive after the request's last
``allocate_slots``); both engines then differ by that tail only.

Capacity is unbounded (pages are numbered from a counter): eviction order under memory
pressure is the business of ``models.radix_model.RadixCacheModel``. External tokens and
delayed caching are not modelled here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from models.radix_model import ModelNode, RadixModel
from models.vllm_lifecycle import (
    Admitted,
    LifecycleError,
    Request,
    Status,
    apply_commit,
    check_commit,
    check_schedule,
)

__all__ = ["RadixLifecycleModel"]


@dataclass
class _RadixReq:
    req: Request
    slots: list[int] = field(default_factory=list)  # KV slot of each reserved position
    protected: int = 0  # leading slots owned by the tree (cache_protected_len)
    node: ModelNode | None = None  # the locked deepest cached node


class RadixLifecycleModel:
    """Radix-tree cache driven with the vLLM lifecycle protocol (unbounded capacity)."""

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise LifecycleError("page_size must be >= 1")
        self.page_size = page_size
        self.tree = RadixModel(page_size)
        self.requests: dict[str | int, _RadixReq] = {}
        self.next_page = 1  # page 0 plays the null block
        self.free_pages: list[int] = []
        self.stats = {"requests": 0, "queries": 0, "hits": 0}

    # ------------------------------------------------------------------ pages
    def _alloc_slots(self, rr: _RadixReq, num_slots: int) -> None:
        ps = self.page_size
        while len(rr.slots) < num_slots:
            if self.free_pages:
                page = self.free_pages.pop()
            else:
                page, self.next_page = self.next_page, self.next_page + 1
            rr.slots.extend(range(page * ps, (page + 1) * ps))

    def _free_slots(self, slots: Sequence[int]) -> None:
        ps = self.page_size
        for s in slots:
            if s % ps == 0:
                self.free_pages.append(s // ps)

    def _lookup_len(self, tokens: Sequence[int]) -> int:
        return self.tree.probe(tokens[: len(tokens) - 1]) if tokens else 0

    # ------------------------------------------------------------------ SGLang's per-chunk insert
    def _cache_unfinished(self, rr: _RadixReq, upto: int) -> None:
        ps = self.page_size
        n = upto // ps * ps
        if n <= rr.protected:
            return
        key = rr.req.tokens[:n]
        prefix, to_free = self.tree.insert(key, rr.slots[:n])
        dup = [s for s in to_free if rr.slots.index(s) >= rr.protected]
        assert len(dup) == len(to_free), "the tree never hands back slots it owns"
        self._free_slots(dup)
        hit, slots, node = self.tree.match_prefix(key)
        assert hit == n and prefix <= n
        rr.slots[:n] = list(slots)
        if rr.node is not None:
            self.tree.unlock(rr.node)
        self.tree.lock(node)
        rr.node = node
        rr.protected = n

    def _release(self, rr: _RadixReq) -> None:
        self._free_slots(rr.slots[rr.protected :])
        if rr.node is not None:
            self.tree.unlock(rr.node)
        rr.slots, rr.protected, rr.node = [], 0, None

    # ------------------------------------------------------------------ protocol
    def _rr(self, rid: str | int, *statuses: Status) -> _RadixReq:
        rr = self.requests.get(rid)
        if rr is None:
            raise LifecycleError(f"unknown request {rid!r}")
        if statuses and rr.req.status not in statuses:
            raise LifecycleError(f"request {rid!r} is {rr.req.status.value}")
        return rr

    def lookup(self, tokens: Sequence[int]) -> int:
        return self._lookup_len([int(t) for t in tokens])

    def admit(
        self,
        rid: str | int,
        tokens: Sequence[int] | None = None,
        *,
        chunk: int | None = None,
        lookahead: int = 0,
    ) -> Admitted | None:
        if chunk is not None and chunk < 1:
            raise LifecycleError("chunk must be >= 1")
        if lookahead < 0:
            raise LifecycleError("negative lookahead")
        if tokens is None:
            rr = self._rr(rid, Status.PREEMPTED)
        else:
            if rid in self.requests:
                raise LifecycleError(f"request {rid!r} already exists")
            if len(tokens) == 0:
                raise LifecycleError("empty prompt")
            toks = [int(t) for t in tokens]
            rr = _RadixReq(Request(rid, toks, len(toks)))
            self.requests[rid] = rr
        r = rr.req
        hit, slots, node = self.tree.match_prefix(r.tokens[: r.num_tokens - 1])
        self.tree.lock(node)
        rr.slots, rr.protected, rr.node = list(slots), hit, node
        n = r.num_tokens - hit
        if chunk is not None:
            n = min(n, chunk)
        self._alloc_slots(rr, hit + n + lookahead)
        r.num_computed = hit + n
        self._cache_unfinished(rr, min(r.num_computed, r.num_tokens))
        self.stats["requests"] += 1
        self.stats["queries"] += r.num_tokens
        self.stats["hits"] += hit
        r.status = Status.RUNNING
        if r.num_computed == r.num_tokens:
            r.pending += 1
        return Admitted(hit, n, [])

    def schedule(
        self,
        rid: str | int,
        num_new_tokens: int,
        *,
        lookahead: int = 0,
        draft_token_ids: Sequence[int] = (),
    ) -> list[int]:
        rr = self._rr(rid, Status.RUNNING)
        r = rr.req
        drafts = [int(t) for t in draft_token_ids]
        samples = check_schedule(r, num_new_tokens, drafts, lookahead, 0)
        cap = r.num_tokens  # known ids before this step's drafts
        self._alloc_slots(rr, r.num_computed + num_new_tokens + lookahead)
        r.num_computed += num_new_tokens
        r.spec = drafts
        r.pending += samples
        self._cache_unfinished(rr, min(r.num_computed, cap))
        return []

    def commit_tokens(
        self, rid: str | int, token_ids: Sequence[int], num_rejected: int = 0
    ) -> None:
        rr = self._rr(rid, Status.RUNNING)
        ids = [int(t) for t in token_ids]
        check_commit(rr.req, ids, num_rejected)
        apply_commit(rr.req, ids, num_rejected)
        rr.req.tokens.extend(ids)

    def preempt(self, rid: str | int) -> None:
        rr = self._rr(rid, Status.RUNNING)
        self._release(rr)
        r = rr.req
        r.status, r.num_computed, r.spec, r.pending = Status.PREEMPTED, 0, [], 0
        r.num_preemptions += 1

    def finish(self, rid: str | int) -> None:
        rr = self._rr(rid, Status.RUNNING, Status.PREEMPTED)
        self._release(rr)
        rr.req.status = Status.FINISHED

    # ------------------------------------------------------------------ views
    def cached_prefixes(self) -> set[tuple[int, ...]]:
        """Every page-aligned token prefix the tree can serve."""
        ps = self.page_size
        out: set[tuple[int, ...]] = set()
        for _, toks in self.tree.sequences():
            for k in range(ps, len(toks) + 1, ps):
                out.add(tuple(toks[:k]))
        return out

    def check_invariants(self) -> None:
        held: dict[int, int] = {}
        for rr in self.requests.values():
            r = rr.req
            assert rr.protected <= len(rr.slots) and rr.protected % self.page_size == 0
            assert rr.protected <= r.num_tokens, "an unknown id reached the tree"
            if rr.protected:
                assert rr.node is not None
                assert self.tree.path_slots(rr.node) == rr.slots[: rr.protected]
            for s in rr.slots[rr.protected :]:
                held[s] = held.get(s, 0) + 1
        assert all(c == 1 for c in held.values()), "a private slot is shared"
        tree_slots = set(self.tree.all_slots())
        assert not tree_slots & set(held), "a private slot is also in the tree"
        free = {p * self.page_size for p in self.free_pages}
        assert len(free) == len(self.free_pages) and not free & (tree_slots | set(held))
