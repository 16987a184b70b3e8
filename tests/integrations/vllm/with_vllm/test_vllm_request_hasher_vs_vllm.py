"""kvindex's native request block hasher against vLLM's own, on random requests (needs vLLM).

Each case builds two ``vllm.v1.request.Request`` objects from the same inputs, one hashed
by vLLM 0.33's ``get_request_block_hasher`` and one by
``kvindex.integrations.vllm.hashing.make_request_block_hasher``, then appends output
tokens in random runs (as the engine does after each step) and compares
``block_hashes`` after every append. Inputs: all four algorithms, block sizes 1-16, token
ids across int64 (negative and past 2**31 too), cache salts (empty too), LoRA adapters,
multimodal items (several per block, spanning blocks, repeated identifiers, one shared
string object, unsorted and empty placements that go to vLLM's own hasher).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

# Importing vLLM warns (deprecations in torch and vLLM); the suite turns warnings into errors.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("vllm")
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

from kvindex.integrations.vllm.hashing import make_request_block_hasher

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


@pytest.fixture(autouse=True)
def _restore_none_hash() -> Iterator[None]:
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    yield
    if saved is not None:
        kv_cache_utils.NONE_HASH = saved


def fresh(s: str) -> str:
    """A new str object equal to ``s`` (vLLM's engine gets each string deserialized)."""
    return "".join(list(s))


def random_token(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.9:
        return rng.randrange(151_936)
    if r < 0.95:
        return rng.randrange(256)
    return rng.choice([-1, -(2**31), 2**31, 2**40 + 3, -(2**63), 2**63 - 1, 65_535, 65_536])


def random_case(rng: random.Random) -> dict[str, Any]:
    bs = rng.choice([1, 2, 3, 4, 5, 8, 16, 16, 16])
    n = rng.randrange(0, 12 * bs + 1)
    tokens = [random_token(rng) for _ in range(n)]
    salt = rng.choice([None, None, "", "tenant-" + str(rng.randrange(100)), "é" * 130])
    lora = None
    if rng.random() < 0.3:
        name = rng.choice(["sql-lora", "x" * 300, "ad"])
        lora = LoRARequest(fresh(name), rng.randrange(1, 9), fresh("/mnt/loras/" + name[:8]))
    feats: list[MultiModalFeatureSpec] = []
    if rng.random() < 0.4 and n > 0:
        pos = 0
        shared = fresh("img-shared")
        while pos < n + bs and len(feats) < 6:
            pos += rng.randrange(0, 2 * bs + 1)
            length = rng.randrange(1, 3 * bs + 1)
            ident = rng.choice(["img-a", "img-b", "img-" + str(rng.randrange(1000))])
            ident = shared if rng.random() < 0.1 else fresh(ident)
            feats.append(
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=ident,
                    mm_position=PlaceholderRange(offset=pos, length=length),
                )
            )
            pos += length
        if rng.random() < 0.1 and len(feats) > 1:
            feats.reverse()
    outputs = [random_token(rng) for _ in range(rng.randrange(0, 6 * bs + 1))]
    return {"bs": bs, "tokens": tokens, "salt": salt, "lora": lora, "mm": feats, "out": outputs}


def make_request(c: dict[str, Any], hasher: Any, rid: str) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=list(c["tokens"]),
        sampling_params=SamplingParams(max_tokens=10_000),
        pooling_params=None,
        mm_features=list(c["mm"]) or None,
        lora_request=c["lora"],
        cache_salt=c["salt"],
        block_hasher=hasher,
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_random_requests_match_vllm(algo: str) -> None:
    hash_fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(hash_fn)
    rng = random.Random(f"vllm-request-hasher-{algo}")
    native_calls = 0
    for i in range(300):
        c = random_case(rng)
        ref_hasher = kv_cache_utils.get_request_block_hasher(c["bs"], hash_fn)
        ours = make_request_block_hasher(c["bs"], algo)
        ref = make_request(c, ref_hasher, f"r{i}")
        got = make_request(c, ours, f"k{i}")
        assert got.block_hashes == ref.block_hashes, (i, c)
        out = c["out"]
        k = 0
        while k < len(out):
            run = out[k : k + rng.randrange(1, 2 * c["bs"] + 2)]
            k += len(run)
            ref.append_output_token_ids(run if len(run) > 1 else run[0])
            got.append_output_token_ids(run if len(run) > 1 else run[0])
            assert got.block_hashes == ref.block_hashes, (i, k, c)
        native_calls += 1 if ours.fallback_calls == 0 else 0  # type: ignore[attr-defined]
    # Most requests never leave the native path (the fallback is the exception).
    assert native_calls >= 200


def test_engine_hash_function_object_is_accepted() -> None:
    hash_fn = get_hash_fn_by_name("sha256_cbor")
    kv_cache_utils.init_none_hash(hash_fn)
    c = {"bs": 4, "tokens": list(range(19)), "salt": "s1", "lora": None, "mm": [], "out": []}
    ref = make_request(c, kv_cache_utils.get_request_block_hasher(4, hash_fn), "a")
    got = make_request(c, make_request_block_hasher(4, hash_fn), "b")
    assert got.block_hashes == ref.block_hashes and len(got.block_hashes) == 4


def test_lookahead_hashing_is_vllms_own() -> None:
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    h = make_request_block_hasher(4, "sha256", 2)
    c = {"bs": 4, "tokens": list(range(23)), "salt": None, "lora": None, "mm": [], "out": []}
    ref = make_request(c, kv_cache_utils.get_request_block_hasher(4, hash_fn, 2), "a")
    assert make_request(c, h, "b").block_hashes == ref.block_hashes
