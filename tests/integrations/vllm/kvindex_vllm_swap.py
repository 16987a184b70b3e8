"""pytest plugin: vLLM's tests run with kvindex's ``KVCacheManager`` in place of vLLM's.

Enabled with ``-p kvindex_vllm_swap`` (this folder on ``PYTHONPATH``). At configure time,
before any test module is imported, the name ``KVCacheManager`` in
``vllm.v1.core.kv_cache_manager`` (where tests import it from) and in
``vllm.v1.core.sched.scheduler`` (what ``Scheduler.__init__`` builds), and in every other
loaded ``vllm`` module holding vLLM's class, becomes
:class:`kvindex.integrations.vllm.manager.KVCacheManager`. Nothing falls back to vLLM's
manager: a configuration kvindex does not support raises its error in the test.

At session end the plugin fails the run unless kvindex's manager was constructed at least
once, so a swap that silently stopped taking effect cannot pass as green. With
``KVINDEX_VLLM_SWAP_REPORT=<path>`` it also writes the construction count there as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

_state: dict[str, Any] = {"constructed": 0, "patched": []}


def pytest_configure(config: pytest.Config) -> None:
    import vllm.v1.core.kv_cache_manager as manager_module
    import vllm.v1.core.sched.scheduler  # noqa: F401  (loaded so that it is patched too)

    from kvindex.integrations.vllm.hybrid import HybridKVCacheManager
    from kvindex.integrations.vllm.manager import KVCacheManager

    stock = manager_module.KVCacheManager
    assert stock is not KVCacheManager, "the swap plugin was configured twice"
    # Both classes count: constructing KVCacheManager for several groups returns the other.
    for cls in (KVCacheManager, HybridKVCacheManager):
        original_init = cls.__init__

        def counting_init(self: Any, *args: Any, _init: Any = original_init, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            _state["constructed"] += 1

        counting_init.__wrapped__ = original_init  # type: ignore[attr-defined]
        cls.__init__ = counting_init  # type: ignore[method-assign]
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "vllm" and getattr(module, "KVCacheManager", None) is stock:
            module.KVCacheManager = KVCacheManager  # type: ignore[attr-defined]
            _state["patched"].append(name)
    assert "vllm.v1.core.sched.scheduler" in _state["patched"], _state["patched"]
    assert "vllm.v1.core.kv_cache_manager" in _state["patched"], _state["patched"]


def pytest_report_header(config: pytest.Config) -> str:
    return "kvindex swap: KVCacheManager replaced in " + ", ".join(sorted(_state["patched"]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    report = os.environ.get("KVINDEX_VLLM_SWAP_REPORT")
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump({"constructed": _state["constructed"], "patched": _state["patched"]}, f)
    ran = session.testscollected > 0 and not session.config.option.collectonly
    if ran and _state["constructed"] == 0:
        print(
            "\nkvindex swap: kvindex's KVCacheManager was never constructed: the swap did not "
            "take effect",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(
        f"kvindex swap: kvindex's KVCacheManager constructed {_state['constructed']} times"
    )
