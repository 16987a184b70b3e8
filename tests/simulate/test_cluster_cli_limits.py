"""``kvindex simulate --cluster`` under hostile input: limits that could admit nothing are
refused at once (exit status 2, one line), a trace whose timestamps are far apart runs as
fast as a dense one (idle time is jumped, not stepped through), and a trace line nested
100,000 deep is a ``TraceFormatError`` naming its line, not a ``RecursionError``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvindex.simulate.cli import main
from kvindex.simulate.errors import TraceFormatError
from kvindex.simulate.trace import read_mooncake_trace

_LINE = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


def _trace(tmp_path: Path, timestamps: list[int]) -> Path:
    f = tmp_path / "t.jsonl"
    lines = [dict(_LINE, timestamp=ts, hash_ids=[1, 2 + i]) for i, ts in enumerate(timestamps)]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


@pytest.mark.parametrize(
    "flags",
    [
        ["--max-running", "0"],
        ["--max-running", "-3"],
        ["--max-batched-tokens", "0"],
        ["--max-batched-tokens", "-1"],
    ],
)
def test_limits_that_admit_nothing_are_refused(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    argv = ["--cluster", "2", "--route", "kv", "--requests", "4", "--cluster-blocks", "1024"]
    assert main([*argv, "-q", *flags]) == 2
    assert time.monotonic() - t0 < 10.0
    err = capsys.readouterr().err
    assert "must be >= 1" in err and "Traceback" not in err


def test_far_apart_timestamps_run_at_once(tmp_path: Path) -> None:
    # 10**7 s apart at 20 ms a step: 5 * 10**8 idle steps between arrivals.
    f = _trace(tmp_path, [0, 10**10, 2 * 10**10])
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    argv = ["--cluster", "2", "--route", "kv", "--trace", str(f), "--cluster-blocks", "1024"]
    assert main([*argv, "--index", "hash_chain", "-q", "--json", str(out)]) == 0
    assert time.monotonic() - t0 < 60.0
    runs = json.loads(out.read_text())["runs"]
    assert all(r["requests"] == 3 for r in runs)
    assert all(r["steps"] > 10**9 for r in runs)


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_a_deeply_nested_trace_line_is_a_trace_format_error(
    tmp_path: Path, opening: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(_LINE) + "\n" + opening * 100_000 + "\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: .*nested"):
        read_mooncake_trace(f)
    assert main(["--trace", str(f), "-q"]) == 2
    assert main(["--cluster", "2", "--trace", str(f), "-q"]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:2" in err and "Traceback" not in err and "RecursionError" not in err
