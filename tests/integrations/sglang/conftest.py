"""``with_sglang/`` needs SGLang 0.5.23 installed (``make sglang-suite`` runs it in the
environment ``setup_env.sh`` builds, with KVINDEX_REQUIRE_SGLANG=1 so that a missing SGLang
fails instead of leaving the folder out); a plain ``pytest tests`` in kvindex's own
environment, which has no SGLang, leaves it out. Everything else here runs without SGLang."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

_have = importlib.util.find_spec("sglang") is not None
if not _have and os.environ.get("KVINDEX_REQUIRE_SGLANG") == "1":
    raise RuntimeError(
        "KVINDEX_REQUIRE_SGLANG=1 but SGLang is not importable: build the environment with "
        "tests/integrations/sglang/setup_env.sh (make sglang-suite)"
    )
collect_ignore = [] if _have else ["with_sglang", "sglang_driver.py"]
# The driver (sglang_driver.py) is imported by name by the tests and by benches/bench_sglang.py.
sys.path.insert(0, str(Path(__file__).resolve().parent))
