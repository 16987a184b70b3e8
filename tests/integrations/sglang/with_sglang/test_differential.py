"""One random request stream through SGLang 0.5.23's own ``RadixCache`` and through
``--radix-cache-backend kvindex``, driven by SGLang's scheduler-side helpers
(``match_kv_cache``, chunked-prefill ``checkpoint_kv_cache``, ``release_kv_cache``,
``evict_from_tree_cache``): every match (hit length and device indices), every allocation
(so every free, in order), every eviction, every KV event and the cache sizes after every
step must agree. Shared system prompts, multi-turn follow-ups, chunk sizes 1-64, aborts,
LoRA (``extra_key``) / ``cache_salt`` namespaces and a pool small enough to evict often."""

from __future__ import annotations

import pytest
from sglang_driver import Driver, make_cache, run_lockstep

POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]


def _worlds(page_size: int, policy: str, events: bool) -> dict[str, Driver]:
    kv_size = 512 if page_size == 1 else 1024
    out = {}
    for backend in ("radix", "kvindex"):
        cache, alloc, rtp = make_cache(
            backend, page_size=page_size, kv_size=kv_size, policy=policy, events=events
        )
        out[backend] = Driver(cache, alloc, rtp, page_size)
    return out


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_zero_divergences(page_size: int, policy: str, seed: int) -> None:
    worlds = _worlds(page_size, policy, events=True)
    stats = run_lockstep(
        worlds, seed=seed, steps=300, namespaces=True, priorities=policy == "priority"
    )
    # The stream exercised what it is meant to.
    assert stats["evict"] > 5 and stats["checkpoint"] > 5 and stats["hit_tokens"] > 100
    assert stats["events"] > 20
    for d in worlds.values():
        assert d.cache.evictable_size() + d.cache.protected_size() == d.cache.total_size()
    worlds["kvindex"].cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
def test_long_stream_without_events(page_size: int) -> None:
    stats = run_lockstep(_worlds(page_size, "lru", events=False), seed=7, steps=1500, max_active=8)
    assert stats["evict"] > 20
