"""Shared test configuration: hypothesis profiles and paths to ../shared."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

# "ci": deterministic (derandomized) with enough examples to mean something.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
