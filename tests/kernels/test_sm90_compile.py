"""Every kernel configuration compiles for sm_90 (H100/H200) on a CPU: no spills, tensor
cores for 16-bit attention, pipelined (``cp.async``) key loads where the plan asks for
stages, and at least the programs per SM the split heuristic counts on.

``kernels/sm90_compile_check.py`` does the work (see its docstring). Compiling ~75 configurations
takes ~1-2 min of one core, so ``conftest.py`` starts the script in a child process as soon
as collection ends and it runs while the interpreter tests use the other core; this test
waits for it and checks its per-configuration JSON report. The child runs without
``TRITON_INTERPRET`` and imports the same ``kvindex`` as the tests.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType

import pytest
from sm90_job import CHECK_SCRIPT, STASH_KEY, start_check


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sm90_compile_check", CHECK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_config_space_covers_the_contract() -> None:
    """The plans the check compiles span every dtype pair, head dim and kernel."""
    check = _load_script()
    labels = [label for label, _ in check.iter_plans()]
    for needle in ("q=float16", "q=bfloat16", "q=float32", "cache=float8_e4m3fn", "block=1 ",
                   "block=12 ", "block=544", "block=1048576", "D=32", "D=64", "D=120", "D=128",
                   "D=256", "splits=4", "Hq/Hkv=32/1"):  # fmt: skip
        assert any(needle in label for label in labels), needle
    kinds = {label.split()[0] for label in labels}
    assert kinds == {"decode", "short-prefill", "prefill", "store_kv"}
    full = {label for label, _ in check.iter_plans(full=True)}
    assert set(labels) < full and any("D=192" in label for label in full)


def test_every_configuration_compiles_for_sm90_pipelined_without_spills(
    pytestconfig: pytest.Config,
) -> None:
    proc, report = pytestconfig.stash.get(STASH_KEY, None) or start_check()
    output, _ = proc.communicate(timeout=900)
    rc = proc.returncode
    assert report.exists(), f"sm90_compile_check.py produced no report (rc={rc}):\n{output}"
    results = json.loads(report.read_text())
    bad = [r for r in results if r["error"] or r["stack_bytes"] != 0
           or (r["needs_mma"] and r["mma_instructions"] <= 0)
           or (r["needs_pipelining"] and r["async_copies"] <= 0)
           or r["programs_per_sm"] < r["programs_per_sm_floor"]]  # fmt: skip
    assert not bad, "\n".join(f"{r['kernel']} [{r['config']}]: {r['error'] or r}" for r in bad)
    assert {r["kernel"] for r in results} == {
        "_paged_attention_kernel", "_merge_splits_kernel", "_store_kv_kernel",
    }  # fmt: skip
    # The bf16 decode configs are pipelined and keep several programs per SM.
    decode = [r for r in results if r["kernel"] == "_paged_attention_kernel"
              and r["config"].startswith("decode q=bfloat16 cache=bfloat16 D=128 ")]  # fmt: skip
    assert decode and all(r["needs_pipelining"] and r["programs_per_sm"] >= 3 for r in decode)
    assert len(results) >= 60
    assert proc.returncode == 0, output
