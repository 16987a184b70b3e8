"""``kvindex simulate --cluster --faults``: faults injected between the engines and the
index over real sockets; each policy with recovery (snapshots, heartbeats) and without."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvindex.simulate.cli import main
from kvindex.simulate.faults import Faults, parse_faults


def test_faults_report_with_and_without_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "f.json"
    argv = ["--cluster", "2", "--route", "kv", "--requests", "40", "--design", "hash_chain"]
    faults = "drop=0.1,corrupt=0.02,inject=0.05,replay=never"
    assert main([*argv, "--cluster-blocks", "1024", "--faults", faults, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kv+recovery" in text and "kv-recovery" in text and "index wrong" in text
    runs = {r["route"]: r for r in json.loads(out.read_text())["runs"]}
    on, off = runs["kv+recovery"], runs["kv-recovery"]
    assert on["extra"]["recovery"] and not off["extra"]["recovery"]
    assert on["extra"]["injected"]["dropped"] > 0
    # Recovery rebuilds what replay cannot supply: nothing given up, nothing degraded.
    assert on["lost"] == 0 and on["extra"]["degraded_at_end"] == 0
    assert off["lost"] > 0
    assert on["extra"]["stale_share"] <= off["extra"]["stale_share"]


@pytest.mark.parametrize(
    "spec", ["drop", "drop=2", "drop=x", "replay=sometimes", "block=1", "nope=0.1", "late_s=-1"]
)
def test_bad_fault_specs_are_refused(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError):
        parse_faults(spec)
    assert main(["--cluster", "2", "--requests", "5", "--faults", spec]) == 2
    assert "--faults" in capsys.readouterr().err


def test_faults_need_the_cluster_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "5", "--faults", "default"]) == 2
    assert "--faults needs --cluster" in capsys.readouterr().err


def test_the_default_spec() -> None:
    f = parse_faults("default")
    assert f == Faults(drop=0.05, corrupt=0.01, duplicate=0.02, inject=0.02, replay="late")
    assert parse_faults("drop=0.5, replay=garbage") == Faults(drop=0.5, replay="garbage")
