"""kvindex's vLLM ``KVCacheManager`` over vLLM's own types, against vLLM's manager.

Needs vLLM 0.33 (the vLLM test environment); skipped where vLLM is not installed.
The differential drives both managers with the same random calls the scheduler makes
(lookups, chunked allocation, decode steps with lookahead slots, frees, deferred frees,
evictions, resets) and compares every answer, the free queue and the KV events.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import replace
from typing import Any

import pytest

with warnings.catch_warnings():
    # vLLM's import chain trips torch's own deprecation warnings (errors in this suite).
    warnings.simplefilter("ignore", DeprecationWarning)
    vllm = pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    from vllm.distributed.kv_events import BlockStored
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_manager as vllm_manager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request

    from kvindex.exceptions import KvIndexError
    from kvindex.integrations.vllm.errors import UnsupportedVllmConfigError
    from kvindex.integrations.vllm.hybrid import HybridKVCacheManager
    from kvindex.integrations.vllm.manager import KVCacheManager

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VllmManager = vllm_manager.KVCacheManager
if VllmManager is KVCacheManager:  # a swap plugin is active: take vLLM's class from its module
    pytest.skip("vLLM's manager is swapped out in this session", allow_module_level=True)

init_none_hash(sha256)


def full_attention(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )


def swa(block_size: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8
    )


def mamba(block_size: int) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )


def config(num_blocks: int, block_size: int, *specs: Any) -> KVCacheConfig:
    groups = [
        KVCacheGroupSpec([f"layer{i}"], s)
        for i, s in enumerate(specs or (full_attention(block_size),))
    ]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def make_request(rid: str, tokens: list[int], block_size: int) -> Request:
    params = SamplingParams(max_tokens=10_000)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def managers(num_blocks: int, block_size: int, **kw: Any) -> tuple[Any, KVCacheManager]:
    args = dict(
        max_model_len=8192, scheduler_block_size=block_size, hash_block_size=block_size, **kw
    )
    return VllmManager(config(num_blocks, block_size), **args), KVCacheManager(
        config(num_blocks, block_size), **args
    )


def ids(blocks: Any) -> Any:
    return None if blocks is None else blocks.get_block_ids()


def test_hit_allocate_free_against_vllm() -> None:
    bs = 4
    ref, kvi = managers(16, bs, enable_kv_cache_events=True, log_stats=True)
    prompt = list(range(14))
    for m in (ref, kvi):
        r = make_request("a", prompt, bs)
        blocks, n, _ = m.get_computed_blocks(r)
        assert n == 0
        new = m.allocate_slots(r, len(prompt), n, blocks)
        assert new is not None
        m.free(r)
    r_ref, r_kvi = make_request("b", prompt, bs), make_request("b", prompt, bs)
    (b1, n1, _), (b2, n2, _) = ref.get_computed_blocks(r_ref), kvi.get_computed_blocks(r_kvi)
    assert n1 == n2 == 12 and ids(b1) == ids(b2)
    assert ids(ref.allocate_slots(r_ref, 2, n1, b1)) == ids(kvi.allocate_slots(r_kvi, 2, n2, b2))
    assert ref.get_block_ids("b") == kvi.get_block_ids("b")
    assert [b.ref_cnt for b in kvi.get_blocks("b").blocks[0]] == [
        b.ref_cnt for b in ref.get_blocks("b").blocks[0]
    ]
    assert kvi.take_events() == ref.take_events()
    assert kvi.usage == ref.usage
    assert kvi.estimate_cached_tokens(r_kvi) == ref.estimate_cached_tokens(r_ref)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("caching", "events"), [(True, True), (True, False), (False, True)])
def test_random_differential(seed: int, caching: bool, events: bool) -> None:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    num_blocks = rng.randint(8, 80)
    kw = dict(enable_caching=caching, enable_kv_cache_events=events, use_eagle=rng.random() < 0.3)
    ref, kvi = managers(num_blocks, bs, **kw)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(0, 6 * bs))] for _ in range(3)]
    running: dict[str, tuple[Request, Request]] = {}
    deferred: list[tuple[list[Any], list[Any]]] = []
    next_id = 0
    for _step in range(300):
        op = rng.random()
        if op < 0.35 or not running:
            rid = f"r{next_id}"
            next_id += 1
            prompt = rng.choice(prefixes) + [
                rng.randrange(50) for _ in range(rng.randint(1, 5 * bs))
            ]
            pair = make_request(rid, prompt, bs), make_request(rid, prompt, bs)
            (b1, n1, _), (b2, n2, _) = (
                ref.get_computed_blocks(pair[0]),
                kvi.get_computed_blocks(pair[1]),
            )
            assert (ids(b1), n1) == (ids(b2), n2)
            rest = len(prompt) - n1
            # A KV connector may supply some tokens beyond the local hit (loaded
            # asynchronously when delay_cache: cached once the load lands).
            ext = rng.choice([0, 0, 0, rng.randint(0, rest - 1)])
            delay = ext > 0 and rng.random() < 0.5
            chunk = rng.randint(1, rest - ext)
            look = rng.choice([0, 0, 2])
            must_fit = rng.random() < 0.3
            reserved = rng.choice([0, 0, 2])
            out = []
            for m, r, b, n in ((ref, pair[0], b1, n1), (kvi, pair[1], b2, n2)):
                out.append(
                    ids(
                        m.allocate_slots(
                            r,
                            chunk,
                            n,
                            b,
                            num_lookahead_tokens=look,
                            num_external_computed_tokens=ext,
                            delay_cache_blocks=delay,
                            full_sequence_must_fit=must_fit,
                            reserved_blocks=reserved,
                        )
                    )
                )
            assert out[0] == out[1]
            if out[0] is not None:
                for m, r in zip((ref, kvi), pair, strict=True):
                    r.num_computed_tokens = n1 + ext + chunk
                    if delay:
                        m.cache_blocks(r, n1 + ext)
                running[rid] = pair
        elif op < 0.75:
            rid = rng.choice(sorted(running))
            pair = running[rid]
            r0 = pair[0]
            drafts = 0
            if r0.num_computed_tokens < r0.num_tokens:
                n = rng.randint(1, r0.num_tokens - r0.num_computed_tokens)
            else:
                tok = rng.randrange(50)
                for r in pair:
                    r.append_output_token_ids(tok)
                # Speculative decoding: drafts are scheduled (and get slots) but
                # are not cached until verified; here all are rejected.
                drafts = rng.choice([0, 0, 3])
                n = 1 + drafts
            look = rng.choice([0, 0, 2])
            out = [
                ids(m.allocate_slots(r, n, num_lookahead_tokens=look))
                for m, r in zip((ref, kvi), pair, strict=True)
            ]
            assert out[0] == out[1]
            if out[0] is not None:
                for r in pair:
                    r.num_computed_tokens += n - drafts
        elif op < 0.9:
            rid = rng.choice(sorted(running))
            pair = running.pop(rid)
            if rng.random() < 0.5:
                ref.free(pair[0])
                kvi.free(pair[1])
            else:
                popped = ref.pop_blocks_for_free(pair[0]), kvi.pop_blocks_for_free(pair[1])
                assert [b.block_id for b in popped[0]] == [b.block_id for b in popped[1]]
                deferred.append(popped)
        elif op < 0.95 and deferred:
            p0, p1 = deferred.pop(0)
            ref.block_pool.free_blocks(reversed(p0))
            kvi.block_pool.free_blocks(reversed(p1))
        else:
            victims = {rng.randrange(num_blocks) for _ in range(3)}
            ref.evict_blocks(victims)
            kvi.evict_blocks(victims)
        assert kvi.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
        assert [b.block_id for b in kvi.block_pool.free_block_queue.get_all_free_blocks()] == [
            b.block_id for b in ref.block_pool.free_block_queue.get_all_free_blocks()
        ]
        assert kvi.take_events() == ref.take_events()
    for pair in running.values():
        ref.free(pair[0])
        kvi.free(pair[1])
    for p0, p1 in deferred:
        ref.block_pool.free_blocks(reversed(p0))
        kvi.block_pool.free_blocks(reversed(p1))
    assert kvi.reset_prefix_cache() == ref.reset_prefix_cache()
    assert kvi.take_events() == ref.take_events()


def test_events_have_vllm_content() -> None:
    ref, kvi = managers(12, 2, enable_kv_cache_events=True)
    for m in (ref, kvi):
        r = make_request("e", [1, 2, 3, 4, 5], 2)
        m.allocate_slots(r, 5)
    ev_ref, ev_kvi = ref.take_events(), kvi.take_events()
    assert ev_kvi == ev_ref and isinstance(ev_kvi[0], BlockStored)
    assert ev_kvi[0].kv_cache_spec_kind == ev_ref[0].kv_cache_spec_kind


@pytest.mark.parametrize(
    ("cfg", "kw", "what"),
    [
        (
            config(10, 4, full_attention(4), replace(mamba(4), mamba_cache_mode="all")),
            {},
            "mamba_cache_mode 'align' and 'none'",
        ),
        (config(10, 4), {"dcp_world_size": 2}, "context parallelism"),
        (config(10, 4), {"hash_block_size": 2}, "hash_block_size"),
    ],
)
def test_unsupported_configs_raise_one_clear_error(
    cfg: KVCacheConfig, kw: dict[str, Any], what: str
) -> None:
    args: dict[str, Any] = dict(max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    args.update(kw)
    with pytest.raises(UnsupportedVllmConfigError, match=what) as info:
        KVCacheManager(cfg, **args)
    assert isinstance(info.value, KvIndexError)


def test_several_groups_get_the_hybrid_manager() -> None:
    args: dict[str, Any] = dict(max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    for cfg in (config(10, 4, full_attention(4), swa(4)), config(10, 4, swa(4))):
        m = KVCacheManager(cfg, **args)
        assert isinstance(m, HybridKVCacheManager)
        assert m.num_kv_cache_groups == len(cfg.kv_cache_groups)
    assert type(KVCacheManager(config(10, 4, full_attention(4)), **args)) is KVCacheManager


def test_blocks_are_read_only_views() -> None:
    _, kvi = managers(8, 2)
    block = kvi.block_pool.blocks[3]
    with pytest.raises(KvIndexError):
        block.ref_cnt = 5
    assert block.ref_cnt == 0 and block.block_hash is None
    assert kvi.block_pool.null_block.is_null


@pytest.mark.parametrize("hybrid", [False, True])
def test_hash_map_keys_pop_and_come_back_as_in_vllm(hybrid: bool) -> None:
    # vLLM's tests fake an eviction by removing a key from the pool's map and undo it by
    # assigning it back; a prompt-tail entry (full block 8 beside a window of 4) too.
    specs = (full_attention(8), swa(4)) if hybrid else ()
    args: dict[str, Any] = dict(
        max_model_len=256, scheduler_block_size=8, hash_block_size=4 if hybrid else 8
    )
    ref, kvi = (cls(config(40, 8, *specs), **args) for cls in (VllmManager, KVCacheManager))
    tokens = list(range(37))
    for m in (ref, kvi):
        # Prefill 37 tokens, decode to 40: the hybrid's tail entry (36) lands beside the
        # full hash of block 4 once 40 tokens are computed.
        r = make_request("a", tokens, 4 if hybrid else 8)
        m.allocate_slots(r, len(tokens))
        r.num_computed_tokens = len(tokens)
        r.append_output_token_ids([7, 7, 7])
        m.allocate_slots(r, 3)
        m.free(r)

    def maps() -> list[dict[bytes, Any]]:
        return [
            {k: sorted(v) if isinstance(v, dict) else v.block_id for k, v in x.items()}
            for x in (m.block_pool.cached_block_hash_to_block._cache for m in (ref, kvi))
        ]

    def hits() -> list[int]:
        bs = 4 if hybrid else 8
        return [m.get_computed_blocks(make_request("b", tokens, bs))[1] for m in (ref, kvi)]

    a, b = maps()
    assert a == b and len(a) > 2
    assert not hybrid or kvi._core.extra_keys()
    for key in a:  # every key, the prompt tail's partial-block entry included
        backups = [m.block_pool.cached_block_hash_to_block._cache.copy() for m in (ref, kvi)]
        for m in (ref, kvi):
            m.block_pool.cached_block_hash_to_block._cache.pop(key)
        x, y = maps()
        assert x == y and key not in y
        h = hits()
        assert h[0] == h[1]
        for m, backup in zip((ref, kvi), backups, strict=True):
            m.block_pool.cached_block_hash_to_block._cache[key] = backup[key]
        assert maps() == [a, b]
        h = hits()
        assert h[0] == h[1] > 0
        kvi._core.check_invariants()
    # Only what was removed can come back.
    with pytest.raises(UnsupportedVllmConfigError):
        kvi.block_pool.cached_block_hash_to_block._cache[b"x" * 36] = kvi.block_pool.blocks[1]
