"""``kvindex simulate``'s exact figures, pinned: hit rates, token counts, evictions, waits,
preemptions, peaks and steps must stay byte-identical in ``--json`` whatever is done to make
the simulator faster (parallel processes, a different exact matcher, vectorised scheduler
bookkeeping).

``tests/data/simulate_pinned.json`` was written by the simulator before those changes, with the
arguments stored next to each case. When the simulator moved both designs onto one chunk
semantics (vLLM's: a chunk's blocks are cacheable from the step that schedules them), the
default cases ``trace150`` and ``chat150`` were recorded again; ``*_prefill`` and
``chat150_finish`` keep the earlier figures of the alternative whole-prompt-admission model
(``--radix-insert prefill|finish``), unchanged.

``data/mooncake_synthetic_head150.jsonl`` is the first 150 lines of the Mooncake FAST'25
synthetic trace (kvcache-ai/Mooncake, ``FAST25-release/traces/synthetic_trace.jsonl``,
Apache-2.0), copied from the project's shared trace directory.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from kvindex.__main__ import main as kvindex_main

DATA = Path(__file__).resolve().parents[1] / "data"
PINNED: dict[str, Any] = json.loads((DATA / "simulate_pinned.json").read_text())
HIT = ("requests", "prompt_tokens", "hit_tokens", "hit_rate")


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("case", sorted(PINNED))
def test_exact_figures_are_pinned(case: str, jobs: str, tmp_path: Path) -> None:
    want = PINNED[case]
    out = tmp_path / "r.json"
    argv = shlex.split(want["args"].format(data=DATA))
    assert kvindex_main([*argv, "--quiet", "--jobs", jobs, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["theoretical_max_hit_rate"] == want["theoretical_max_hit_rate"]
    assert [{k: c[k] for k in ("design", "block_size", *HIT)} for c in got["ceilings"]] == want[
        "ceilings"
    ]
    runs = [{k: v for k, v in r.items() if k != "timing"} for r in got["runs"]]
    assert len(runs) == len(want["runs"])
    for g, w in zip(runs, want["runs"], strict=True):
        assert g == w, (g["design"], g["block_size"], g["capacity"])
