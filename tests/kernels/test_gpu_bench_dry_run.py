"""``benches/gpu_kernels.py --dry-run`` runs end to end on the CPU and writes its JSON.

Under the interpreter the script is loaded from its file and its ``main`` called in this
process (the kernels are already imported in interpreter mode), which saves a second torch
import; when the tests run compiled on a GPU, the dry run needs its own process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from paged_testlib import INTERPRET

BENCH = Path(__file__).resolve().parents[2] / "benches" / "gpu_kernels.py"


def _run_dry(out: Path) -> None:
    args = ["--dry-run", "--out", str(out)]
    if not INTERPRET:
        cmd = [sys.executable, str(BENCH), *args]
        proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        return
    spec = importlib.util.spec_from_file_location("gpu_kernels_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    assert bench.main(args) == 0


def test_gpu_benchmark_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    _run_dry(out)
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    kinds = {row["kind"] for row in report["decode"]}
    assert kinds == {"bf16", "block1", "fp8", "mixed", "q_len4", "tune"}
    for row in report["decode"]:
        assert "error" not in row, row
        assert row["kvindex_us"] > 0 and row["rotations"] >= 1
        if row["kind"] != "tune":
            assert row["max_abs_diff_vs_fp32"] < 2e-2  # bf16 output vs the fp32 oracle
            assert row["kvindex_1split_us"] > 0
        if row["kind"] in ("bf16", "block1"):
            assert row["sdpa_us"] > 0
    # Every point's K/V, times its rotations, is more than twice the (dry-run) L2.
    l2 = report["device"]["l2_bytes"]
    assert all(r["kv_bytes"] * r["rotations"] > 2 * l2 for r in report["decode"])
    assert report["prefill"]["max_abs_diff_vs_sdpa"] < 2e-2
    assert report["mixed_batch"]["max_abs_diff_vs_fp32"] < 2e-2
    assert report["store_kv"]["us"] > 0
