"""Manager-level cost: vLLM 0.33's ``KVCacheManager`` against kvindex's drop-in, same calls.

Needs vLLM 0.33 (run it with the vLLM test environment's interpreter). Each manager gets
the same requests: prompts of 1-4K tokens behind 1, 2 or 4K-token shared system prompts
(block 16, sha256 block hashes, prefix caching on). It times, per request, admission
(``get_computed_blocks`` + ``allocate_slots``), then ``steps`` decode steps of
``allocate_slots(request, 1)`` per running request (the call vLLM's scheduler makes for
every running request, every step; the token appends and their hashing are outside the
timed calls), ``estimate_cached_tokens`` and ``free``. Both managers run twice,
interleaved; the best of the two runs is printed. Fails unless both found the same hits.

    python benches/bench_vllm_manager.py --requests 1024 --steps 30
    python benches/bench_vllm_manager.py --requests 512 --steps 30 --mamba 64

``--mamba B`` adds an align-mode Mamba group of block ``B`` (scheduler block ``B``): with
``B`` above the hash block (16) vLLM turns on partial hash hits (hits inside blocks,
copied on write). Admission then stops at the prompt's last hash boundary first (as
vLLM's scheduler splits a Mamba prefill), every fourth request continues an earlier one,
and the pool is twice as large.
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from typing import Any

warnings.simplefilter("ignore", DeprecationWarning)

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_manager as vllm_manager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from kvindex.integrations.vllm.manager import KVCacheManager  # noqa: E402

BLOCK = 16


def config(num_blocks: int, mamba: int) -> Any:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["layer"], spec)]
    if mamba:
        state = MambaSpec(
            block_size=mamba, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
        )
        groups.append(KVCacheGroupSpec(["state"], state))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def run(cls: Any, prompts: list[list[int]], steps: int, mamba: int) -> tuple[list[float], int]:
    num_blocks = sum(len(p) // BLOCK + 2 + steps // BLOCK + 1 for p in prompts) + 8
    m = cls(
        config(num_blocks * (2 if mamba else 1), mamba),
        max_model_len=1 << 20,
        scheduler_block_size=mamba or BLOCK,
        hash_block_size=BLOCK,
        enable_caching=True,
    )
    hasher = get_request_block_hasher(BLOCK, sha256)
    reqs = []
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=1 << 20)
        params.update_from_generation_config({}, eos_token_id=100)
        reqs.append(Request(f"r{i}", p, params, None, block_hasher=hasher))
    pc = time.perf_counter
    hits = 0
    t0 = pc()
    for r in reqs:
        if mamba:
            # One scheduler step per admission: its copies ran, the states it cached hit.
            _, retained = m.take_kv_cache_block_copies()
            m.block_pool.free_blocks(retained)
            m.new_step_starts()
        blocks, n, _ = m.get_computed_blocks(r)
        tail = (r.num_tokens - 1) // BLOCK * BLOCK
        if mamba and n < tail:
            # vLLM's scheduler stops a Mamba prefill at the prompt's last hash boundary.
            if m.allocate_slots(r, tail - n, n, blocks) is None:
                raise SystemExit("admission refused: the pool is sized to fit")
            r.num_computed_tokens = tail
            n, blocks = tail, None
        if m.allocate_slots(r, r.num_tokens - n, 0 if blocks is None else n, blocks) is None:
            raise SystemExit("admission refused: the pool is sized to fit")
        r.num_computed_tokens = r.num_tokens
        r.status = RequestStatus.RUNNING
        hits += n
    admit = pc() - t0
    decode = 0.0
    for _ in range(steps):
        for r in reqs:
            r.append_output_token_ids(7)
            a = pc()
            out = m.allocate_slots(r, 1)
            decode += pc() - a
            if out is None:
                raise SystemExit("decode refused: the pool is sized to fit")
            r.num_computed_tokens += 1
    a = pc()
    for r in reqs:
        m.estimate_cached_tokens(r)
    estimate = pc() - a
    a = pc()
    for r in reqs:
        m.free(r)
    free = pc() - a
    n = len(reqs)
    return [admit / n * 1e6, decode / (n * steps) * 1e6, estimate / n * 1e6, free / n * 1e6], hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mamba", type=int, default=0, help="Mamba block size (0: none)")
    args = ap.parse_args()
    init_none_hash(sha256)
    rng = random.Random(0)
    systems = [
        [rng.randrange(30000) for _ in range(rng.choice([1024, 2048, 4096]))] for _ in range(8)
    ]
    prompts = [
        rng.choice(systems) + [rng.randrange(30000) for _ in range(rng.randint(1000, 4000))]
        for _ in range(args.requests)
    ]
    if args.mamba:
        # Every fourth request continues an earlier one (a next turn): Mamba hits its
        # prompt tail, inside a state block.
        for i in range(3, len(prompts), 4):
            prompts[i] = prompts[i - 3] + [rng.randrange(30000) for _ in range(100)]
    best: dict[str, list[float]] = {}
    hits: dict[str, int] = {}
    for name, cls in (("vllm", vllm_manager.KVCacheManager), ("kvindex", KVCacheManager)) * 2:
        t, h = run(cls, prompts, args.steps, args.mamba)
        best[name] = [min(x, y) for x, y in zip(best.get(name, t), t, strict=True)]
        hits[name] = h
    if hits["vllm"] != hits["kvindex"]:
        raise SystemExit(f"different work: hits {hits}")
    layout = f", Mamba block {args.mamba}" if args.mamba else ""
    print(
        f"{args.requests} requests, {args.steps} decode steps{layout}, "
        f"{hits['vllm']} hit tokens (both)"
    )
    print(f"{'us per call':12s} {'admit':>9s} {'decode':>8s} {'estimate':>9s} {'free':>8s}")
    for name, t in best.items():
        print(f"{name:12s} {t[0]:9.1f} {t[1]:8.2f} {t[2]:9.2f} {t[3]:8.1f}")
    v, k = best["vllm"], best["kvindex"]
    ratios = " ".join(f"{x / y:8.1f}x" for x, y in zip(v, k, strict=True))
    print(f"{'speed-up':12s} {ratios}")


if __name__ == "__main__":
    main()
