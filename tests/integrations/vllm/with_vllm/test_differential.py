"""Randomised differential: vLLM 0.33's scheduler on its own manager vs on kvindex's (needs vLLM).

Two schedulers of the same configuration — one stock, one whose ``KVCacheManager`` is
``kvindex.integrations.vllm.manager.KVCacheManager`` (and whose requests are hashed by
kvindex's request hasher) — get the same long random workload: chats over a few shared
system prompts, multi-turn continuations (a finished request's prompt and answer, plus a
new user message), aborts of waiting and running requests, EOS, a pool small enough to
preempt, chunked prefill, async scheduling, and speculative drafts with random
acceptance. The mocked model output is drawn once per step and fed to both. After every
step the test compares, field by field, the scheduler output (new and cached requests'
block ids, computed and scheduled tokens, drafts, preempted and finished ids, blocks to
zero), the engine outputs (tokens, finish reasons, cached-token counts), the KV events
published, and the pool usage and prefix-cache stats. Any difference fails with the step
and the first differing field. Fixed seeds; caching on and off.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# The scheduler runs on the CPU; no model files are fetched.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("vllm")
    import torch
    import vllm.v1.core.sched.scheduler as sched_mod
    from vllm.config import (
        CacheConfig,
        KVEventsConfig,
        ModelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

from kvindex.integrations.vllm.hashing import make_request_block_hasher
from kvindex.integrations.vllm.manager import KVCacheManager as KvManager

VOCAB = 50_272
EOS = 2
# Architecture numbers of facebook/opt-125m (its published config.json); no weights are read.
MODEL_CONFIG = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 768,
    "ffn_dim": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 2048,
    "vocab_size": VOCAB,
    "word_embed_proj_dim": 768,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": EOS,
    "pad_token_id": 1,
    "torch_dtype": "float16",
}


@dataclass(frozen=True)
class Config:
    caching: bool
    is_async: bool
    drafts: int
    block_size: int
    num_blocks: int
    max_seqs: int
    budget: int
    steps: int
    seed: int


CONFIGS = {
    "caching-sync": Config(True, False, 0, 16, 96, 12, 256, 700, 1),
    "caching-sync-drafts": Config(True, False, 3, 4, 300, 10, 128, 700, 2),
    "caching-async": Config(True, True, 0, 16, 96, 12, 256, 700, 3),
    "caching-async-bs4": Config(True, True, 0, 4, 300, 16, 96, 700, 4),
    "nocaching-sync": Config(False, False, 0, 16, 96, 12, 256, 500, 5),
    "nocaching-sync-drafts": Config(False, False, 2, 8, 160, 10, 128, 500, 6),
    "nocaching-async": Config(False, True, 0, 8, 160, 12, 192, 500, 7),
}


class Recorder:
    """Stands in for the scheduler's KV-event publisher; keeps every batch's events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        return None


@contextlib.contextmanager
def manager_class(cls: Any) -> Iterator[None]:
    saved = sched_mod.KVCacheManager
    sched_mod.KVCacheManager = cls
    try:
        yield
    finally:
        sched_mod.KVCacheManager = saved


def build(c: Config, model_dir: Path, kvindex: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_config = ModelConfig(
            model=str(model_dir),
            dtype="float16",
            seed=0,
            skip_tokenizer_init=True,
            max_model_len=2048,
        )
        spec_config = None
        if c.drafts:
            spec_config = SpeculativeConfig(
                model="ngram",
                method="ngram",
                num_speculative_tokens=c.drafts,
                prompt_lookup_max=c.drafts,
                prompt_lookup_min=1,
            )
        vllm_config = VllmConfig(
            scheduler_config=SchedulerConfig(
                max_num_seqs=c.max_seqs,
                max_num_batched_tokens=c.budget,
                max_model_len=2048,
                enable_chunked_prefill=True,
                async_scheduling=c.is_async,
                is_encoder_decoder=False,
                watermark=0.0,
            ),
            model_config=model_config,
            cache_config=CacheConfig(block_size=c.block_size, enable_prefix_caching=c.caching),
            speculative_config=spec_config,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
        )
        spec = FullAttentionSpec(
            block_size=c.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        kv_config = KVCacheConfig(
            num_blocks=c.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
        vllm_config.cache_config.num_gpu_blocks = c.num_blocks
        cls = AsyncScheduler if c.is_async else sched_mod.Scheduler
        ctx = manager_class(KvManager) if kvindex else contextlib.nullcontext()
        with ctx:
            s = cls(
                vllm_config=vllm_config,
                kv_cache_config=kv_config,
                block_size=c.block_size,
                log_stats=True,
                structured_output_manager=StructuredOutputManager(vllm_config),
            )
    assert isinstance(s.kv_cache_manager, KvManager) is kvindex
    s.kv_event_publisher = Recorder()
    return s


@dataclass
class Side:
    sched: Any
    hasher: Any
    pending: deque[Any] = field(default_factory=deque)


def new_block_ids(ids: Any) -> Any:
    return None if ids is None else tuple(list(g) for g in ids)


def summarize(out: Any) -> dict[str, Any]:
    cached = out.scheduled_cached_reqs
    return {
        "new": [
            (r.req_id, new_block_ids(r.block_ids), r.num_computed_tokens)
            for r in out.scheduled_new_reqs
        ],
        "cached_ids": list(cached.req_ids),
        "resumed": sorted(cached.resumed_req_ids),
        "cached_new_blocks": [new_block_ids(b) for b in cached.new_block_ids],
        "cached_computed": list(cached.num_computed_tokens),
        "cached_outputs": list(cached.num_output_tokens),
        "scheduled": dict(out.num_scheduled_tokens),
        "total": out.total_num_scheduled_tokens,
        "spec": {k: list(v) for k, v in out.scheduled_spec_decode_tokens.items()},
        "finished": sorted(out.finished_req_ids),
        "preempted": sorted(out.preempted_req_ids or ()),
        "zero": list(out.new_block_ids_to_zero or ()),
    }


def summarize_engine(eco: Any) -> dict[Any, Any]:
    res = {}
    for client, outs in (eco or {}).items():
        res[client] = [
            (
                o.request_id,
                list(o.new_token_ids),
                o.finish_reason,
                o.stop_reason,
                o.prefill_stats,
            )
            for o in outs.outputs
        ]
    return res


def check_mirror(m: Any, step: int) -> None:
    """Each ``get_blocks`` result the drop-in keeps is the request's Rust table, and its
    per-step calls are served natively (``_VllmFront``: a wrong no-op there shows up as a
    divergence from vLLM's scheduler)."""
    core = m._core
    for rid, kept in m._tables.items():
        assert [b.block_id for b in kept.blocks[0]] == core.blocks(rid), f"step {step}: {rid}"
    if type(m).__name__ == "KVCacheManager":
        assert type(m.__dict__["allocate_slots"]).__name__ == "builtin_function_or_method"


def first_difference(a: dict[Any, Any], b: dict[Any, Any]) -> str:
    for k in a:
        if a[k] != b.get(k):
            return f"{k}: stock {a[k]!r} vs kvindex {b.get(k)!r}"
    return f"keys: {sorted(map(str, a))} vs {sorted(map(str, b))}"


class Driver:
    def __init__(self, c: Config, model_dir: Path) -> None:
        self.c = c
        self.rng = random.Random(c.seed)
        hash_fn = get_hash_fn_by_name("sha256")
        kv_cache_utils.init_none_hash(hash_fn)
        self.sides = [
            Side(
                build(c, model_dir, False),
                kv_cache_utils.get_request_block_hasher(c.block_size, hash_fn),
            ),
            Side(build(c, model_dir, True), make_request_block_hasher(c.block_size, "sha256")),
        ]
        self.system = [
            [self.rng.randrange(3, VOCAB) for _ in range(self.rng.randrange(8, 120))]
            for _ in range(4)
        ]
        self.history: deque[list[int]] = deque()
        self.next_id = 0
        self.steps = 0
        self.preemptions = 0
        self.hit_tokens = 0
        self.finished = 0

    def add_requests(self) -> None:
        rng = self.rng
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 4])):
            if self.history and rng.random() < 0.5:
                prompt = self.history.popleft() + [
                    rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 40))
                ]
            else:
                prompt = rng.choice(self.system) + [
                    rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 200))
                ]
            prompt = prompt[:1500]
            self.next_id += 1
            rid = f"r{self.next_id}"
            max_tokens = rng.randrange(1, 60)
            for s in self.sides:
                sp = SamplingParams(max_tokens=max_tokens)
                sp.update_from_generation_config({}, EOS)
                s.sched.add_request(
                    Request(
                        request_id=rid,
                        prompt_token_ids=list(prompt),
                        sampling_params=sp,
                        pooling_params=None,
                        block_hasher=s.hasher,
                    )
                )

    def abort(self) -> None:
        reqs = sorted(self.sides[0].sched.requests)
        if reqs and self.rng.random() < 0.04:
            victims = self.rng.sample(reqs, k=min(len(reqs), self.rng.choice([1, 1, 2])))
            for s in self.sides:
                s.sched.finish_requests(victims, RequestStatus.FINISHED_ABORTED)

    def sampling(self, side: Side, out: Any) -> list[tuple[str, bool]]:
        reqs = side.sched.requests
        return [
            (rid, reqs[rid].num_computed_tokens >= reqs[rid].num_tokens)
            for rid in out.num_scheduled_tokens
        ]

    def model_output(self, out: Any, mask: list[tuple[str, bool]]) -> ModelRunnerOutput:
        rng = self.rng
        ids = [rid for rid, _ in mask]
        sampled: list[list[int]] = []
        for rid, samples in mask:
            if not samples:
                sampled.append([])
                continue
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            acc = rng.randrange(len(drafts) + 1) if drafts else 0
            bonus = EOS if rng.random() < 0.03 else rng.randrange(3, VOCAB)
            sampled.append(list(drafts[:acc]) + [bonus])
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    def step(self) -> None:
        self.steps += 1
        self.add_requests()
        self.abort()
        outs = []
        for s in self.sides:
            out = s.sched.schedule()
            outs.append(out)
            s.pending.append((out, self.sampling(s, out)))
        a, b = summarize(outs[0]), summarize(outs[1])
        assert a == b, f"step {self.steps} schedule(): {first_difference(a, b)}"
        self.preemptions += len(a["preempted"])
        self.hit_tokens += sum(n for _, _, n in a["new"])
        ready = not self.c.is_async or len(self.sides[0].pending) > 1
        if ready:
            out0, mask0 = self.sides[0].pending[0]
            mro = self.model_output(out0, mask0)
            ecos = []
            for s in self.sides:
                out, mask = s.pending.popleft()
                assert mask == mask0
                ecos.append(summarize_engine(s.sched.update_from_output(out, mro)))
            assert ecos[0] == ecos[1], (
                f"step {self.steps} update_from_output(): {first_difference(ecos[0], ecos[1])}"
            )
            if self.c.drafts:
                self.drafts(mro)
            for client_outs in ecos[0].values():
                for rid, _toks, reason, _stop, _cached in client_outs:
                    if reason is not None:
                        self.finished += 1
                        self.remember(rid)
        ev = [s.sched.kv_event_publisher.events for s in self.sides]
        assert ev[0] == ev[1], f"step {self.steps} events: stock {ev[0]!r} vs kvindex {ev[1]!r}"
        for e in ev:
            e.clear()
        stats = []
        for s in self.sides:
            m = s.sched.kv_cache_manager
            st = s.sched.make_stats()
            pcs = st.prefix_cache_stats if st is not None else None
            stats.append((m.usage, None if pcs is None else (pcs.requests, pcs.queries, pcs.hits)))
        assert stats[0] == stats[1], f"step {self.steps} usage/stats: {stats[0]} vs {stats[1]}"
        check_mirror(self.sides[1].sched.kv_cache_manager, self.steps)

    def drafts(self, mro: ModelRunnerOutput) -> None:
        reqs = self.sides[0].sched.requests
        ids = [rid for rid in mro.req_ids if rid in reqs]
        drafts = [
            [self.rng.randrange(3, VOCAB) for _ in range(self.rng.randrange(self.c.drafts + 1))]
            for _ in ids
        ]
        for s in self.sides:
            s.sched.update_draft_token_ids(DraftTokenIds(list(ids), [list(d) for d in drafts]))

    def remember(self, rid: str) -> None:
        # The finished request's prompt and answer become a later turn's prefix.
        if len(self.history) < 32:
            r = self.sides[0].sched.requests.get(rid)
            if r is not None:
                self.history.append(list(r.all_token_ids))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("opt-config")
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG), encoding="utf-8")
    return d


@pytest.fixture(autouse=True)
def _restore_none_hash() -> Iterator[None]:
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    yield
    if saved is not None:
        kv_cache_utils.NONE_HASH = saved


@pytest.mark.parametrize("name", list(CONFIGS))
def test_differential(name: str, model_dir: Path) -> None:
    c = CONFIGS[name]
    d = Driver(c, model_dir)
    for _ in range(c.steps):
        d.step()
    # The workload exercised what it is for: admissions, finishes, preemption under a
    # small pool, and (with caching) prefix hits.
    assert d.next_id > 50 and d.finished > 30, (d.next_id, d.finished)
    assert d.preemptions > 0, "no preemption: the pool is not small enough"
    assert (d.hit_tokens > 0) is c.caching
