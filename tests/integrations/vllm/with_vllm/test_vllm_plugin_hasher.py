"""The ``KVINDEX_VLLM=1`` plugin puts kvindex's request block hasher into vLLM's engine.

``EngineCore.__init__`` builds the hasher by calling the name ``get_request_block_hasher``
of ``vllm.v1.engine.core`` with the hash block size, the hash function of
``--prefix-caching-hash-algo`` and the lookahead token count. After the plugin has loaded,
that factory returns kvindex's native hasher for each of vLLM's four algorithms, and its
hashes equal vLLM's own on requests with cache salts, LoRA adapters and multimodal items;
``KVINDEX_VLLM_HASHER=vllm`` keeps vLLM's factory."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    import vllm.v1.engine.core as engine_core_module
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched import scheduler as scheduler_module
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

from kvindex._core import VllmRequestHasher
from kvindex.exceptions import InvalidArgumentError
from kvindex.integrations.vllm import plugin
from kvindex.integrations.vllm.manager import KVCacheManager

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
VLLM_FACTORY = kv_cache_utils.get_request_block_hasher


@pytest.fixture(autouse=True)
def _restore(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever the plugin patches is put back after each test."""
    monkeypatch.setattr(engine_core_module, "get_request_block_hasher", VLLM_FACTORY)
    monkeypatch.setattr(scheduler_module, "KVCacheManager", scheduler_module.KVCacheManager)
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    monkeypatch.delenv(plugin.HASHER_ENV_VAR, raising=False)
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    yield
    if saved is not None:
        kv_cache_utils.NONE_HASH = saved


def engine_hasher(block_size: int, algo: str, lookahead: int = 0) -> Any:
    """What ``EngineCore.__init__`` does to get its ``request_block_hasher``."""
    caching_hash_fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(caching_hash_fn)
    return engine_core_module.get_request_block_hasher(block_size, caching_hash_fn, lookahead)


def requests(hasher: Any, tag: str) -> list[Request]:
    """Requests exercising every extra key: plain, cache salt, LoRA, images, all three."""

    def image(ident: str, offset: int, length: int) -> MultiModalFeatureSpec:
        return MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=ident,
            mm_position=PlaceholderRange(offset=offset, length=length),
        )

    lora = LoRARequest("sql-lora", 3, "/mnt/loras/sql")
    cases: list[dict[str, Any]] = [
        {},
        {"cache_salt": "tenant-7"},
        {"lora_request": lora},
        {"mm_features": [image("img-a", 5, 20), image("img-b", 40, 7)]},
        {"cache_salt": "é" * 40, "lora_request": lora, "mm_features": [image("img-c", 0, 33)]},
    ]
    out = []
    for i, kw in enumerate(cases):
        prompt = [(i * 7919 + t * 104_729) % 151_936 for t in range(61 + 9 * i)]
        out.append(
            Request(
                request_id=f"{tag}{i}",
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(max_tokens=64),
                pooling_params=None,
                block_hasher=hasher,
                **kw,
            )
        )
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_engine_factory_returns_kvindexs_hasher_with_vllms_hashes(algo: str) -> None:
    plugin.register()
    assert engine_core_module.get_request_block_hasher is plugin.request_block_hasher
    assert scheduler_module.KVCacheManager is KVCacheManager
    ours = engine_hasher(16, algo)
    assert isinstance(ours, VllmRequestHasher)
    ref = VLLM_FACTORY(16, get_hash_fn_by_name(algo))
    got_reqs, ref_reqs = requests(ours, "k"), requests(ref, "v")
    for got, want in zip(got_reqs, ref_reqs, strict=True):
        assert got.block_hashes == want.block_hashes and len(want.block_hashes) >= 3
        for step in range(40):  # decode: the engine hashes again after each output token
            got.append_output_token_ids(1000 + step)
            want.append_output_token_ids(1000 + step)
            assert got.block_hashes == want.block_hashes
    assert ours.fallback_calls == 0  # every request stayed on the native path


def test_lookahead_hashing_keeps_vllms_hasher() -> None:
    plugin.register()
    h = engine_hasher(4, "sha256", 2)
    assert not isinstance(h, VllmRequestHasher)
    ref = VLLM_FACTORY(4, get_hash_fn_by_name("sha256"), 2)
    got, want = requests(h, "k")[1], requests(ref, "v")[1]
    assert got.block_hashes == want.block_hashes and got.block_hashes


def test_unknown_hash_function_keeps_vllms_hasher() -> None:
    plugin.register()

    def my_hash(data: Any) -> bytes:  # not one of vLLM's four
        return get_hash_fn_by_name("sha256")(data)

    assert not isinstance(
        engine_core_module.get_request_block_hasher(16, my_hash), VllmRequestHasher
    )


@pytest.mark.parametrize("value", ["vllm", "VLLM", " vllm "])
def test_env_switch_keeps_vllms_hasher(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(plugin.HASHER_ENV_VAR, value)
    plugin.register()
    assert scheduler_module.KVCacheManager is KVCacheManager  # the manager is still swapped
    assert engine_core_module.get_request_block_hasher is VLLM_FACTORY
    assert not isinstance(engine_hasher(16, "sha256"), VllmRequestHasher)


def test_env_switch_typo_is_an_error_and_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.HASHER_ENV_VAR, "vlm")
    with pytest.raises(InvalidArgumentError, match=plugin.HASHER_ENV_VAR):
        plugin.register()
    assert engine_core_module.get_request_block_hasher is VLLM_FACTORY
    assert scheduler_module.KVCacheManager is not KVCacheManager


def test_plugin_off_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, "0")
    plugin.register()
    assert engine_core_module.get_request_block_hasher is VLLM_FACTORY
    assert scheduler_module.KVCacheManager is not KVCacheManager


MODEL = str(Path(__file__).resolve().parent.parent / "models" / "facebook" / "opt-125m")


class _NoModelExecutor:
    """An executor with no model: ``EngineCore.__init__`` reads nothing else of it here
    (the KV cache sizing that would ask the workers is replaced in the test)."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config


@pytest.mark.parametrize("algo", ALGOS)
def test_engine_core_started_with_the_plugin_hashes_with_kvindex(
    monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    """vLLM's own ``EngineCore.__init__`` (its ``load_general_plugins`` finding kvindex's
    entry point) builds kvindex's manager and kvindex's hasher; requests it preprocesses
    carry vLLM's hashes and get prefix hits."""
    import vllm.plugins
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine import EngineCoreRequest

    block = 16
    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float16)
    kv_cache_config = KVCacheConfig(
        num_blocks=128, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l.0"], spec)]
    )

    def initialize_kv_caches(self: Any, vllm_config: Any) -> KVCacheConfig:
        register_all_kvcache_specs(vllm_config)
        vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        return kv_cache_config

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)  # load them again, for real
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(
        engine_core_module.EngineCore, "_initialize_kv_caches", initialize_kv_caches
    )
    # Process-wide start-up effects (GC freezing, the env-variable cache) are left out.
    for name in ("freeze_gc_heap", "maybe_attach_gc_debug_callback", "enable_envs_cache"):
        monkeypatch.setattr(engine_core_module, name, lambda: None)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", MODEL, "--block-size", str(block), "--enable-prefix-caching",
         "--prefix-caching-hash-algo", algo]
    )  # fmt: skip
    vllm_config = EngineArgs.from_cli_args(args).create_engine_config()
    engine = engine_core_module.EngineCore(vllm_config, _NoModelExecutor, log_stats=True)

    assert type(engine.scheduler.kv_cache_manager) is KVCacheManager
    assert isinstance(engine.request_block_hasher, VllmRequestHasher)
    ref_hasher = VLLM_FACTORY(block, get_hash_fn_by_name(algo))
    lora = LoRARequest("sql-lora", 3, "/mnt/loras/sql")
    prompt = [(t * 104_729) % 50_000 for t in range(5 * block + 3)]
    for i, (salt, lora_req) in enumerate([(None, None), ("tenant-7", None), ("t", lora)]):
        params = SamplingParams(max_tokens=4)
        params.update_from_generation_config({}, 2)
        core_req = EngineCoreRequest(
            request_id=f"r{i}",
            prompt_token_ids=list(prompt),
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=0.0,
            lora_request=lora_req,
            cache_salt=salt,
            data_parallel_rank=None,
        )
        req, _ = engine.preprocess_add_request(core_req)
        ref = Request(
            f"v{i}", list(prompt), params, None, lora_request=lora_req, cache_salt=salt,
            block_hasher=ref_hasher,
        )  # fmt: skip
        assert req.block_hashes == ref.block_hashes and len(req.block_hashes) == 5
    # The manager finds what the hasher hashed: a second request with the first's prompt
    # hits its five full blocks once the first has been cached.
    manager = engine.scheduler.kv_cache_manager
    first, _ = engine.preprocess_add_request(
        EngineCoreRequest("a", list(prompt), None, params, None, 0.0, None, None, None)
    )
    hit, n, _ = manager.get_computed_blocks(first)
    assert n == 0
    assert manager.allocate_slots(first, len(prompt), 0, hit) is not None
    second, _ = engine.preprocess_add_request(
        EngineCoreRequest("b", list(prompt), None, params, None, 0.0, None, None, None)
    )
    assert manager.get_computed_blocks(second)[1] == 5 * block
