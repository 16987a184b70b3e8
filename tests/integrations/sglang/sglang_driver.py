"""One SGLang 0.5.23 cache "world" on CPU (request-to-token pool, KV pool, allocator, tree
cache) and a request driver that runs SGLang's own scheduler-side helpers on it
(``match_kv_cache``, ``checkpoint_kv_cache``, ``release_kv_cache``,
``evict_from_tree_cache`` from ``sglang.srt.mem_cache.common``), for the differential test
and ``benches/bench_sglang.py``. Needs SGLang installed (``make sglang-suite`` builds the
environment).

The driver allocates a request's KV chunk by chunk as SGLang's paged ``alloc_extend`` does
(the partial last page first, then whole new pages), evicting through SGLang's
``evict_from_tree_cache`` when the pool is short, and records what each step observes
(hits with their device indices, the slots handed out, evictions, cache sizes, KV events)
so two worlds driven with one stream can be compared step by step.
"""

from __future__ import annotations

import os
import warnings
from array import array
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.allocator import (
        PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator,
    )
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import (
        checkpoint_kv_cache,
        evict_from_tree_cache,
        match_kv_cache,
        release_kv_cache,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

BACKENDS = ("radix", "unified", "kvindex")


def token_allocator(size: int, page_size: int, kvcache: Any) -> Any:
    """SGLang's token allocator over ``kvcache``: per token at page 1, else paged."""
    if page_size == 1:
        return TokenToKVPoolAllocator(
            size=size, dtype=torch.bfloat16, device="cpu", kvcache=kvcache, need_sort=False
        )
    return PagedTokenToKVPoolAllocator(
        size=size,
        page_size=page_size,
        dtype=torch.bfloat16,
        device="cpu",
        kvcache=kvcache,
        need_sort=False,
    )


def swa_allocator(size: int, size_swa: int, page_size: int) -> Any:
    """SGLang's SWA allocator over an ``SWAKVPool`` of one sliding-window layer (0) and
    one full-attention layer (1)."""
    pool = SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    return SWATokenToKVPoolAllocator(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=torch.bfloat16,
        device="cpu",
        kvcache=pool,
        need_sort=False,
    )


def make_cache(
    backend: str,
    *,
    page_size: int,
    kv_size: int,
    max_reqs: int = 64,
    max_context_len: int = 4096,
    policy: str = "lru",
    events: bool = False,
) -> tuple[Any, Any, Any]:
    """(cache, allocator, req_to_token_pool) on CPU. ``backend``: ``radix`` (SGLang's
    ``RadixCache``), ``unified`` (SGLang's default ``UnifiedRadixCache``; its tree core is
    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND's) or ``kvindex``."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size))
    rtp = ReqToTokenPool(
        size=max_reqs, max_context_len=max_context_len, device="cpu", enable_memory_saver=False
    )
    kv = MHATokenToKVPool(
        size=kv_size,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    alloc = token_allocator(kv_size, page_size, kv)
    params = CacheInitParams(
        req_to_token_pool=rtp,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        disable=False,
        eviction_policy=policy,
        enable_kv_cache_events=events,
        tree_components=(ComponentType.FULL,),
    )
    if backend == "radix":
        cache: Any = RadixCache(params)
    elif backend == "unified":
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        cache = UnifiedRadixCache(params=params)
    elif backend == "kvindex":
        from kvindex.integrations.sglang.cache import KvindexRadixCache

        cache = KvindexRadixCache(params)
    else:
        raise ValueError(backend)
    return cache, alloc, rtp


class FakeReq:
    """The fields and methods of SGLang's ``Req`` that the cache helpers read."""

    def __init__(
        self,
        rid: str,
        prompt: list[int],
        output: list[int],
        extra_key: str | None,
        cache_salt: str | None,
        priority: int | None,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = array("q", prompt)
        self.planned_output = list(output)
        self.output_ids = array("q")
        self.full_untruncated_fill_ids = array("q", prompt)
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.priority = priority
        self.kv = ReqKvInfo()
        self.lock: Any = None
        self.last_node: Any = None
        self.last_host_node: Any = None
        self.best_match_node: Any = None
        self.prefix_len = 0
        self.host_hit_length = 0
        self.swa_host_hit_length = 0
        self.mamba_host_hit_length = 0
        self.num_matched_prefix_tokens = 0
        self.swa_branching_seqlen: Any = None
        self.mamba_branching_seqlen: Any = None
        self.extend_end = 0
        self.finished_len: int | None = None
        self.skip_radix_cache_insert = False
        self._finished = False
        # Read by UnifiedRadixCache (streaming sessions, KV sharding, abort handling).
        self.session: Any = None
        self.session_id: Any = None
        self.kv_rotation_base: Any = None
        self.finished_reason: Any = None
        self.discard_output_reason: Any = None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def get_fill_ids(self) -> Any:
        return self.full_untruncated_fill_ids

    def _compute_max_prefix_len(self, input_len: int) -> int:
        return input_len - 1

    def finished(self) -> bool:
        return self._finished

    def owned_kv_len(self) -> int:
        return int(self.kv.kv_committed_len)

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids


class Driver:
    """Runs requests through one world; every method returns what it observed."""

    def __init__(self, cache: Any, alloc: Any, rtp: Any, page_size: int) -> None:
        self.cache, self.alloc, self.rtp, self.ps = cache, alloc, rtp, page_size
        self.reqs: dict[str, FakeReq] = {}

    def _extend(self, req: FakeReq, new_len: int) -> list[Any] | None:
        """Allocates row positions [kv_allocated_len, new_len) like SGLang's alloc_extend;
        None (nothing changed) if the pool is short even after eviction."""
        kv, ps = req.kv, self.ps
        cur = kv.kv_allocated_len
        if new_len <= cur:
            return []
        pages = -(-new_len // ps) - (-(-cur // ps))
        need = pages * ps
        obs: list[Any] = []
        if self.alloc.available_size() < need:
            before = self.alloc.available_size()
            evict_from_tree_cache(self.cache, need)
            obs.append(("evict", need, self.alloc.available_size() - before))
        if self.alloc.available_size() < need:
            return None
        fresh = self.alloc.alloc(need) if need else torch.empty(0, dtype=torch.int64)
        if fresh is None:
            return None
        row = self.rtp.req_to_token[kv.req_pool_idx]
        first_new_page = -(-cur // ps) * ps
        if cur < first_new_page:  # the partial last page continues
            base = int(row[cur - 1]) + 1
            fill = min(first_new_page, new_len) - cur
            row[cur : cur + fill] = torch.arange(base, base + fill, dtype=row.dtype)
        tail = new_len - max(first_new_page, cur)
        if tail > 0:
            row[max(first_new_page, cur) : new_len] = fresh[:tail].to(row.dtype)
        kv.kv_allocated_len = new_len
        obs.append(("alloc", fresh.tolist()))
        return obs

    def sizes(self) -> tuple[int, int, int]:
        return (
            int(self.cache.evictable_size()),
            int(self.cache.protected_size()),
            int(self.alloc.available_size()),
        )

    def admit(
        self,
        rid: str,
        prompt: list[int],
        output: list[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
    ) -> list[Any]:
        req = FakeReq(rid, prompt, output, extra_key, cache_salt, priority)
        match_kv_cache(req, self.cache, max_prefix_len=len(prompt) - 1)
        req.lock = self.cache.lock(req.last_node)
        hit = req.prefix_len
        prefix = self.cache.prefix_device_indices(req)
        (row,) = self.rtp.alloc_rows(1)
        req.kv.req_pool_idx = row
        self.rtp.write((row, slice(0, hit)), prefix.to(torch.int32))
        req.kv.cache_protected_len = hit
        req.kv.kv_allocated_len = hit
        req.kv.kv_committed_len = hit
        req.extend_end = hit
        self.reqs[rid] = req
        return [("match", hit, prefix.tolist())]

    def prefill(self, rid: str, chunk: int) -> list[Any]:
        """Computes the next ``chunk`` prompt tokens; a chunk that does not finish the
        prompt is checkpointed (SGLang's chunked prefill)."""
        req = self.reqs[rid]
        end = min(len(req.origin_input_ids), req.extend_end + chunk)
        obs = self._extend(req, end)
        if obs is None:
            return [("oom",)] + self.abort(rid)
        req.extend_end = end
        req.kv.kv_committed_len = end
        if end < len(req.origin_input_ids):
            checkpoint_kv_cache(req, self.cache)
            row = self.rtp.req_to_token[req.kv.req_pool_idx, : req.kv.cache_protected_len]
            obs.append(("checkpoint", req.kv.cache_protected_len, row.tolist()))
        return obs

    def prompt_done(self, rid: str) -> bool:
        req = self.reqs[rid]
        return req.extend_end >= len(req.origin_input_ids)

    def finish(self, rid: str) -> list[Any]:
        """Decodes the planned output (one extend) and releases into the tree."""
        req = self.reqs[rid]
        total = len(req.origin_input_ids) + len(req.planned_output)
        obs = self._extend(req, total)
        if obs is None:
            return [("oom",)] + self.abort(rid)
        req.output_ids = array("q", req.planned_output)
        req.kv.kv_committed_len = total
        req._finished = True
        req.finished_len = len(req.planned_output)
        release_kv_cache(req, self.cache, checkpoint=True)
        del self.reqs[rid]
        return obs + [("release", self.sizes())]

    def abort(self, rid: str) -> list[Any]:
        req = self.reqs.pop(rid)
        req._finished = True
        if req.kv.kv_allocated_len == 0:  # nothing computed yet: drop the row and the lock
            self.rtp.free(req)
            self.cache.unlock(req.lock)
        else:
            release_kv_cache(req, self.cache, checkpoint=False)
        return [("abort", self.sizes())]

    def events(self) -> list[Any]:
        return [_event_tuple(e) for e in self.cache.take_events()]


def _event_tuple(e: Any) -> tuple[Any, ...]:
    name = type(e).__name__
    if name == "BlockStored":
        return (
            name,
            list(e.block_hashes),
            e.parent_block_hash,
            list(e.token_ids),
            e.block_size,
            e.lora_id,
            str(e.medium),
            e.cache_salt,
            e.lora_name,
        )
    if name == "BlockRemoved":
        return (name, list(e.block_hashes), str(e.medium))
    return (name,)


def release_newest_lock(locks: list[tuple[Any, Any, Any]], i: int, kv: Any, sgl: Any) -> None:
    """Release, on kvindex's tree ``kv`` and SGLang's ``sgl``, the newest lock on the node
    of ``locks[i]`` (entries ``(kvindex node, SGLang node, SGLang receipt)``, oldest
    first). kvindex's ``unlock(node)`` releases the node's most recent lock (its component
    receipts are last in, first out), so SGLang is handed that lock's receipt: both
    release the same segment."""
    kv_node = locks[i][0]
    j = max(k for k, lk in enumerate(locks) if lk[0] == kv_node)
    _, sgl_node, receipt = locks.pop(j)
    kv.unlock(kv_node)
    sgl.dec_lock_ref(
        sgl_node,
        DecLockRefParams(
            node_id=receipt.node_id,
            skipped_lock_components=receipt.skipped_lock_components,
            component_lock_uuids=receipt.component_lock_uuids,
        ),
    )


def tree_core_backend() -> str:
    return os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "rust")


class Divergence(AssertionError):
    """Two worlds observed different things at one step of the same stream."""


def run_lockstep(
    drivers: dict[str, Driver],
    *,
    seed: int,
    steps: int,
    vocab: int = 50,
    namespaces: bool = False,
    priorities: bool = False,
    max_active: int = 4,
) -> dict[str, int]:
    """Drives every world with one random request stream (shared system prompts,
    multi-turn follow-ups, chunked prefill, aborts, eviction under a small pool) and
    raises :class:`Divergence` at the first step whose observations differ. Returns
    counts of what the stream did."""
    import random

    rng = random.Random(seed)
    names = list(drivers)
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(4, 40))] for _ in range(4)]
    history: list[tuple[list[int], str | None, str | None]] = []
    stats = {
        "admit": 0,
        "prefill": 0,
        "checkpoint": 0,
        "finish": 0,
        "abort": 0,
        "oom": 0,
        "evict": 0,
        "hit_tokens": 0,
        "events": 0,
    }
    active: list[str] = []
    next_id = 0

    def step(op: str, *args: Any) -> list[Any]:
        results = {n: getattr(drivers[n], op)(*args) for n in names}
        events = {n: drivers[n].events() for n in names}
        ref = names[0]
        for n in names[1:]:
            if results[n] != results[ref]:
                raise Divergence(
                    f"step {op}{args[:1]}: {ref} saw {results[ref]!r}, {n} saw {results[n]!r}"
                )
            if events[n] != events[ref]:
                raise Divergence(
                    f"events after {op}{args[:1]}: {ref} {events[ref]!r}, {n} {events[n]!r}"
                )
            if drivers[n].sizes() != drivers[ref].sizes():
                raise Divergence(
                    f"sizes after {op}{args[:1]}: {drivers[ref].sizes()} vs {drivers[n].sizes()}"
                )
        stats["events"] += len(events[ref])
        for o in results[ref]:
            if o[0] in stats:
                stats[o[0]] += 1
            if o[0] == "match":
                stats["hit_tokens"] += o[1]
        return list(results[ref])

    for _ in range(steps):
        r = rng.random()
        if len(active) < max_active and (r < 0.35 or not active):
            rid = f"r{next_id}"
            next_id += 1
            extra_key = rng.choice([None, None, "lora-a", "lora-b"]) if namespaces else None
            salt = rng.choice([None, None, "salt-1"]) if namespaces else None
            if history and rng.random() < 0.4:  # a follow-up turn
                prev, extra_key, salt = rng.choice(history)
                prompt = prev + [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
            else:
                prompt = list(rng.choice(systems)) + [
                    rng.randrange(vocab) for _ in range(rng.randrange(1, 60))
                ]
            output = [rng.randrange(vocab) for _ in range(rng.randrange(0, 20))]
            priority = rng.randrange(-2, 3) if priorities else None
            step("admit", rid, prompt, output, extra_key, salt, priority)
            history.append((prompt + output, extra_key, salt))
            if len(history) > 20:
                history.pop(0)
            active.append(rid)
            continue
        rid = rng.choice(active)
        d0 = drivers[names[0]]
        if rng.random() < 0.05:
            step("abort", rid)
            active.remove(rid)
        elif not d0.prompt_done(rid):
            obs = step("prefill", rid, rng.choice([1, 3, 8, 16, 64]))
            if obs and obs[0] == ("oom",):
                active.remove(rid)
        else:
            obs = step("finish", rid)
            active.remove(rid)
    for rid in list(active):
        step("abort", rid)
    return stats
