"""Records vLLM 0.33's own KVCacheManager on synthetic multi-group KV cache configs.

Run with vLLM 0.33.0 installed (not part of the test suite; its output is committed as
``tests/data/vllm_hybrid_golden.json`` and replayed by
``tests/integrations/test_hybrid_golden.py`` without vLLM)::

    python tests/integrations/vllm/gen_hybrid_golden.py tests/data/vllm_hybrid_golden.json

Each scenario builds a real ``KVCacheManager`` over a ``KVCacheConfig`` whose groups are
full attention, sliding window, chunked local attention and Mamba (``mamba_cache_mode`` align)
specs, and drives it through seeded scheduler-like operations (admission with a prefix-cache
lookup and chunked prefill, prefill chunks, decode steps with lookahead slots, frees) on
prompts that share prefixes; before an operation a new scheduler step may start
(``new_step_starts``, recorded as ``"new_step"``, drawn from a second seeded stream).
Requests hash their tokens with vLLM's ``get_request_block_hasher`` (sha256) at the hash
block size. After every operation the file holds what vLLM returned (hit length and hit
block ids per group, new block ids per group or None), every live request's block table
and cached-block count per group, the free queue, and the KV events
(``BlockStored`` / ``BlockRemoved`` with their group, kind and window).
"""

from __future__ import annotations

import json
import math
import random
import sys
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

# (name, groups as (kind, block_size, window_or_chunk), num_blocks, use_eagle, max_model_len)
SCENARIOS: list[tuple[str, list[tuple[str, int, int]], int, bool, int]] = [
    ("full16_swa32", [("full_attention", 16, 0), ("sliding_window", 16, 32)], 48, False, 512),
    (
        "full8_swa5_swa24x16",
        [("full_attention", 8, 0), ("sliding_window", 8, 5), ("sliding_window", 16, 24)],
        64,
        False,
        512,
    ),
    (
        "full16_chunked64",
        [("full_attention", 16, 0), ("chunked_local_attention", 16, 64)],
        48,
        False,
        512,
    ),
    ("swa_only16x4", [("sliding_window", 4, 16)], 40, False, 512),
    ("full16_swa32_eagle", [("full_attention", 16, 0), ("sliding_window", 16, 32)], 48, True, 512),
    (
        "full4_swa9_full4_swa9",
        [
            ("full_attention", 4, 0),
            ("sliding_window", 4, 9),
            ("full_attention", 4, 0),
            ("sliding_window", 4, 9),
        ],
        80,
        False,
        256,
    ),
    ("full16_mamba16", [("full_attention", 16, 0), ("mamba", 16, 0)], 48, False, 512),
    ("swa32_mamba16", [("sliding_window", 16, 32), ("mamba", 16, 0)], 48, False, 512),
    (
        "full8_swa20x16_mamba8",
        [("full_attention", 8, 0), ("sliding_window", 16, 20), ("mamba", 8, 0)],
        64,
        False,
        512,
    ),
    (
        "full4_mamba4_full4_mamba4",
        [("full_attention", 4, 0), ("mamba", 4, 0), ("full_attention", 4, 0), ("mamba", 4, 0)],
        80,
        False,
        256,
    ),
]
#: Scenarios with a retention interval or KV cache zeroing: (name, groups, num_blocks,
#: use_eagle, max_model_len, prefix_cache_retention_interval, zeroing). Zeroing comes from
#: a mixed-precision cache (the groups after the first in float32), as vLLM decides it.
EXTRA_SCENARIOS: list[tuple[str, list[tuple[str, int, int]], int, bool, int, int | None, bool]] = [
    ("swa_only8_ret32", [("sliding_window", 8, 8)], 48, False, 512, 32, False),
    (
        "full8_swa8_ret0",
        [("full_attention", 8, 0), ("sliding_window", 8, 8)],
        64,
        False,
        512,
        0,
        False,
    ),
    (
        "full4_swa8x6_ret32_eagle",
        [("full_attention", 4, 0), ("sliding_window", 8, 6)],
        80,
        True,
        512,
        32,
        False,
    ),
    (
        "full16_swa32_zero",
        [("full_attention", 16, 0), ("sliding_window", 16, 32)],
        48,
        False,
        512,
        None,
        True,
    ),
    (
        "full8_swa8_swa16x20_ret48_zero",
        [("full_attention", 8, 0), ("sliding_window", 8, 8), ("sliding_window", 16, 20)],
        72,
        False,
        512,
        48,
        True,
    ),
    # A full-attention block larger than the hash block: prompt tails' partial entries.
    (
        "full16_swa8x24_tails",
        [("full_attention", 16, 0), ("sliding_window", 8, 24)],
        64,
        False,
        512,
        None,
        False,
    ),
    (
        "full16_swa4x9_tails_eagle",
        [("full_attention", 16, 0), ("sliding_window", 4, 9)],
        96,
        True,
        512,
        None,
        False,
    ),
]
OPS_PER_SCENARIO = 120


def _spec(kind: str, bs: int, size: int, dtype: torch.dtype = torch.float16) -> Any:
    if kind == "mamba":
        return MambaSpec(
            block_size=bs, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
        )
    common: dict[str, Any] = {
        "block_size": bs,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": dtype,
    }
    if kind == "full_attention":
        return FullAttentionSpec(**common)
    if kind == "sliding_window":
        return SlidingWindowSpec(**common, sliding_window=size)
    return ChunkedLocalAttentionSpec(**common, attention_chunk_size=size)


def _h(h: Any) -> int:
    """An event hash as vLLM reports it by default: the low 64 bits of the digest."""
    if isinstance(h, int):
        return h
    return int.from_bytes(bytes(h), "big") & ((1 << 64) - 1)


def _events(mgr: KVCacheManager) -> list[list[Any]]:
    out: list[list[Any]] = []
    for e in mgr.take_events():
        name = type(e).__name__
        if name == "BlockStored":
            out.append(
                [
                    "stored",
                    e.group_idx,
                    [_h(h) for h in e.block_hashes],
                    None if e.parent_block_hash is None else _h(e.parent_block_hash),
                    e.block_size,
                    e.kv_cache_spec_kind,
                    e.kv_cache_spec_sliding_window,
                ]
            )
        elif name == "BlockRemoved":
            out.append(["removed", e.group_idx, [_h(h) for h in e.block_hashes]])
        else:
            out.append([name])
    return out


def _scenario(
    name: str,
    groups: list[tuple[str, int, int]],
    num_blocks: int,
    eagle: bool,
    mml: int,
    seed: int,
    retention: int | None = None,
    zeroing: bool = False,
) -> dict[str, Any]:
    rng = random.Random(seed)
    step_rng = random.Random(seed + 1000)
    sizes = [g[1] for g in groups]
    sched = math.lcm(*sizes)
    hbs = math.gcd(*sizes) if len(groups) > 1 else sizes[0]
    # Full-attention groups larger than the hash block register prompt tails: the replay
    # gives the caching step the prompt length, as with a retention interval.
    tails = any(k == "full_attention" and bs > hbs for k, bs, _ in groups)
    dtypes = [torch.float32 if zeroing and i > 0 else torch.float16 for i in range(len(groups))]
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"layer{i}"], _spec(*g, dtype=dtypes[i]))
            for i, g in enumerate(groups)
        ],
        prefix_cache_retention_interval=retention,
    )
    assert config.needs_kv_cache_zeroing or not zeroing
    zeroing = config.needs_kv_cache_zeroing  # Mamba groups make vLLM zero attention blocks
    mgr = KVCacheManager(
        config,
        max_model_len=mml,
        scheduler_block_size=sched,
        hash_block_size=hbs,
        enable_caching=True,
        use_eagle=eagle,
        enable_kv_cache_events=True,
    )
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hbs, hash_fn)
    families = [[rng.randrange(1000) for _ in range(rng.randrange(40, 160))] for _ in range(4)]
    running: dict[str, Request] = {}
    requests: dict[str, Request] = {}
    all_hashes: dict[str, list[str]] = {}
    ops: list[dict[str, Any]] = []
    next_id = 0

    def record(op: dict[str, Any]) -> None:
        op["tables"] = {
            rid: [[b.block_id for b in blocks] for blocks in mgr.coordinator.get_blocks(rid)]
            for rid in running
        }
        op["num_cached"] = {
            rid: [m.num_cached_block.get(rid) for m in mgr.coordinator.single_type_managers]
            for rid in running
        }
        op["free_queue"] = [
            b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()
        ]
        op["events"] = _events(mgr)
        if zeroing:
            op["new_block_ids"] = mgr.take_new_block_ids()
        rid = op.get("rid")
        if (retention is not None or tails) and rid in requests:
            op["num_prompt_tokens"] = requests[rid].num_prompt_tokens
            op["shared_prefix_boundary"] = requests[rid].shared_prefix_boundary
        ops.append(op)

    for _ in range(OPS_PER_SCENARIO):
        new_step = step_rng.random() < 0.5
        if new_step:
            mgr.new_step_starts()

        def snapshot(op: dict[str, Any], new_step: bool = new_step) -> None:
            if new_step:
                op["new_step"] = True
            record(op)

        r = rng.random()
        if (r < 0.3 or not running) and len(running) < 6:
            fam = rng.choice(families)
            cut = rng.randrange(len(fam) // 2, len(fam) + 1)
            tokens = fam[:cut] + [rng.randrange(1000) for _ in range(rng.randrange(0, 24))]
            rid = f"r{next_id}"
            next_id += 1
            req = Request(rid, tokens, SamplingParams(max_tokens=64), None, block_hasher=hasher)
            blocks, hit, boundary = mgr.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary  # as the scheduler sets it
            requests[rid] = req
            hit_ids = [[b.block_id for b in g] for g in blocks.blocks]
            chunk = min(len(tokens) - hit, rng.randrange(8, 96))
            op: dict[str, Any] = {
                "op": "admit",
                "rid": rid,
                "num_tokens": req.num_tokens,
                "num_computed": req.num_computed_tokens,
                "hit": hit,
                "hit_blocks": hit_ids,
                "num_new": chunk,
                "lookahead": 0,
            }
            new = mgr.allocate_slots(req, chunk, hit, blocks)
            op["new"] = None if new is None else [[b.block_id for b in g] for g in new.blocks]
            op["num_hashes"] = len(req.block_hashes)
            all_hashes[rid] = [bytes(h).hex() for h in req.block_hashes]
            if new is not None:
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = hit + chunk
                running[rid] = req
                if req.num_computed_tokens == req.num_tokens:
                    req.append_output_token_ids(rng.randrange(1000))
                    all_hashes[rid] = [bytes(h).hex() for h in req.block_hashes]
            snapshot(op)
        elif r < 0.85:
            rid = rng.choice(sorted(running))
            req = running[rid]
            remaining = req.num_tokens - req.num_computed_tokens
            n = min(remaining, rng.randrange(4, 64)) if remaining > 1 else 1
            la = rng.randrange(0, 3) if remaining <= 1 else 0
            op = {
                "op": "step",
                "rid": rid,
                "num_tokens": req.num_tokens,
                "num_computed": req.num_computed_tokens,
                "num_new": n,
                "lookahead": la,
                "num_hashes": len(req.block_hashes),
            }
            if req.num_tokens + la >= mml:
                op = {"op": "free", "rid": rid}
                mgr.free(req)
                del running[rid]
                snapshot(op)
                continue
            new = mgr.allocate_slots(req, n, num_lookahead_tokens=la)
            op["new"] = None if new is None else [[b.block_id for b in g] for g in new.blocks]
            if new is not None:
                req.num_computed_tokens += n
                if req.num_computed_tokens == req.num_tokens:
                    req.append_output_token_ids(rng.randrange(1000))
                    all_hashes[rid] = [bytes(h).hex() for h in req.block_hashes]
            snapshot(op)
        else:
            rid = rng.choice(sorted(running))
            mgr.free(running.pop(rid))
            snapshot({"op": "free", "rid": rid})
    return {
        "name": name,
        "groups": [list(g) for g in groups],
        "num_blocks": num_blocks,
        "use_eagle": eagle,
        "max_model_len": mml,
        "scheduler_block_size": sched,
        "hash_block_size": hbs,
        "hashes": all_hashes,
        "ops": ops,
        "retention_interval": retention,
        "zeroing": zeroing,
    }


def main() -> None:
    out = {
        "vllm_version": "0.33.0",
        "generator": "tests/integrations/vllm/gen_hybrid_golden.py",
        "seed": 0,
        "scenarios": [_scenario(*s, seed=i) for i, s in enumerate(SCENARIOS)]
        + [
            _scenario(*s[:5], seed=len(SCENARIOS) + i, retention=s[5], zeroing=s[6])
            for i, s in enumerate(EXTRA_SCENARIOS)
        ],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
