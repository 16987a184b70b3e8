"""Adversarial command lines: a bad value is one ``error:`` line and exit status 2,
never a traceback. Regression case: ``--seed -1`` reached numpy's seed sequence and
ended in a ``ValueError`` traceback.
"""

from __future__ import annotations

import pytest

from kvindex.__main__ import main as kvindex_main


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--seed", str(-(2**70))], "--seed must be >= 0"),
        (["--jobs", "-1"], "--jobs must be >= 1"),
        (["--capacity", "9" * 5000 + "B"], "capacity"),
        (["--index", "bogus"], "unknown design"),
    ],
)
def test_bad_values_are_one_error_line(
    argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = kvindex_main(["--quiet", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and msg in err and "Traceback" not in err, err
