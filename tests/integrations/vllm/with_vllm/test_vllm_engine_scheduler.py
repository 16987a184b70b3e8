"""vLLM's engine-level start-up with kvindex: ``--scheduler-cls
kvindex.integrations.vllm.AsyncScheduler`` (and ``.Scheduler``) parsed as ``vllm serve``
parses it, resolved and constructed from the ``VllmConfig`` the way vLLM's ``EngineCore``
does, then driven for a few steps; and the ``KVINDEX_VLLM=1`` plugin path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched import scheduler as vllm_scheduler_module
from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import kvindex.integrations.vllm as kv_vllm
from kvindex.integrations.vllm import plugin
from kvindex.integrations.vllm.manager import KVCacheManager

BLOCK = 16
NUM_BLOCKS = 256
# A local model folder (config.json only), as `vllm serve /path/to/model` takes it.
MODEL = str(Path(__file__).resolve().parent.parent / "models" / "facebook" / "opt-125m")


def engine_config(*cli: str) -> Any:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", MODEL, "--block-size", str(BLOCK), *cli])
    return EngineArgs.from_cli_args(args).create_engine_config()


def build_scheduler(vllm_config: Any) -> Any:
    """What ``EngineCore.__init__`` does once the KV cache is sized."""
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    register_all_kvcache_specs(vllm_config)
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=True,
        block_size=BLOCK,
        hash_block_size=BLOCK,
    )


def make_request(rid: str, prompt: list[int]) -> Request:
    init_none_hash(sha256)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    params.update_from_generation_config({}, 2)
    return Request(rid, prompt, params, None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def run_to_completion(scheduler: Any, requests: list[Request]) -> dict[str, int]:
    """Steps with a mocked model output until every request finished; the computed
    (prefix-hit) token count each request was first scheduled with."""
    for r in requests:
        scheduler.add_request(r)
    first_computed: dict[str, int] = {}
    for _ in range(100):
        if not scheduler.has_requests():
            break
        out = scheduler.schedule()
        for new in out.scheduled_new_reqs:
            first_computed[new.req_id] = new.num_computed_tokens
        ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        scheduler.update_from_output(out, runner)
    assert not scheduler.has_requests()
    return first_computed


@pytest.fixture()
def shared_prompt() -> Iterator[list[int]]:
    yield list(range(100, 100 + 5 * BLOCK))


@pytest.mark.parametrize(
    ("qualname", "vllm_base"),
    [
        ("kvindex.integrations.vllm.AsyncScheduler", VllmAsyncScheduler),
        ("kvindex.integrations.vllm.Scheduler", VllmScheduler),
    ],
)
def test_scheduler_cls_from_the_command_line_runs_on_kvindex(
    qualname: str, vllm_base: type, shared_prompt: list[int]
) -> None:
    cli = ["--scheduler-cls", qualname, "--enable-prefix-caching"]
    if vllm_base is VllmAsyncScheduler:
        cli.append("--async-scheduling")
    vllm_config = engine_config(*cli)
    scheduler = build_scheduler(vllm_config)
    assert type(scheduler) is getattr(kv_vllm, qualname.rsplit(".", 1)[1])
    assert isinstance(scheduler, vllm_base)
    assert type(scheduler.kv_cache_manager) is KVCacheManager
    # Only the manager is swapped: a stock scheduler built next to it keeps vLLM's.
    assert vllm_scheduler_module.KVCacheManager is not KVCacheManager

    first = run_to_completion(scheduler, [make_request("a", shared_prompt + [1, 2, 3])])
    assert first == {"a": 0}
    # The second request shares the first's five full blocks: a prefix hit on kvindex.
    second = run_to_completion(scheduler, [make_request("b", shared_prompt + [4, 5])])
    assert second == {"b": 5 * BLOCK}
    assert scheduler.kv_cache_manager.usage == 0.0


def test_stock_scheduler_keeps_vllms_manager_without_the_plugin() -> None:
    scheduler = build_scheduler(engine_config())
    assert type(scheduler) is VllmScheduler or type(scheduler) is VllmAsyncScheduler
    assert type(scheduler.kv_cache_manager) is not KVCacheManager


def test_plugin_swaps_the_manager_of_every_scheduler(
    monkeypatch: pytest.MonkeyPatch, shared_prompt: list[int]
) -> None:
    import vllm.v1.engine.core as engine_core_module

    stock = vllm_scheduler_module.KVCacheManager
    monkeypatch.setattr(vllm_scheduler_module, "KVCacheManager", stock)  # undone after the test
    # The plugin also installs kvindex's request block hasher in the engine: undone too.
    hasher_factory = engine_core_module.get_request_block_hasher
    monkeypatch.setattr(engine_core_module, "get_request_block_hasher", hasher_factory)
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    plugin.register()
    plugin.register()  # vLLM may call it more than once
    assert vllm_scheduler_module.KVCacheManager is KVCacheManager
    scheduler = build_scheduler(engine_config("--enable-prefix-caching"))
    assert type(scheduler.kv_cache_manager) is KVCacheManager
    run_to_completion(scheduler, [make_request("a", shared_prompt)])
    assert run_to_completion(scheduler, [make_request("b", shared_prompt + [9])]) == {
        "b": 5 * BLOCK
    }


def test_the_entry_point_is_the_plugin_vllm_loads() -> None:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    assert DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    loaded = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert loaded.get("kvindex") is plugin.register
