"""Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (the Makefile exports ``ci``).

- ``ci`` (``make test``, ``make dev``): derandomized, so every run draws the same examples
  and a failure reproduces exactly; no example database, so nothing left over from an
  earlier local run changes what is tested.
- ``soak`` (``make soak``): fresh random examples every run and 10x the ``ci`` count where a
  test does not set its own; failures are saved to ``.hypothesis/`` and replayed first on
  the next run.
- ``dev`` (the default when the variable is unset): random, few examples, for a quick
  ``pytest`` by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "soak",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
