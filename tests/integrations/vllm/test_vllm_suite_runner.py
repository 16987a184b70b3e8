"""The stock-vs-kvindex comparison of ``run_vllm_suite.py`` on made-up JUnit reports: what
counts as a regression, and that the out-of-scope list can neither hide a wrong failure nor
go stale silently."""

from __future__ import annotations

from pathlib import Path

import pytest
import run_vllm_suite as suite

SCHED = "tests/v1/core/test_scheduler.py"
LISTED = "tests/v1/core/test_prefix_caching.py::test_prefix_cache_hit_uses_per_group_dcp_geometry"
OURS = "kvindex.integrations.vllm.errors.UnsupportedVllmConfigError: kvindex's KVCacheManager"


def test_listed_functions_cover_their_parametrizations() -> None:
    assert suite.out_of_scope_reason(LISTED) is not None
    assert suite.out_of_scope_reason(LISTED + "[2-True]") is not None
    assert suite.out_of_scope_reason(LISTED + "_other") is None
    assert suite.out_of_scope_reason(f"{SCHED}::test_basic") is None


def test_same_results_have_no_problems() -> None:
    stock = {f"{SCHED}::a": ("passed", ""), f"{SCHED}::b": ("failed", "boom")}
    problems, per_file = suite.compare(stock, dict(stock))
    assert problems == []
    assert per_file[SCHED]["stock_passed"] == 1 and per_file[SCHED]["kvindex_failed"] == 1


def test_a_stock_pass_failing_on_kvindex_is_a_regression() -> None:
    stock = {f"{SCHED}::a": ("passed", "")}
    problems, _ = suite.compare(stock, {f"{SCHED}::a": ("failed", "AssertionError: 3 != 4")})
    assert len(problems) == 1 and problems[0].startswith("REGRESSION") and "3 != 4" in problems[0]
    problems, _ = suite.compare(stock, {})
    assert problems and "missing" in problems[0]


@pytest.mark.parametrize(
    ("outcome", "text", "ok"),
    [
        ("failed", OURS + " supports exactly one KV cache group", True),
        (
            "failed",
            "Regex pattern did not match. Actual message: \"kvindex's KVCacheManager supports",
            True,
        ),
        ("failed", "AssertionError: wrong hit count", False),
        ("error", "AttributeError: no attribute 'coordinator'", False),
        ("passed", "", False),
    ],
)
def test_an_out_of_scope_test_must_fail_with_kvindexs_error(
    outcome: str, text: str, ok: bool
) -> None:
    problems, per_file = suite.compare({LISTED: ("passed", "")}, {LISTED: (outcome, text)})
    assert (problems == []) is ok, problems
    assert per_file["tests/v1/core/test_prefix_caching.py"]["out_of_scope"] == int(ok)


def test_tests_only_the_kvindex_run_saw_are_reported() -> None:
    problems, _ = suite.compare({}, {f"{SCHED}::new": ("passed", "")})
    assert problems == [f"only in the kvindex run: {SCHED}::new"]


def test_junit_node_ids_are_rebuilt_from_classnames(tmp_path: Path) -> None:
    (tmp_path / "tests" / "v1" / "core").mkdir(parents=True)
    (tmp_path / SCHED).write_text("", encoding="utf-8")
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.v1.core.test_scheduler" name="test_a[1-x.y]"/>'
        '<testcase classname="tests.v1.core.test_scheduler.TestK" name="test_b">'
        '<failure message="AssertionError: no">trace</failure></testcase>'
        '<testcase classname="tests.v1.core.test_scheduler" name="test_c">'
        '<skipped message="needs a GPU"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    got = suite.parse_junit(report, tmp_path)
    assert got[f"{SCHED}::test_a[1-x.y]"] == ("passed", "")
    assert got[f"{SCHED}::TestK::test_b"] == ("failed", "AssertionError: no\ntrace")
    assert got[f"{SCHED}::test_c"] == ("skipped", "needs a GPU")


def test_a_reason_may_name_another_error_of_kvindexs() -> None:
    fake = "tests/v1/core/test_prefix_caching.py::test_cache_hit_local_and_external"
    assert suite.out_of_scope_reason(fake) in suite.REASON_ERRORS
    ok = "InvalidArgumentError: block 1 is not cached for group 0: not a cache hit"
    problems, _ = suite.compare({fake: ("passed", "")}, {fake: ("failed", ok)})
    assert problems == []
    problems, _ = suite.compare({fake: ("passed", "")}, {fake: ("failed", OURS + " supports")})
    assert len(problems) == 1 and problems[0].startswith("OUT OF SCOPE")


def test_the_whole_folder_list_leaves_the_ci_files_to_the_ci_list() -> None:
    # A CI file's out-of-scope tests live in one list only (run_vllm_suite.OUT_OF_SCOPE_TESTS),
    # so a test hybrid-group support made pass cannot stay listed as out of scope elsewhere.
    from all_core_scope import ALL_CORE_OUT_OF_SCOPE_TESTS

    ci = {f.removeprefix("tests/v1/core/") for f in suite.FILES}
    assert not ci & set(ALL_CORE_OUT_OF_SCOPE_TESTS)
