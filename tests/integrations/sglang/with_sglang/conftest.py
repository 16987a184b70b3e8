"""Tests that run SGLang 0.5.23's own cache code on CPU (see ../conftest.py). SGLang's import
chain warns about CUDA-only kernels on CPU; those import-time warnings are silenced here so
the repository's filterwarnings=error applies to the tests themselves."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import sglang_driver  # noqa: F401  (imports SGLang's cache modules once)
