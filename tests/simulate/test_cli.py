"""The ``kvindex`` command line as a user meets it: the default command, ``--version``,
unknown words, output paths and formats checked before anything is simulated, conflicting or
ignored options, a report that fits the terminal, the full-table formats, the JSON header
and the progress bar."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

import kvindex
import kvindex.simulate.runner as runner_mod
from kvindex.__main__ import main as kvindex_main
from kvindex.simulate.cli import build_parser
from kvindex.simulate.progress import Progress, format_duration
from kvindex.simulate.report import format_us, plural

SMALL = ["--quiet", "--requests", "30", "--capacity", "24k,inf", "--block-size", "16"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as e:
            kvindex_main([flag])
        assert e.value.code == 0
        assert capsys.readouterr().out.strip() == f"kvindex {kvindex.__version__}"


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        kvindex_main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "{simulate,demo,explain}" in out and "--version" in out and "--capacity" not in out
    with pytest.raises(SystemExit):
        kvindex_main(["simulate", "--help"])
    assert "--capacity" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["frobnicate"], ["--frobnicate"], ["simulate", "extra"]])
def test_unknown_words_are_rejected(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        kvindex_main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if anything gets simulated."""

    def boom(*a: Any, **kw: Any) -> Any:
        raise AssertionError("simulated before checking the outputs")

    monkeypatch.setattr(runner_mod, "run_tasks", boom)


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--json", "{tmp}/missing/r.json"], "does not exist"),
        (["--json", "{tmp}"], "is a directory"),
        (["--plot", "{tmp}/missing/p.png"], "does not exist"),
        (["--plot", "{tmp}/p.xyz"], "unknown image format 'xyz'"),
        (["--plot", "{tmp}/p"], "no file suffix"),
        (["--workload", "seeds", "--plot", "{tmp}/p.png"], "seeds workload has none"),
        (["--workload", "seeds", "--trace", "t.jsonl"], "give one"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--step-ms", "0", "--trace", "t.jsonl"], "--step-ms must be > 0"),
    ],
)
def test_bad_outputs_and_conflicts_fail_at_once(
    argv: list[str], msg: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.perf_counter()
    code = kvindex_main(["--quiet", *(a.format(tmp=tmp_path) for a in argv)])
    assert time.perf_counter() - t0 < 1.0
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and msg in err and err.startswith("kvindex: error: "), err


def test_ignored_options_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    assert (
        kvindex_main(["--workload", "seeds", "--seed", "3", "--step-ms", "5", "--json", str(out)])
        == 0
    )
    err = capsys.readouterr().err
    assert "--seed applies to the chat workload only" in err
    assert "--step-ms applies to --trace only" in err
    assert kvindex_main([*SMALL, "--weights", "16GiB"]) == 0
    assert "apply only with --budget-rule" in capsys.readouterr().err


def test_options_before_the_subcommand_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    assert kvindex_main([*SMALL, "--json", str(out), "simulate", "--index", "radix"]) == 0
    data = json.loads(out.read_text())
    assert [r["design"] for r in data["runs"]] == ["radix", "radix"]
    assert data["command"].startswith("kvindex --quiet --requests 30")


def test_default_report_fits_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert kvindex_main(["--quiet", "--requests", "40"]) == 0  # not a terminal: 120 columns
    text = capsys.readouterr().out
    assert max(len(x) for x in text.splitlines()) <= 120
    assert "lost:" in text and "partial block" in text and "1 tokens" not in text
    monkeypatch.setenv("COLUMNS", "80")
    assert kvindex_main(["--quiet", "--requests", "40"]) == 0
    text = capsys.readouterr().out
    assert max(len(x) for x in text.splitlines()) <= 80
    assert "columns left out to fit 80 columns" in text.replace("\n", " ")


def test_full_table_formats(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvindex_main([*SMALL, "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0][:3] == ["design", "block size", "capacity"] and len(rows) == 1 + 4
    assert "lost: last block" in rows[0] and "peak blocks" in rows[0]
    assert kvindex_main([*SMALL, "--format", "markdown"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| design") and md[1].startswith("|:")
    assert kvindex_main([*SMALL, "--format", "table"]) == 0
    assert "theoretical maximum hit rate" in capsys.readouterr().out


def test_json_header_and_uncomputed_losses(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert kvindex_main([*SMALL, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["kvindex_version"] == kvindex.__version__
    assert data["command"] == "kvindex " + " ".join([*SMALL, "--json", str(out)])
    for c in data["ceilings"]:  # the in-order ceilings do not split their losses
        assert c["hit_tokens"] >= 0 and c["lost_granularity"] is None and c["not_cached"] is None
    for r in data["runs"]:
        assert isinstance(r["lost_granularity"], int)
        t = r["timing"]
        assert t["index_us_per_request_p10"] <= t["index_us_per_request_median"]
        assert t["index_us_per_request_median"] <= t["index_us_per_request_p90"]


def test_plot_has_distinct_series_and_an_inf_tick(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.svg"
    assert kvindex_main([*SMALL, "--block-size", "1,16", "--plot", str(png)]) == 0
    svg = png.read_text()
    assert ">inf<" in svg or "inf" in svg
    assert "hash_chain, block 1" in svg and "radix, block 16" in svg


def test_measured_times_have_honest_precision() -> None:
    assert [format_us(x) for x in (0.0, 3.456, 25.4, 145.2, 1234.5)] == [
        "0",
        "3.5",
        "25",
        "150",
        "1200",
    ]
    assert plural(1, "token") == "1 token" and plural(2, "token") == "2 tokens"


def test_progress_bar_shows_elapsed_and_eta_within_the_width() -> None:
    now = [100.0]
    stream = io.StringIO()
    bar = Progress(200, enabled=True, stream=stream, width=lambda: 60, clock=lambda: now[0])
    bar.set_label("run 3/16 radix bs=1 cap=128,000 tok and a long tail of words")
    now[0] += 10.0
    bar.advance(50)
    line = bar.line()
    assert "25%" in line and "0:10 elapsed" in line and "0:30 left" in line
    assert len(line) <= 59
    bar.close()
    assert stream.getvalue().endswith("\r")
    assert format_duration(3723) == "1:02:03"
    quiet = io.StringIO()
    off = Progress(10, enabled=False, stream=quiet)
    off.advance(5)
    off.close()
    assert quiet.getvalue() == ""


def test_a_closed_pipe_ends_quietly() -> None:
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-m", "kvindex", *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # like `kvindex | head -0`
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert err == ""


def test_index_is_an_alias_of_design(capsys: pytest.CaptureFixture[str]) -> None:
    """The designs are chosen with ``--design``; ``--index``, its former name, still works."""
    for flag in ("--design", "--index"):
        assert kvindex_main([*SMALL, "--capacity", "inf", flag, "radix@16"]) == 0
        assert "radix" in capsys.readouterr().out
    assert "--design LIST" in build_parser().format_help()
