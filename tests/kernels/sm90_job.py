"""The sm_90 compile check as a background job (started by conftest, read by the test).

Kept in a plain module (imported by name from this folder's ``sys.path`` entry) so that
``conftest.py`` and ``test_sm90_compile.py`` share one ``STASH_KEY`` in every pytest
import mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHECK_SCRIPT = Path(__file__).resolve().parents[2] / "kernels" / "sm90_compile_check.py"
STASH_KEY = pytest.StashKey[tuple[subprocess.Popen[str], Path]]()


def start_check() -> tuple[subprocess.Popen[str], Path]:
    """Starts ``sm90_compile_check.py --json`` in a child process; returns (process, report path).

    The child runs without ``TRITON_INTERPRET`` and imports the same ``kvindex``.
    """
    report = Path(tempfile.mkdtemp(prefix="kvindex-sm90-")) / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(CHECK_SCRIPT), "--json", str(report), "--jobs", "1"]
    out = subprocess.PIPE
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, report
