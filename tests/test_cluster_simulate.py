"""`kvindex simulate --cluster`: engines publish real event batches over ipc sockets to
the index; the index's view of every engine equals the engine's own cache after every
step (``check=True``); the report's figures are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvindex.cluster.simulate import simulate_cluster
from kvindex.simulate.cli import main
from kvindex.simulate.workloads import chat_workload


@pytest.mark.parametrize("route", ["kv", "random", "approx"])
def test_cluster_run_checks_the_index_every_step(route: str) -> None:
    wl = chat_workload(60, 1)
    res = simulate_cluster(wl, 3, route, blocks=1024, max_running=8, check=True)
    assert res.requests == 60
    assert 0.0 <= res.hit_rate <= 1.0
    assert res.prompt_tokens == sum(r.prompt_len for r in wl.requests)
    assert res.prefill_tokens >= res.prompt_tokens - res.hit_tokens
    assert res.lost == 0
    if route != "approx":
        assert res.block_events > 0 and res.index_ns_per_event > 0
        assert res.flagged_decisions == 0


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
    assert [r["route"] for r in runs] == ["kv", "least_loaded", "global"]
    assert main(["--cluster", "2", "--route", "nope", "--requests", "5"]) == 2
