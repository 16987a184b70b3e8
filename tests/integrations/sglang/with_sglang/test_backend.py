"""kvindex's backend as SGLang 0.5.23 builds it: through the ``sglang.srt.plugins`` entry
point and ``create_tree_cache``, with its start-up refusals, reset and KV events."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
import torch
from sglang_driver import Driver, make_cache

from kvindex.exceptions import KvIndexError


def _ctx(params: Any, **flags: Any) -> Any:
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from sglang.srt.runtime_context import get_server_args

    base = dict(
        server_args=get_server_args(),
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    base.update(flags)
    return TreeCacheBuildContext(**base)


def _params(page_size: int = 1, **kw: Any) -> Any:
    cache, _, _ = make_cache("radix", page_size=page_size, kv_size=256)
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    fields = dict(
        req_to_token_pool=cache.req_to_token_pool,
        token_to_kv_pool_allocator=cache.token_to_kv_pool_allocator,
        page_size=page_size,
        disable=False,
    )
    fields.update(kw)
    return CacheInitParams(**fields)


def test_plugin_entry_point_registers_and_scheduler_factory_builds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sglang.srt import plugins
    from sglang.srt.mem_cache import registry
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from kvindex.integrations.sglang.cache import KvindexRadixCache

    monkeypatch.setenv("SGLANG_PLUGINS", "kvindex")
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    plugins.load_plugins()
    assert registry.registered_radix_cache_backends() == ["kvindex"]
    params = _params()
    set_global_server_args_for_scheduler(
        ServerArgs(model_path="dummy", radix_cache_backend="kvindex")
    )
    cache = registry.create_tree_cache(_ctx(params))
    assert isinstance(cache, KvindexRadixCache)
    assert cache.page_size == 1 and cache.supports_prefix_sharing() and not cache.supports_mamba()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"is_hybrid_swa": True}, "sliding-window"),
        ({"is_hybrid_ssm": True}, "Mamba"),
        ({"enable_hierarchical_cache": True}, "HiCache"),
    ],
)
def test_factory_refuses_hybrid_models_by_name(flags: dict[str, Any], named: str) -> None:
    from kvindex.integrations.sglang.cache import (
        UnsupportedSglangFeatureError,
        kvindex_cache_factory,
    )

    with pytest.raises(UnsupportedSglangFeatureError, match=named) as e:
        kvindex_cache_factory(_ctx(_params(), **flags))
    assert isinstance(e.value, KvIndexError)


def test_construction_refuses_unsupported_params() -> None:
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    from kvindex.integrations.sglang.cache import KvindexRadixCache, UnsupportedSglangFeatureError

    for kw, named in [
        ({"tree_components": (ComponentType.FULL, ComponentType.SWA)}, "SWA"),
        ({"tree_components": (ComponentType.FULL, ComponentType.MAMBA)}, "Mamba"),
        ({"is_eagle": True}, "EAGLE"),
        ({"eviction_policy": "tlru"}, "tlru"),
        ({"enable_session_radix_cache": True}, "session"),
    ]:
        with pytest.raises(UnsupportedSglangFeatureError, match=named):
            KvindexRadixCache(_params(**kw))


def test_reset_clears_tree_and_reports_it() -> None:
    cache, alloc, rtp = make_cache("kvindex", page_size=1, kv_size=256, events=True)
    d = Driver(cache, alloc, rtp, 1)
    assert [type(e).__name__ for e in cache.take_events()] == ["AllBlocksCleared"]
    d.admit("a", list(range(20)), [1, 2])
    d.prefill("a", 64)
    d.finish("a")
    assert cache.total_size() == 22  # the prompt and the output
    assert [type(e).__name__ for e in cache.take_events()] == ["BlockStored"]
    cache.reset()
    assert cache.total_size() == 0 and cache.evictable_size() == 0
    assert [type(e).__name__ for e in cache.take_events()] == ["AllBlocksCleared"]


def test_disabled_cache_shares_nothing() -> None:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from kvindex.integrations.sglang.cache import KvindexRadixCache

    cache = KvindexRadixCache(_params(disable=True))
    assert not cache.supports_prefix_sharing()
    r = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3]))))
    assert r.device_prefix_len == 0 and cache.is_root(r.last_device_node)
    assert len(cache.path_device_indices(r.last_device_node)) == 0


def test_dfs_weight_order_groups_shared_prefixes() -> None:
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache, alloc, _ = make_cache("kvindex", page_size=1, kv_size=256)
    seqs = [[1, 2, 3, 4], [1, 2, 3, 9], [7, 8], [1, 2, 5]]
    for s in seqs:
        v = alloc.alloc(len(s))
        cache.insert(InsertParams(key=RadixKey(array("q", s)), value=v))
    nodes = [
        cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", s)))).last_device_node
        for s in seqs
    ]
    order = cache.dfs_weight_order([nodes[2], nodes[0], nodes[3], nodes[1]])
    assert sorted(order) == [0, 1, 2, 3]
    # The three [1, 2, ...] requests come together, before the lone [7, 8].
    assert order[-1] == 0
    assert set(order[:3]) == {1, 2, 3}


def test_lock_refs_protect_matched_prefix() -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache, alloc, _ = make_cache("kvindex", page_size=1, kv_size=64)
    v = alloc.alloc(8)
    cache.insert(InsertParams(key=RadixKey(array("q", range(8))), value=v))
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", range(8)))))
    lock = cache.lock(m.last_device_node)
    assert lock.receipt is not None and cache.protected_size() == 8
    assert cache.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 0
    assert torch.equal(cache.path_device_indices(m.last_device_node), v)
    cache.unlock(lock)
    assert cache.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 8
