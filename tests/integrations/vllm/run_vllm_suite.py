"""Runs vLLM 0.33.0's own scheduler tests twice, on vLLM's KV cache manager and on kvindex's,
and fails unless every test that passes on vLLM's passes on kvindex's.

    python run_vllm_suite.py ENV_DIR [--files F ...] [--sequential]
    python run_vllm_suite.py ENV_DIR --all-core     # the whole tests/v1/core, not only FILES

ENV_DIR is what ``setup_env.sh`` built (its ``venv`` python must run this script). The two
runs go in parallel by default (one process each). The only tests allowed to pass on vLLM's
manager and not on kvindex's are those listed in :data:`OUT_OF_SCOPE`, and each of those
must fail with kvindex's ``UnsupportedVllmConfigError`` (checked in the failure text), so
none can pass by accident or fail for another reason. A listed test that passes on kvindex's
manager fails the run too: the list must stay exact. ``--all-core`` runs the whole
``tests/v1/core`` folder (about 25 minutes on a loaded 2-core machine; not part of CI), with
the other files' out-of-scope tests listed in ``all_core_scope.py`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: vLLM's test files run: the scheduler, async scheduling, prefix caching, KV cache
#: metrics, deferred block freeing, prefix replay; then the hybrid KV cache groups' files
#: (partial prefix hits and their primitives, Mamba checkpoints on EAGLE resume, the
#: single-type managers, out-of-window frees under in-flight steps). Not run:
#: ``prefix_cache/test_hybrid_prefix_cache_hit_rate.py`` serves Qwen3.5-0.8B through an
#: OpenAI server (model weights, a GPU, vLLM's whole serving stack), not the scheduler.
FILES = [
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_kv_cache_metrics.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_prefix_replay.py",
    "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py",
    "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py",
    "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py",
    "tests/v1/core/test_single_type_kv_cache_manager.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
]

#: Tests that build a KV cache manager kvindex does not support: file -> reason -> tests. A
#: name without ``[...]`` stands for every parametrization of that test function. On
#: kvindex's manager each must fail with kvindex's ``UnsupportedVllmConfigError`` (hybrid KV
#: cache groups are the next step; HiSparse is out of scope). Every listed test passed on
#: vLLM's manager and failed with that error on kvindex's when this list was written.
_HYBRID = "hybrid KV cache groups, not yet supported: "
_MAMBA = (
    "decode context parallelism (dcp_world_size > 1: full attention sharded across ranks "
    "beside Mamba's replicated state snapshots), which kvindex's manager does not run"
)
_SPY = (
    "patches a single-type manager's cache_blocks to watch its calls (kvindex's group views "
    "have none: a caching step is one Rust call over every group)"
)
_SPY_TAIL = (
    "patches a Mamba manager's _cache_partial_tail_block to watch its calls (kvindex's group "
    "views have none: prompt tails are registered in Rust within the caching call)"
)
_FAKE_HIT = (
    "passes free, never-cached blocks as a cache hit to allocate_slots; kvindex's pool "
    "refuses a hit on blocks it has not cached (InvalidArgumentError, state unchanged)"
)
_HISPARSE = "HiSparse resident / hot page groups (out of scope)"
OUT_OF_SCOPE_TESTS: dict[str, dict[str, list[str]]] = {
    "prefix_cache/test_partial_prefix_cache_hits.py": {
        _MAMBA: [
            "test_dcp_fine_hit_retention_uses_hash_alignment",
            "test_dcp_joint_hit_is_bounded_by_replicated_mamba_snapshots",
            "test_dcp_partial_hit_resumes_on_replicated_mamba_snapshot",
            "test_dcp_partial_hit_with_eagle_rewinds_one_hash_unit",
            "test_hybrid_partial_hash_hit_uses_cow_under_dcp[2]",
            "test_hybrid_partial_hash_hit_uses_cow_under_dcp[4]",
        ],
        _SPY: [
            "test_eagle_group_registers_unaligned_tail_under_partial_hash_hits",
        ],
    },
    "prefix_cache/test_mamba_eagle_resume_checkpoint.py": {
        _SPY_TAIL: [
            "test_a_junction_past_the_prompt_falls_back_and_registers_nothing",
        ],
    },
    "test_prefix_caching.py": {
        _HISPARSE: [
            "test_can_fit_full_sequence_hisparse_caps_resident_pages",
            "test_connector_completes_partial_prefix_without_importing_missing_host_kv",
            "test_device_eviction_keeps_host_prefix",
            "test_hisparse_aborted_tail_restore_retains_both_endpoints",
            "test_hisparse_admitted_async_loads_can_finish_with_nothing_running",
            "test_hisparse_async_admission_requires_full_prompt_host_pages",
            "test_hisparse_builds_dma_row_mirrors_across_pages",
            "test_hisparse_capacity_query_does_not_require_hot_blocks",
            "test_hisparse_cleanup_publishes_only_finalized_terminal_pages",
            "test_hisparse_deferred_free_retains_host_blocks_until_fence",
            "test_hisparse_does_not_write_back_reprefillable_tokens",
            "test_hisparse_events_report_host_and_device_placement",
            "test_hisparse_external_import_survives_capacity_retry",
            "test_hisparse_external_import_uses_hard_gpu_footprint",
            "test_hisparse_finished_request_leaves_free_copies",
            "test_hisparse_full_pool_keeps_pages_pinned_until_preemption",
            "test_hisparse_host_backed_request_accepts_local_prefix_hit",
            "test_hisparse_host_cow_copy_is_drained_without_a_gpu_pool",
            "test_hisparse_host_exhaustion_defers_allocation",
            "test_hisparse_host_import_ignores_unsealed_tail",
            "test_hisparse_host_prefix_can_be_completed_by_indexer_offload",
            "test_hisparse_import_capacity_includes_hits_and_cow",
            "test_hisparse_indexer_offload_is_capped_by_missing_host_prefix",
            "test_hisparse_inflight_host_import_reserves_remaining_gpu_pages",
            "test_hisparse_keeps_resident_pages_until_hot_buffer_is_allocated",
            "test_hisparse_materialization_respects_per_step_spill_budget",
            "test_hisparse_materializes_prefix_without_allocating_hot_blocks",
            "test_hisparse_preempted_prefill_resumes_from_durable_prefix",
            "test_hisparse_prefill_reads_host_once_it_fills_admission_window",
            "test_hisparse_prefix_hit_adopts_gpu_shadow_pages",
            "test_hisparse_prefix_hit_under_pressure_adopts_surviving_copies",
            "test_hisparse_readmitted_request_resends_its_full_residency",
            "test_hisparse_recomputation_does_not_complete_failed_host_import",
            "test_hisparse_reports_when_context_is_fully_resident",
            "test_hisparse_reset_prefix_cache_drops_copies",
            "test_hisparse_residency_update_sends_only_changed_pages",
            "test_hisparse_resident_request_can_grow_without_hot_capacity",
            "test_hisparse_reused_copy_is_not_adopted",
            "test_hisparse_terminal_prefix_waits_for_all_workers_and_preserves_identity",
            "test_host_receive_completion_without_spill_metadata",
            "test_nixl_hisparse_full_block_import_keeps_a_writable_tail",
        ],
        _MAMBA: [
            "test_prefix_cache_hit_uses_per_group_dcp_geometry",
        ],
        _FAKE_HIT: [
            "test_cache_hit_local_and_external",
            "test_cache_hit_local_and_external_three_groups",
            "test_cache_hit_local_and_external_three_groups_preempt_and_reallocate",
            "test_cache_hit_local_and_external_two_groups_preempt_and_reallocate",
        ],
    },
    "test_scheduler.py": {
        _HISPARSE: [
            "test_pending_hisparse_reclamation_defers_preemption",
            "test_pending_hisparse_spill_keeps_scheduler_alive",
        ],
    },
}
#: node id (or ``file::function``) -> reason, from the table above.
OUT_OF_SCOPE: dict[str, str] = {
    f"tests/v1/core/{file}::{name}": reason
    for file, by_reason in OUT_OF_SCOPE_TESTS.items()
    for reason, names in by_reason.items()
    for name in names
}

ERROR_NAME = "UnsupportedVllmConfigError"
#: How that error's message begins; a test's own ``pytest.raises(ValueError, match=...)``
#: can catch it and report only the message (the error is a ValueError too).
ERROR_MESSAGE = "kvindex's KVCacheManager supports"
#: Reasons whose tests fail with another error of kvindex's than the one above: the text
#: their failure must hold instead.
REASON_ERRORS: dict[str, str] = {
    _FAKE_HIT: "not a cache hit",
    _SPY: "has no attribute 'cache_blocks'",
    _SPY_TAIL: "has no attribute '_cache_partial_tail_block'",
}


def out_of_scope_reason(nodeid: str) -> str | None:
    reason = OUT_OF_SCOPE.get(nodeid)
    if reason is None and "[" in nodeid:
        reason = OUT_OF_SCOPE.get(nodeid.split("[", 1)[0])
    return reason


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
    # One line per failure: the JUnit report keeps the exception's type and message (all
    # `compare` reads), and pytest's long tracebacks of the ~400 out-of-scope failures cost
    # about three times the swapped run's test time (15 s against 52 s for
    # test_prefix_caching.py alone). Rerun a file by hand for a full traceback.
    return [
        vpy, "-m", "pytest", "--noconftest", *plugins, "-p", "no:cacheprovider", "-q", "--tb=line",
        "-o", "junit_family=xunit1", f"--junitxml={junit}", *files,
    ]  # fmt: skip


def compare(
    stock: dict[str, tuple[str, str]], swapped: dict[str, tuple[str, str]]
) -> tuple[list[str], dict[str, Counter[str]]]:
    """The problems (each a line naming the test) and the per-file outcome counts of the two
    runs' results: a stock pass must pass on kvindex unless listed out of scope; a listed
    one must fail with kvindex's error."""
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
        elif (
            reason in REASON_ERRORS
            and REASON_ERRORS[reason] not in s_text
            or reason not in REASON_ERRORS
            and ERROR_NAME not in s_text
            and ERROR_MESSAGE not in s_text
        ):
            first = s_text.strip().splitlines()[0] if s_text.strip() else ""
            problems.append(f"OUT OF SCOPE ({reason}), not {ERROR_NAME}: {nodeid}: {first[:300]}")
        else:
            c["out_of_scope"] += 1
    for nodeid in sorted(set(swapped) - set(stock)):
        problems.append(f"only in the kvindex run: {nodeid}")
    return problems, per_file


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
    ap.add_argument(
        "--all-core",
        action="store_true",
        help="run vLLM's whole tests/v1/core (reports in ENV_DIR/results-all-core)",
    )
    ap.add_argument(
        "--compare-only", action="store_true", help="compare the reports of the last run again"
    )
    args = ap.parse_args()
    env_dir = args.env_dir.resolve()
    src = env_dir / "vllm-src"
    # The whole folder has files that need what this environment lacks (an OpenAI server,
    # a GPU): they fail to collect on both managers and are reported, not compared.
    files = ["--continue-on-collection-errors", "tests/v1/core"] if args.all_core else args.files
    if args.all_core:  # the other files' out-of-scope tests, listed beside this script
        from all_core_scope import ALL_CORE_OUT_OF_SCOPE_TESTS

        OUT_OF_SCOPE.update(
            (f"tests/v1/core/{file}::{name}", reason)
            for file, by_reason in ALL_CORE_OUT_OF_SCOPE_TESTS.items()
            for reason, names in by_reason.items()
            for name in names
        )
    out = env_dir / ("results-all-core" if args.all_core else "results")
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
    runs: dict[str, tuple[subprocess.Popen[bytes] | None, Path]] = {}
    t0 = time.monotonic()
    for label, swap in (("stock", False), ("kvindex", True)):
        if args.compare_only:
            runs[label] = (None, out / f"{label}.xml")
            continue
        junit = out / f"{label}.xml"
        junit.unlink(missing_ok=True)
        log = open(out / f"{label}.log", "w", encoding="utf-8")
        cmd = pytest_command(vpy, files, junit, swap)
        print(f"[{label}] {' '.join(cmd)}  (log: {log.name})", flush=True)
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs[label] = (proc, junit)
        if args.sequential:
            proc.wait()
        log.close()  # the child holds its own copy
    for label, (proc, _) in runs.items():
        if proc is None:
            continue
        rc = proc.wait()
        tail = (out / f"{label}.log").read_text(encoding="utf-8").strip().splitlines()[-1:]
        print(f"[{label}] exit {rc}: {tail[0] if tail else '(no output)'}")
        if rc not in (0, 1):  # 1: some tests failed; anything else (usage, crash) is fatal
            print(f"the {label} run ended abnormally (exit {rc})", file=sys.stderr)
            return 1
    print(f"both runs: {time.monotonic() - t0:.0f} s wall")

    stock_xml, swap_xml = runs["stock"][1], runs["kvindex"][1]
    if not stock_xml.exists() or not swap_xml.exists():
        print("a run left no JUnit report (see its log)", file=sys.stderr)
        return 1
    report = json.loads((out / "swap.json").read_text(encoding="utf-8"))
    stock = parse_junit(stock_xml, src)
    swapped = parse_junit(swap_xml, src)

    problems, per_file = compare(stock, swapped)

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
    in_scope = totals["stock_passed"] - totals["out_of_scope"]
    print(
        f"vLLM suite on kvindex: all {in_scope} in-scope tests that pass on vLLM's manager pass "
        f"on kvindex's; the other {totals['out_of_scope']} of its {totals['stock_passed']} "
        f"passes are out of scope and fail with {ERROR_NAME}, as listed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
