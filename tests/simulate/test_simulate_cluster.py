"""`kvindex simulate --cluster`: engines publish real event batches over ipc sockets to
the index; the index's view of every engine equals the engine's own cache after every
step (``check=True``); the report's figures are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvindex import RadixPrefixCache
from kvindex.cluster import ClusterIndex
from kvindex.cluster.simulate import RADIX_ALGO, _check_index, _Engine, simulate_cluster
from kvindex.events import EventEncoder
from kvindex.simulate.cli import main
from kvindex.simulate.workloads import chat_workload


@pytest.mark.parametrize(
    ("design", "route", "requests"),
    [
        ("hash_chain", "kv", 60),
        ("hash_chain", "random", 60),
        ("hash_chain", "approx", 60),
        ("radix", "kv", 60),
        ("radix", "random", 60),
    ],
)
def test_cluster_run_checks_the_index_every_step(design: str, route: str, requests: int) -> None:
    wl = chat_workload(requests, 1)
    res = simulate_cluster(wl, 3, route, blocks=1024, max_running=8, check=True, design=design)
    assert res.design == design
    assert res.requests == requests
    assert 0.0 <= res.hit_rate <= 1.0
    assert res.prompt_tokens == sum(r.prompt_len for r in wl.requests)
    assert res.prefill_tokens >= res.prompt_tokens - res.hit_tokens
    assert res.lost == 0
    if route != "approx":
        assert res.block_events > 0 and res.index_ns_per_event > 0
        assert res.flagged_decisions == 0


def test_the_oracle_compares_a_radix_engines_page_hashes() -> None:
    """The per-step check holds radix engines to their full hash listing: an index that
    has not applied an engine's events disagrees, and agrees once it has."""
    e = _Engine(0, 16, 4, {"policy": "lru"}, "", publish=False)
    e.cache = RadixPrefixCache(17, 4, enable_events=True)
    index = ClusterIndex(4, algo=RADIX_ALGO)
    index.add_worker("engine0")
    prompt = np.arange(13, dtype=np.int32)
    e.cache.admit(1, prompt)
    e.cache.free(1)
    assert len(e.cache.cached_page_hashes()) == 3
    with pytest.raises(AssertionError, match="disagrees with engine 0"):
        _check_index(0, [e], index, [prompt], 1)
    payload = EventEncoder().encode(e.cache, 0.0)
    assert payload is not None and index.apply(0, 0, payload) == ("applied", -1)
    _check_index(1, [e], index, [prompt], 1)


def test_global_pool_bounds_the_cluster() -> None:
    wl = chat_workload(80, 2)
    kv = simulate_cluster(wl, 4, "kv", blocks=1024, max_running=8)
    one = simulate_cluster(
        wl, 1, "round_robin", blocks=4096, max_running=32, max_batched_tokens=32768
    )
    assert one.hit_rate >= kv.hit_rate


def test_cli_cluster_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cl.json"
    argv = ["--cluster", "2", "--route", "kv,least_loaded", "--requests", "30"]
    assert main([*argv, "--cluster-blocks", "1024", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cluster of 2 engines" in text and "least_loaded" in text and "global" in text
    runs = json.loads(out.read_text())["runs"]
    assert [(r["design"], r["route"]) for r in runs] == [
        ("hash_chain", "kv"),
        ("hash_chain", "least_loaded"),
        ("hash_chain", "global"),
        ("radix", "kv"),
        ("radix", "least_loaded"),
        ("radix", "global"),
    ]
    assert "hash_chain (xxh3_128): cluster of 2" in text and "radix (lru): cluster of 2" in text
    assert main(["--cluster", "2", "--route", "nope", "--requests", "5"]) == 2


def test_radix_engines_route_on_their_own_event_hashes() -> None:
    """Radix engines: the kv router finds the engine holding a prompt's prefix (the index
    hashes prompts with the tree's page scheme), so it beats random routing."""
    wl = chat_workload(80, 2)
    kv = simulate_cluster(wl, 4, "kv", blocks=1024, max_running=8, design="radix")
    rnd = simulate_cluster(wl, 4, "random", blocks=1024, max_running=8, design="radix")
    assert kv.lost == 0 and kv.block_events > 0
    assert kv.hit_rate > rnd.hit_rate


def test_cli_cluster_index_selects_designs_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "cluster.png"
    out = tmp_path / "cl.json"
    argv = ["--cluster", "2", "--route", "kv,random", "--requests", "20", "--quiet"]
    argv += ["--cluster-blocks", "1024", "--index", "radix", "--plot", str(png)]
    assert main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "radix (lru)" in text and "hash_chain" not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    runs = json.loads(out.read_text())["runs"]
    assert [(r["design"], r["route"]) for r in runs] == [
        ("radix", "kv"),
        ("radix", "random"),
        ("radix", "global"),
    ]
    assert main([*argv[:-2], "--plot", str(tmp_path / "c.nope")]) == 2
    assert "unknown image format" in capsys.readouterr().err
    assert main(["--cluster", "2", "--index", "btree", "--requests", "5", "-q"]) == 2
    assert "unknown design 'btree'" in capsys.readouterr().err
