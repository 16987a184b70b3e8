"""Runs vLLM 0.33.0's own scheduler tests twice, on vLLM's KV cache manager and on kvindex's,
and fails unless every test that passes on vLLM's passes on kvindex's.

    python run_vllm_suite.py ENV_DIR [--files F ...] [--sequential]

ENV_DIR is what ``setup_env.sh`` built (its ``venv`` python must run this script). The two
runs go in parallel by default (one process each). The only tests allowed to pass on vLLM's
manager and not on kvindex's are those matched by :data:`OUT_OF_SCOPE`, and each of those
must fail with kvindex's ``UnsupportedVllmConfigError`` (checked in the failure text), so
none can pass by accident or fail for another reason. A listed test that passes on kvindex's
manager fails the run too: the list must stay exact.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: vLLM's test files the issue names: the scheduler, async scheduling, prefix caching,
#: KV cache metrics, deferred block freeing, prefix replay.
FILES = [
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_kv_cache_metrics.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_prefix_replay.py",
]

#: Tests that build a KV cache manager kvindex does not support, as fnmatch patterns over
#: pytest node ids, each with the reason. On kvindex's manager each must fail with
#: ``UnsupportedVllmConfigError``.
OUT_OF_SCOPE: dict[str, str] = {}

ERROR_NAME = "UnsupportedVllmConfigError"


def out_of_scope_reason(nodeid: str) -> str | None:
    for pattern, reason in OUT_OF_SCOPE.items():
        if fnmatch.fnmatchcase(nodeid, pattern):
            return reason
    return None


def parse_junit(path: Path, src: Path) -> dict[str, tuple[str, str]]:
    """node id -> (outcome, failure text) for every test case in a JUnit XML report."""
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        # The classname is the dotted module path, then any class: the module is the
        # longest prefix naming a file under ``src``.
        parts = case.get("classname", "").split(".")
        nodeid = "::".join([*parts, case.get("name", "")])
        for i in range(len(parts), 0, -1):
            module = "/".join(parts[:i]) + ".py"
            if (src / module).is_file():
                nodeid = "::".join([module, *parts[i:], case.get("name", "")])
                break
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                text = (child.get("message") or "") + "\n" + (child.text or "")
                break
            if child.tag == "skipped":
                outcome = "skipped"
                text = child.get("message") or ""
        prev = results.get(nodeid)
        if prev is not None and prev[0] not in ("passed", "skipped"):
            continue  # a setup/teardown error reported beside the call keeps the failure
        results[nodeid] = (outcome, text)
    return results


def pytest_command(vpy: str, files: list[str], junit: Path, swap: bool) -> list[str]:
    plugins = ["-p", "kvindex_vllm_fixtures"] + (["-p", "kvindex_vllm_swap"] if swap else [])
    return [
        vpy, "-m", "pytest", "--noconftest", *plugins, "-p", "no:cacheprovider", "-q",
        "-o", "junit_family=xunit1", f"--junitxml={junit}", *files,
    ]  # fmt: skip


def _row(*cells: object) -> str:
    first, *rest = (str(c) for c in cells)
    return f"{first:<45}" + "".join(f" {c:>12}" for c in rest)


def _counts_row(label: str, c: Counter[str]) -> str:
    stock_fail = c["stock_failed"] + c["stock_error"]
    kvx_fail = c["kvindex_failed"] + c["kvindex_error"] + c["kvindex_missing"]
    return _row(
        label, c["stock_passed"], stock_fail, c["kvindex_passed"], kvx_fail, c["out_of_scope"]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("env_dir", type=Path)
    ap.add_argument("--files", nargs="+", default=FILES)
    ap.add_argument("--sequential", action="store_true")
    args = ap.parse_args()
    env_dir = args.env_dir.resolve()
    src = env_dir / "vllm-src"
    out = env_dir / "results"
    out.mkdir(exist_ok=True)
    vpy = str(env_dir / "venv" / "bin" / "python")
    if not (src / "tests").is_dir() or not Path(vpy).exists():
        print(f"{env_dir} is not a built vLLM test environment: run setup_env.sh", file=sys.stderr)
        return 1
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_MODEL_REDIRECT_PATH=str(env_dir / "redirect.json"),
        PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        KVINDEX_VLLM_SWAP_REPORT=str(out / "swap.json"),
    )
    env.pop("KVINDEX_VLLM", None)  # the entry-point plugin must not act in the stock run
    runs = {}
    t0 = time.monotonic()
    for label, swap in (("stock", False), ("kvindex", True)):
        junit = out / f"{label}.xml"
        junit.unlink(missing_ok=True)
        log = open(out / f"{label}.log", "w", encoding="utf-8")
        cmd = pytest_command(vpy, args.files, junit, swap)
        print(f"[{label}] {' '.join(cmd)}  (log: {log.name})", flush=True)
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs[label] = (proc, junit, log)
        if args.sequential:
            proc.wait()
    for label, (proc, _, log) in runs.items():
        rc = proc.wait()
        log.close()
        tail = (out / f"{label}.log").read_text(encoding="utf-8").strip().splitlines()[-1:]
        print(f"[{label}] exit {rc}: {tail[0] if tail else '(no output)'}")
    print(f"both runs: {time.monotonic() - t0:.0f} s wall")

    stock_proc, stock_xml, _ = runs["stock"]
    swap_proc, swap_xml, _ = runs["kvindex"]
    if not stock_xml.exists() or not swap_xml.exists():
        print("a run left no JUnit report (see its log)", file=sys.stderr)
        return 1
    if swap_proc.returncode not in (0, 1):  # 1: some tests failed; anything else is fatal
        print(f"the kvindex run ended abnormally (exit {swap_proc.returncode})", file=sys.stderr)
        return 1
    report = json.loads((out / "swap.json").read_text(encoding="utf-8"))
    stock = parse_junit(stock_xml, src)
    swapped = parse_junit(swap_xml, src)

    problems: list[str] = []
    per_file: dict[str, Counter[str]] = {}
    for nodeid, (outcome, _) in sorted(stock.items()):
        f = nodeid.split("::")[0]
        c = per_file.setdefault(f, Counter())
        c[f"stock_{outcome}"] += 1
        s_outcome, s_text = swapped.get(nodeid, ("missing", ""))
        c[f"kvindex_{s_outcome}"] += 1
        reason = out_of_scope_reason(nodeid)
        if outcome != "passed":
            continue
        if reason is None:
            if s_outcome != "passed":
                first = s_text.strip().splitlines()[0] if s_text.strip() else ""
                problems.append(f"REGRESSION {nodeid}: {s_outcome} on kvindex: {first[:300]}")
        elif s_outcome == "passed":
            problems.append(f"LISTED OUT OF SCOPE BUT PASSES on kvindex ({reason}): {nodeid}")
        elif ERROR_NAME not in s_text:
            first = s_text.strip().splitlines()[0] if s_text.strip() else ""
            problems.append(f"OUT OF SCOPE ({reason}), not {ERROR_NAME}: {nodeid}: {first[:300]}")
        else:
            c["out_of_scope"] += 1
    for nodeid in sorted(set(swapped) - set(stock)):
        problems.append(f"only in the kvindex run: {nodeid}")

    print(f"\nkvindex's KVCacheManager constructed {report['constructed']} times")
    if report["constructed"] == 0:
        problems.append("kvindex's KVCacheManager was never constructed")
    print(_row("file", "stock pass", "stock fail", "kvx pass", "kvx fail", "out of scope"))
    totals: Counter[str] = Counter()
    for f, c in sorted(per_file.items()):
        totals.update(c)
        print(_counts_row(f, c))
    print(_counts_row("total", totals))
    for p in problems:
        print(p)
    if problems:
        print(f"vLLM suite on kvindex: {len(problems)} problem(s)")
        return 1
    if totals["stock_passed"] == 0:
        print("no vLLM test passed even on vLLM's manager: the environment is broken")
        return 1
    print(
        f"vLLM suite on kvindex: every one of the {totals['stock_passed']} tests passing on vLLM's "
        f"manager passes on kvindex's, {totals['out_of_scope']} out of scope fail with {ERROR_NAME}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
