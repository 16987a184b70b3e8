"""``kvindex simulate`` on one chunk semantics for both designs (vLLM's: a prefill chunk's
full blocks are cacheable from the step that schedules them), against the alternative
whole-prompt-admission model (``--radix-insert prefill|finish``), in which the hash chain
caches a prompt at admission and the radix tree only when its prefill completes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvindex.__main__ import main as kvindex_main
from kvindex.simulate import (
    ArrayWorkload,
    Request,
    RunSpec,
    chat_workload,
    parse_capacity,
    simulate_run,
)

PAIRS, PROMPT, OUTPUT = 10, 20_480, 16


def _pairs_trace(path: Path) -> Path:
    """10 pairs of identical 20,480-token prompts (40 Mooncake blocks of 512), the two of a
    pair arriving together, the pairs far apart; no two pairs share a block."""
    with path.open("w") as f:
        for p in range(PAIRS):
            ids = [p * 1000 + i for i in range(PROMPT // 512)]
            line = {
                "timestamp": p * 100_000,
                "input_length": PROMPT,
                "output_length": OUTPUT,
                "hash_ids": ids,
            }
            f.write((json.dumps(line) + "\n") * 2)
    return path


def _simulate(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "r.json"
    trace = _pairs_trace(tmp_path / "pairs.jsonl")
    argv = ["--trace", str(trace), "--capacity", "inf", "--quiet", "--jobs", "1"]
    assert kvindex_main([*argv, "--json", str(out), *extra]) == 0
    runs: dict[str, Any] = {r["design"]: r for r in json.loads(out.read_text())["runs"]}
    return runs


def test_identical_long_prompts_together_hit_the_same_tokens_in_both_designs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chunks of 8,192 tokens: the first of a pair schedules its prompt in three steps; the
    second is admitted in the third step and hits every full block of it (20,464 tokens,
    the last block recomputed) in both designs."""
    runs = _simulate(tmp_path)
    assert "chunk semantics (both designs, vLLM's)" in capsys.readouterr().out
    want = PAIRS * (PROMPT - 16)
    for design in ("hash_chain", "radix"):
        r = runs[design]
        assert r["radix_insert"] == "schedule" and r["max_batched_tokens"] == 8192
        assert r["hit_tokens"] == want, design
        assert round(r["hit_rate"], 4) == 0.4996
        assert r["not_cached"] == 0


def test_the_alternative_model_gives_the_designs_different_chunk_semantics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whole-prompt admission: the hash chain caches the first prompt at admission, before
    its KV exists, and the second hits it; the radix tree inserts it when its prefill
    completes, after the second was admitted, which hits nothing."""
    runs = _simulate(tmp_path, "--radix-insert", "prefill")
    assert "alternative model (--radix-insert prefill)" in capsys.readouterr().out
    assert runs["hash_chain"]["hit_tokens"] == PAIRS * (PROMPT - 16)
    assert runs["radix"]["hit_tokens"] == 0
    assert runs["radix"]["not_cached"] == PAIRS * (PROMPT - 16)


def _groups_together(prompt_lens: list[int], shared: int) -> ArrayWorkload:
    """Requests arriving together in groups of three: a group shares its first ``shared``
    tokens, then each prompt goes its own way."""
    rng = np.random.default_rng(3)
    reqs: list[Request] = []
    prompts = []
    for g in range(len(prompt_lens) // 3):
        head = rng.integers(0, 30_000, shared, dtype=np.int32)
        for k in range(3):
            rid = 3 * g + k
            n = prompt_lens[rid]
            tail = rng.integers(0, 30_000, max(n - shared, 0), dtype=np.int32)
            prompts.append(np.concatenate((head, tail))[:n])
            reqs.append(Request(rid, n, 8, 40 * g))
    offsets = np.arange(0, 8 * len(reqs) + 1, 8, dtype=np.int64)[:-1]
    return ArrayWorkload("groups", reqs, prompts, offsets, {})


@pytest.mark.parametrize("chunk", [64, 1000, 8192])
@pytest.mark.parametrize("bs", [1, 16])
def test_both_designs_hit_the_same_tokens_at_every_chunk_size(chunk: int, bs: int) -> None:
    wl = _groups_together([3000, 2500, 4100, 700, 5000, 5000, 1200, 1199, 1300], shared=1200)
    hits = {
        d: simulate_run(
            wl, RunSpec(d, bs, parse_capacity("inf"), max_batched_tokens=chunk), check_every=1
        ).tally
        for d in ("hash_chain", "radix")
    }
    assert hits["hash_chain"].hit_tokens == hits["radix"].hit_tokens > 0
    assert hits["hash_chain"].not_cached == hits["radix"].not_cached


@pytest.mark.parametrize("bs", [1, 16])
def test_chat_workload_at_infinite_capacity_hits_the_same_in_both_designs(bs: int) -> None:
    wl = chat_workload(200, seed=11)
    t = {
        d: simulate_run(wl, RunSpec(d, bs, parse_capacity("inf"))).tally
        for d in ("hash_chain", "radix")
    }
    assert t["hash_chain"].hit_tokens == t["radix"].hit_tokens


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_chunked_runs_under_pressure_keep_the_caches_consistent(design: str) -> None:
    """A pool that forces waits and preemptions while prefills are chunked: invariants after
    every step, every request finished, resumed admissions counted apart."""
    wl = chat_workload(120, seed=4)
    res = simulate_run(
        wl,
        RunSpec(design, 4, parse_capacity("10k"), max_running=24, max_batched_tokens=512),
        check_every=1,
    )
    assert res.preemptions > 0 and res.waits > 0 and res.resumed_tokens > 0
    assert res.tally.requests == len(wl)
    assert res.peak_blocks <= res.usable_blocks
