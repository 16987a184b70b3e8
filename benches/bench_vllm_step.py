"""vLLM 0.33's scheduler step, stock vs on kvindex's ``KVCacheManager`` (needs vLLM).

Workload (what a vLLM chat deployment's scheduler sees): prefix caching on, block 16,
chunked prefill, multi-turn chats whose prompts of 2-8K tokens share 1-4K-token system
prompts, answers of 64-512 tokens (``ignore_eos``, ``max_tokens``), the waiting queue kept
topped up so ``running`` stays at ``--running`` requests, the pool sized so that it is
about 80% used in steady state. Each step is ``schedule()`` then ``update_from_output()``
with a mocked model output (one sampled token per request whose prompt is computed; the
token values are a fixed function of conversation and position, so a conversation's next
turn carries its previous answer). ``--async`` runs vLLM's ``AsyncScheduler`` one step
ahead (``schedule()`` of step k+1 before ``update_from_output()`` of step k), as the
engine's batch queue does.

Both schedulers run in one process, interleaved step by step, on identical request
streams (each side its own ``Request`` objects; the stock side with vLLM's request
hasher, the kvindex side with kvindex's). The run fails if they did not do the same work:
per step, scheduled tokens, prefix-cache hit tokens, admissions (new and resumed) and
preemptions must be equal.

Measured, after ``--warmup`` steps: the step time of each side (median and mean over
``--steps`` uninstrumented steps), then the time inside ``kv_cache_manager`` calls
(every manager method the scheduler calls, and ``block_pool.free_blocks``; a further
``--steps`` steps with timing wrappers, wrapper cost subtracted), and the prompt hashing
cost of both hashers on the same prompts (first hashing of each arriving prompt).

    .vllm-env/venv/bin/python benches/bench_vllm_step.py \\
        --running 1024 [--async] [--kvindex-side stock]

``--kvindex-side stock`` runs vLLM's manager on both sides (the harness on its own).
``--model openai/gpt-oss-20b`` (a config under ``tests/integrations/vllm/models``) runs that
model's KV cache groups instead of Qwen3-0.6B's one full-attention group: with
``layer_types`` naming sliding-window layers, a full-attention group and a sliding-window
group of the config's ``sliding_window`` (vLLM groups gpt-oss's 12 + 12 layers so), both
of block 16.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

BLOCK = 16
# Architecture numbers of Qwen3-0.6B (its published config.json); no weights are read.
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
VOCAB = 151_936
MODELS_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integrations", "vllm", "models"
)


def model_groups(config: dict[str, Any]) -> list[int | None]:
    """The KV cache groups of a model config: None for full attention, else the window."""
    layer_types = config.get("layer_types") or []
    if "sliding_attention" in layer_types:
        return [None, int(config["sliding_window"])]
    return [None]


MANAGER_METHODS = [
    "get_computed_blocks",
    "get_computed_blocks_for_connector",
    "allocate_slots",
    "free",
    "pop_blocks_for_free",
    "cache_blocks",
    "truncate_computed_blocks",
    "get_blocks",
    "get_block_ids",
    "get_block_ids_for_computed_tokens",
    "remove_skipped_blocks",
    "evict_blocks",
    "take_events",
    "take_new_block_ids",
    "record_blocks_for_zeroing",
    "take_kv_cache_block_copies",
    "record_prefix_cache_stats",
    "make_prefix_cache_stats",
    "estimate_cached_tokens",
    "new_step_starts",
    "take_boundary_state_offloads",
    "finalize_partial_tail_offloads",
]


def import_vllm() -> Any:
    # The scheduler runs on the CPU; no model files are fetched.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm.v1.core.sched.scheduler as sched_mod
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager
    return argparse.Namespace(
        sched_mod=sched_mod,
        CacheConfig=CacheConfig,
        ModelConfig=ModelConfig,
        SchedulerConfig=SchedulerConfig,
        VllmConfig=VllmConfig,
        SamplingParams=SamplingParams,
        get_hash_fn_by_name=get_hash_fn_by_name,
        kv_cache_utils=kv_cache_utils,
        AsyncScheduler=AsyncScheduler,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        ModelRunnerOutput=ModelRunnerOutput,
        Request=Request,
        StructuredOutputManager=StructuredOutputManager,
    )


def mock_token(conv: int, pos: int) -> int:
    return (conv * 1_000_003 + pos * 7_919) % VOCAB


@dataclass
class Conversation:
    cid: int
    tokens: list[int]
    turns: int = 0


@dataclass
class Turn:
    rid: str
    conv: Conversation
    prompt: list[int]
    answer: int


class Workload:
    """Multi-turn chats over shared system prompts; the same stream for both sides."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.system = [
            [self.rng.randrange(VOCAB) for _ in range(self.rng.randrange(1024, 4097))]
            for _ in range(16)
        ]
        self.ready: deque[Conversation] = deque()
        self.next_cid = 0
        self.next_rid = 0

    def _user(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def next_turn(self) -> Turn:
        while True:
            if self.ready and self.rng.random() < 0.7:
                conv = self.ready.popleft()
                prompt = conv.tokens + self._user(self.rng.randrange(64, 1025))
                if len(prompt) > 8192:
                    continue  # the chat ends; start another
            else:
                sysp = self.rng.choice(self.system)
                conv = Conversation(self.next_cid, [])
                self.next_cid += 1
                lo = max(64, 2048 - len(sysp))
                prompt = sysp + self._user(self.rng.randrange(lo, max(lo + 1, 6144 - len(sysp))))
            conv.tokens = prompt
            self.next_rid += 1
            return Turn(
                f"c{conv.cid}t{conv.turns}r{self.next_rid}",
                conv,
                prompt,
                self.rng.randrange(64, 513),
            )

    def finished(self, turn: Turn) -> None:
        conv = turn.conv
        n = len(turn.prompt)
        conv.tokens = turn.prompt + [mock_token(conv.cid, n + i) for i in range(turn.answer)]
        conv.turns += 1
        self.ready.append(conv)


@contextlib.contextmanager
def manager_class(v: Any, cls: Any) -> Iterator[None]:
    saved = v.sched_mod.KVCacheManager
    v.sched_mod.KVCacheManager = cls
    try:
        yield
    finally:
        v.sched_mod.KVCacheManager = saved


def build_scheduler(
    v: Any,
    model_dir: str,
    *,
    running: int,
    num_blocks: int,
    is_async: bool,
    manager: Any,
    caching: bool = True,
    budget: int = 8192,
    groups: list[int | None] | None = None,
) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_config = v.ModelConfig(
            model=model_dir, dtype="float16", seed=0, skip_tokenizer_init=True, max_model_len=16384
        )
        scheduler_config = v.SchedulerConfig(
            max_num_seqs=running,
            max_num_batched_tokens=budget,
            max_model_len=16384,
            enable_chunked_prefill=True,
            async_scheduling=is_async,
            is_encoder_decoder=False,
            watermark=0.0,
        )
        cache_config = v.CacheConfig(block_size=BLOCK, enable_prefix_caching=caching)
        vllm_config = v.VllmConfig(
            scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config
        )
        f32 = __import__("torch").float32
        specs = [
            v.FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32)
            if w is None
            else v.SlidingWindowSpec(
                block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=f32, sliding_window=w
            )
            for w in (groups or [None])
        ]
        kv_config = v.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                v.KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)
            ],
        )
        cache_config.num_gpu_blocks = num_blocks
        cls = v.AsyncScheduler if is_async else v.sched_mod.Scheduler
        ctx = manager_class(v, manager) if manager is not None else contextlib.nullcontext()
        with ctx:
            return cls(
                vllm_config=vllm_config,
                kv_cache_config=kv_config,
                block_size=BLOCK,
                log_stats=True,
                structured_output_manager=v.StructuredOutputManager(vllm_config),
            )


@dataclass
class Side:
    name: str
    sched: Any
    hasher: Callable[[Any], list[bytes]]
    turns: dict[str, Turn] = field(default_factory=dict)
    pending: deque[Any] = field(default_factory=deque)
    step_ns: list[int] = field(default_factory=list)
    # The schedule() part of each step (the rest is update_from_output()).
    sched_ns: list[int] = field(default_factory=list)
    mgr_ns: int = 0
    mgr_calls: int = 0
    by_method: dict[str, list[int]] = field(default_factory=dict)


def make_request(v: Any, turn: Turn, hasher: Any) -> Any:
    sp = v.SamplingParams(max_tokens=turn.answer, ignore_eos=True)
    return v.Request(
        request_id=turn.rid,
        prompt_token_ids=list(turn.prompt),
        sampling_params=sp,
        pooling_params=None,
        block_hasher=hasher,
    )


def sampling_mask(side: Side, out: Any) -> list[tuple[str, bool]]:
    """Right after ``schedule()``: which scheduled requests sample a token this step (their
    prompt is computed once this step's tokens are)."""
    reqs = side.sched.requests
    return [
        (rid, reqs[rid].num_computed_tokens >= reqs[rid].num_tokens)
        for rid in out.num_scheduled_tokens
    ]


def mock_output(v: Any, side: Side, mask: list[tuple[str, bool]]) -> Any:
    reqs = side.sched.requests
    ids = [rid for rid, _ in mask]
    sampled = []
    for rid, samples in mask:
        r = reqs.get(rid)
        if r is None or not samples:
            sampled.append([])
        else:
            sampled.append([mock_token(side.turns[rid].conv.cid, r.num_tokens)])
    return v.ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def work_of(out: Any) -> tuple[int, int, int, int]:
    hits = sum(r.num_computed_tokens for r in out.scheduled_new_reqs)
    cached = out.scheduled_cached_reqs
    resumed = sum(1 for x in getattr(cached, "resumed_req_ids", ()) or ())
    return (
        out.total_num_scheduled_tokens,
        hits,
        len(out.scheduled_new_reqs) + resumed,
        len(out.preempted_req_ids or ()),
    )


def step(v: Any, side: Side, is_async: bool) -> tuple[tuple[int, int, int, int], list[str]]:
    """One engine step; returns its work and the finished request ids."""
    t0 = time.perf_counter_ns()
    out = side.sched.schedule()
    side.sched_ns.append(time.perf_counter_ns() - t0)
    side.pending.append((out, sampling_mask(side, out)))
    done = side.pending.popleft() if not is_async or len(side.pending) > 1 else None
    eco = None
    if done is not None:
        eco = side.sched.update_from_output(done[0], mock_output(v, side, done[1]))
    side.step_ns.append(time.perf_counter_ns() - t0)
    finished: list[str] = []
    if eco:
        for o in eco.values():
            for ro in o.outputs:
                if ro.finish_reason is not None:
                    finished.append(ro.request_id)
    return work_of(out), finished


def instrument(side: Side) -> Callable[[], None]:
    mgr = side.sched.kv_cache_manager
    targets: list[tuple[Any, str]] = [(mgr, n) for n in MANAGER_METHODS if hasattr(mgr, n)]
    if hasattr(mgr, "block_pool") and hasattr(mgr.block_pool, "free_blocks"):
        targets.append((mgr.block_pool, "free_blocks"))
    return instrument_targets(side, targets)


def instrument_targets(side: Side, targets: list[tuple[Any, str]]) -> Callable[[], None]:
    pc = time.perf_counter_ns

    def wrap(fn: Callable[..., Any], acc: list[int]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t = pc()
            try:
                return fn(*a, **k)
            finally:
                dt = pc() - t
                side.mgr_ns += dt
                side.mgr_calls += 1
                acc[0] += dt
                acc[1] += 1

        return timed

    # An instance attribute a wrapper replaces (kvindex's native per-step methods) is
    # put back by undo; any other wrapper is deleted, uncovering the class's method.
    saved: list[tuple[Any, str, Any]] = []
    for obj, name in targets:
        acc = side.by_method.setdefault(name, [0, 0])
        saved.append((obj, name, getattr(obj, "__dict__", {}).get(name)))
        setattr(obj, name, wrap(getattr(obj, name), acc))

    def undo() -> None:
        for obj, name, before in saved:
            if before is not None:
                setattr(obj, name, before)
                continue
            with contextlib.suppress(AttributeError):
                delattr(obj, name)

    return undo


class _NoOpManager:
    """A no-op with ``allocate_slots``' twelve parameters (the wrapper's calibration)."""

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> None:
        return None


def wrapper_cost_ns() -> float:
    """What the timing wrapper adds to the interval it reports, per call: the interval it
    reports around a no-op with ``allocate_slots``' signature, called as the scheduler calls
    ``allocate_slots`` (``(request, n, num_lookahead_tokens=k)``), less that no-op's own
    call time when called directly. The direct call is part of the manager's cost (vLLM's
    pays it too); the ``*args, **kwargs`` forwarding and the clock reads are not."""
    obj = _NoOpManager()
    side = Side("calibration", None, lambda r: [])
    undo = instrument_targets(side, [(obj, "allocate_slots")])
    timed = obj.allocate_slots
    undo()
    direct = obj.allocate_slots
    pc = time.perf_counter_ns
    n = 100_000
    best_reported = best_direct = float("inf")
    for _ in range(5):
        side.mgr_ns = 0
        for _ in range(n):
            timed(None, 1, num_lookahead_tokens=0)
        best_reported = min(best_reported, side.mgr_ns / n)
        t0 = pc()
        for _ in range(n):
            direct(None, 1, num_lookahead_tokens=0)
        t1 = pc()
        for _ in range(n):
            pass
        empty = pc() - t1
        best_direct = min(best_direct, (t1 - t0 - empty) / n)
    return max(0.0, best_reported - best_direct)


def hashing_cost(v: Any, prompts: list[list[int]], hashers: dict[str, Any]) -> dict[str, Any]:
    """Each prompt hashed from scratch by every hasher in turn (interleaved per prompt, so a
    burst of load on the shared machine hits both), five passes; per hasher the pass with
    the lowest total, as wall-clock and as this thread's CPU time. The hashes must agree."""
    nblocks = sum(len(p) // BLOCK for p in prompts)
    best = {name: [float("inf"), float("inf")] for name in hashers}
    for _ in range(5):
        tot = {name: [0, 0] for name in hashers}
        for i, p in enumerate(prompts):
            got = []
            for name, h in hashers.items():
                r = v.Request(
                    request_id=f"h{i}",
                    prompt_token_ids=p,
                    sampling_params=v.SamplingParams(max_tokens=1),
                    pooling_params=None,
                )
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                r.block_hashes.extend(h(r))
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                tot[name][0] += t1 - t0
                tot[name][1] += c1 - c0
                got.append(r.block_hashes)
            assert all(g == got[0] for g in got) and len(got[0]) == len(p) // BLOCK
        for name in hashers:
            best[name] = [min(best[name][k], tot[name][k]) for k in range(2)]
    return {
        name: {
            "us_per_request": wall / len(prompts) / 1e3,
            "ns_per_block": wall / nblocks,
            "cpu_ns_per_block": cpu / nblocks,
        }
        for name, (wall, cpu) in best.items()
    }


def hashing_only(args: argparse.Namespace) -> dict[str, Any]:
    """Prompt hashing alone, every algorithm: the workload's first 64 prompts, each hashed
    from scratch by vLLM's hasher and by kvindex's (see :func:`hashing_cost`)."""
    v = import_vllm()
    from kvindex.integrations.vllm.hashing import make_request_block_hasher

    wl = Workload(args.seed)
    prompts = [wl.next_turn().prompt for _ in range(64)]
    res: dict[str, Any] = {"prompts": len(prompts), "blocks": sum(len(p) // BLOCK for p in prompts)}
    for algo in ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]:
        fn = v.get_hash_fn_by_name(algo)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v.kv_cache_utils.init_none_hash(fn)
        hs = {
            "vllm": v.kv_cache_utils.get_request_block_hasher(BLOCK, fn),
            "kvindex": make_request_block_hasher(BLOCK, algo),
        }
        r = hashing_cost(v, prompts, hs)
        r["speedup"] = r["vllm"]["ns_per_block"] / r["kvindex"]["ns_per_block"]
        r["cpu_speedup"] = r["vllm"]["cpu_ns_per_block"] / r["kvindex"]["cpu_ns_per_block"]
        r["array_cpu_ns_per_block"] = array_hashing_cpu_ns(prompts, "vllm_" + algo)
        res[algo] = r
    return res


def array_hashing_cpu_ns(prompts: list[list[int]], algo: str) -> float:
    """CPU ns per block of ``kvindex.block_hashes`` on the same prompts as int64 arrays: the
    same serialisation and digest with no Python list to read and no ``bytes`` per block
    (the floor under the request hasher). Best of five passes."""
    import numpy as np

    from kvindex import block_hashes

    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    nblocks = sum(len(p) // BLOCK for p in prompts)
    best = float("inf")
    for _ in range(5):
        c0 = time.thread_time_ns()
        for a in arrays:
            block_hashes(a, BLOCK, algo=algo)
        best = min(best, time.thread_time_ns() - c0)
    return best / nblocks


def run(args: argparse.Namespace) -> dict[str, Any]:
    v = import_vllm()
    from kvindex.integrations.vllm.hashing import make_request_block_hasher

    hash_fn = v.get_hash_fn_by_name("sha256")
    v.kv_cache_utils.init_none_hash(hash_fn)
    stock_hasher = v.kv_cache_utils.get_request_block_hasher(BLOCK, hash_fn)
    kv_hasher = make_request_block_hasher(BLOCK, "sha256")
    if args.kvindex_side == "kvindex":
        from kvindex.integrations.vllm.manager import KVCacheManager as KvManager
    else:
        KvManager = None
    num_blocks = int(args.running * args.blocks_per_request / 0.8)
    model_config = MODEL_CONFIG
    if args.model:
        with open(os.path.join(MODELS_DIR, args.model, "config.json")) as f:
            model_config = json.load(f)
    groups = model_groups(model_config)
    tmp = tempfile.mkdtemp(prefix="kvindex-bench-model-")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(model_config, f)
    budget = args.budget or max(8192, 16 * args.running)
    sides = [
        Side(
            "stock",
            build_scheduler(
                v,
                tmp,
                running=args.running,
                num_blocks=num_blocks,
                is_async=args.is_async,
                manager=None,
                budget=budget,
                groups=groups,
            ),
            stock_hasher,
        ),
        Side(
            "kvindex",
            build_scheduler(
                v,
                tmp,
                running=args.running,
                num_blocks=num_blocks,
                is_async=args.is_async,
                manager=KvManager,
                budget=budget,
                groups=groups,
            ),
            kv_hasher,
        ),
    ]
    if args.freeze_gc:
        # What vLLM's EngineCore does once its scheduler and pool exist (freeze_gc_heap):
        # the objects built so far are left out of every later collection.
        gc.collect()
        gc.freeze()
    wl = Workload(args.seed)
    waiting_target = max(8, args.running // 16)
    usage: list[float] = []
    running_n: list[int] = []
    work_sum = [0, 0, 0, 0]
    prompts: list[list[int]] = []
    total = args.warmup + 2 * args.steps
    for k in range(total):
        if k == args.warmup + args.steps:
            undo = [instrument(s) for s in sides]
        # Top up the waiting queue (same turns on both sides).
        while len(sides[0].sched.waiting) < waiting_target:
            t = wl.next_turn()
            if k >= args.warmup and len(prompts) < 64:
                prompts.append(t.prompt)
            for s in sides:
                s.turns[t.rid] = t
                s.sched.add_request(make_request(v, t, s.hasher))
        works = []
        fins = []
        order = sides if k % 2 == 0 else sides[::-1]
        for s in order:
            w, fin = step(v, s, args.is_async)
            works.append((s.name, w))
            fins.append((s.name, sorted(fin)))
        works.sort()
        fins.sort()
        if works[0][1] != works[1][1] or fins[0][1] != fins[1][1]:
            raise SystemExit(f"step {k}: the two sides did different work: {works} {fins}")
        for rid in fins[0][1]:
            wl.finished(sides[0].turns[rid])
            for s in sides:
                del s.turns[rid]
        if k >= args.warmup:
            usage.append(sides[0].sched.kv_cache_manager.usage)
            running_n.append(len(sides[0].sched.running))
            for i, x in enumerate(works[0][1]):
                work_sum[i] += x
        if k == args.warmup - 1:
            for s in sides:
                s.step_ns.clear()
                s.sched_ns.clear()
        if args.verbose and k % 50 == 0:
            print(
                f"step {k}: running {len(sides[0].sched.running)} waiting "
                f"{len(sides[0].sched.waiting)} usage {sides[0].sched.kv_cache_manager.usage:.3f}"
                f" work {works[0][1]}",
                file=sys.stderr,
            )
    for u in undo:
        u()
    wc = wrapper_cost_ns()
    res: dict[str, Any] = {
        "running": args.running,
        "async": args.is_async,
        "num_blocks": num_blocks,
        "model": args.model or "Qwen/Qwen3-0.6B",
        "kv_cache_groups": ["full" if w is None else f"sliding_window={w}" for w in groups],
        "budget": budget,
        "kvindex_side": args.kvindex_side,
        "steps": args.steps,
        "warmup": args.warmup,
        "usage_min": min(usage),
        "usage_max": max(usage),
        "usage_mean": statistics.mean(usage),
        "running_mean": statistics.mean(running_n),
        "work_per_step": dict(
            zip(
                ["scheduled_tokens", "hit_tokens", "admissions", "preemptions"],
                [x / (2 * args.steps) for x in work_sum],
                strict=True,
            )
        ),
        "wrapper_ns": wc,
        "freeze_gc": args.freeze_gc,
    }
    for s in sides:
        plain = s.step_ns[: args.steps]
        res[s.name] = {
            "step_ms_median": statistics.median(plain) / 1e6,
            "step_ms_mean": statistics.mean(plain) / 1e6,
            "schedule_ms_median": statistics.median(s.sched_ns[: args.steps]) / 1e6,
            "manager_ms_per_step": (s.mgr_ns - wc * s.mgr_calls) / args.steps / 1e6,
            "manager_ms_per_step_raw": s.mgr_ns / args.steps / 1e6,
            "manager_calls_per_step": s.mgr_calls / args.steps,
            "manager_us_per_step_by_method": {
                m: round((ns - wc * n) / args.steps / 1e3, 1)
                for m, (ns, n) in sorted(s.by_method.items(), key=lambda x: -x[1][0])
                if n
            },
            "manager_calls_per_step_by_method": {
                m: round(n / args.steps, 2)
                for m, (ns, n) in sorted(s.by_method.items(), key=lambda x: -x[1][0])
                if n
            },
        }
    res["step_speedup_median"] = res["stock"]["step_ms_median"] / res["kvindex"]["step_ms_median"]
    res["manager_speedup"] = res["stock"]["manager_ms_per_step"] / max(
        1e-9, res["kvindex"]["manager_ms_per_step"]
    )
    res["manager_speedup_raw"] = res["stock"]["manager_ms_per_step_raw"] / max(
        1e-9, res["kvindex"]["manager_ms_per_step_raw"]
    )
    res["hashing"] = hashing_cost(v, prompts, {"vllm": stock_hasher, "kvindex": kv_hasher})
    hv, hk = res["hashing"]["vllm"], res["hashing"]["kvindex"]
    res["hashing"]["speedup"] = hv["ns_per_block"] / hk["ns_per_block"]
    res["hashing"]["cpu_speedup"] = hv["cpu_ns_per_block"] / hk["cpu_ns_per_block"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--async", dest="is_async", action="store_true")
    ap.add_argument("--kvindex-side", choices=["kvindex", "stock"], default="kvindex")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=600)
    ap.add_argument("--blocks-per-request", type=float, default=170.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--budget",
        type=int,
        default=None,
        help="max_num_batched_tokens (default: 16 per running request, at least 8192)",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="a model config under tests/integrations/vllm/models (e.g. openai/gpt-oss-20b); "
        "its KV cache groups (default: Qwen3-0.6B's one full-attention group)",
    )
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--freeze-gc",
        action="store_true",
        help="gc.freeze() once both schedulers are built, as vLLM's EngineCore does",
    )
    ap.add_argument(
        "--hash-only",
        action="store_true",
        help="measure prompt hashing (all four algorithms) and exit",
    )
    args = ap.parse_args()
    print(json.dumps(hashing_only(args) if args.hash_only else run(args), indent=1))


if __name__ == "__main__":
    main()
