"""Kernel tests: Triton's interpreter on CPU unless TRITON_INTERPRET=0 (then on CUDA).

TRITON_INTERPRET is read when ``@triton.jit`` runs, so it is set here, before any test
module imports ``kvindex.kernels``. torch and triton are required: a missing one fails the
run instead of skipping it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

# The tests' tensors are tiny; several torch threads on a shared 2-core machine spin
# against each other and the interpreter (up to 100x slower matmuls).
torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # for paged_testlib, whatever pytest's import mode
    sys.path.insert(0, str(HERE))


# Triton 3.6's interpreter turns a loop bound loaded from memory into a Python int through
# a 1-element array, which numpy >= 1.25 deprecates (triton-lang/triton#9171). Not ours.
INTERPRETER_WARNING = "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.kernels)
            item.add_marker(pytest.mark.filterwarnings(INTERPRETER_WARNING))
    # Start the sm_90 compile check now, in a child process, so that it overlaps the
    # interpreter tests; test_sm90_compile.py collects the result.
    wanted = any(item.name.startswith("test_every_configuration_compiles") for item in items)
    if wanted and not config.option.collectonly:
        from sm90_job import STASH_KEY, start_check

        proc, report = start_check()
        config.stash[STASH_KEY] = (proc, report)
        config.add_cleanup(proc.kill)
