"""``kvindex simulate --model``: a workload through a hybrid model's KV cache groups next to
the same model as full attention (hit rate, memory per cached token, each group's loss),
computed by the core group rules; the default run still needs no file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvindex.__main__ import main as kvindex_main
from kvindex.layouts import PRESETS, Group, Layout
from kvindex.simulate.hybrid import simulate_model
from kvindex.simulate.workloads import Request, Workload


class Fixed(Workload):
    """Prompts given as arrays, outputs of a few unique tokens."""

    def __init__(self, prompts: list[np.ndarray], out: int = 4) -> None:
        reqs = [Request(i, len(p), out, i) for i, p in enumerate(prompts)]
        offsets = np.cumsum([0] + [out] * len(prompts))[:-1].astype(np.int64)
        super().__init__("fixed", reqs, offsets, {})
        self._p = prompts

    def prompt(self, rid: int) -> np.ndarray:
        return self._p[rid]


def test_mamba_states_only_where_a_chunk_ended() -> None:
    full = Group("full_attention", 16, layers=1, token_bytes=64)
    mamba = Group("mamba", 16, layers=1, mamba_cache_mode="align", token_bytes=1600)
    lay = Layout("t", (full, mamba))
    base = np.arange(200, dtype=np.int32)
    # Request 1 caches 96 tokens + its output; request 2 shares 64 tokens of it.
    wl = Fixed([base[:100], np.concatenate([base[:64], 10_000 + base[:36]])])
    r = simulate_model(lay, wl)
    hc = r["hash_chain"]
    # Full attention reuses 64 tokens of request 2; Mamba has no state at 64: nothing.
    assert hc["full_attention"]["hit_tokens"] == 64
    assert hc["layout"]["hit_tokens"] == 0
    mamba_set = next(s for s in hc["layout"]["sets"] if s["kind"] == "mamba")
    assert mamba_set["loss_tokens"] == 64
    # Prefilled in chunks of 32 the first request leaves a state at 64.
    assert simulate_model(lay, wl, chunk=32)["hash_chain"]["layout"]["hit_tokens"] == 64
    # Memory: a Mamba block is one state (1600 B) per cached block, full 16 x 64 B.
    x = hc["layout"]
    assert x["memory_bytes"] == x["cached_blocks"][0] * 16 * 64 + x["cached_blocks"][1] * 1600


def test_radix_sliding_window_tombstones_cost_hits_and_save_memory() -> None:
    full = Group("full_attention", 16, layers=1, token_bytes=64)
    swa = Group("sliding_window", 16, layers=1, window=32, token_bytes=64)
    base = np.arange(300, dtype=np.int32)
    wl = Fixed([base[:200], np.concatenate([base[:100], 10_000 + base[:36]])])
    r = simulate_model(Layout("t", (full, swa)), wl)["radix"]
    # The all-full tree reuses 96 tokens of request 2; with the window, request 1 freed
    # the SWA KV before its last 32 tokens (a tombstone there): nothing hits.
    assert r["full_attention"]["hit_tokens"] == 96
    x = r["layout"]
    assert x["hit_tokens"] == 0
    kinds = {k["kind"]: k["loss_tokens"] for k in x["kinds"]}
    assert kinds == {"full_attention": 0, "sliding_window": 96}
    # The tree: 12 + 2 full pages; live SWA only the last 32 tokens of each request.
    assert (x["cached_tokens"], x["swa_live_tokens"]) == (224, 64)
    assert x["memory_bytes"] == 224 * 64 + 64 * 64


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_presets_run(model: str) -> None:
    wl = Fixed([np.arange(n, dtype=np.int32) for n in (3000, 3500, 3000)])
    r = simulate_model(PRESETS[model], wl)
    hc = r["hash_chain"]
    assert 0 < hc["layout"]["hit_rate"] <= hc["full_attention"]["hit_rate"]
    assert hc["layout"]["bytes_per_cached_token"] > 0
    rx = r["radix"]
    if PRESETS[model].name == "llama4":
        assert "chunked local" in rx["refused"]
    else:
        # Nothing evicted: the radix tree hits what the hash chain hits on these prompts.
        assert 0 < rx["layout"]["hit_rate"] <= rx["full_attention"]["hit_rate"]
        assert rx["layout"]["hit_tokens"] == hc["layout"]["hit_tokens"]
        assert (
            rx["layout"]["bytes_per_cached_token"] <= rx["full_attention"]["bytes_per_cached_token"]
        )


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    argv = ["simulate", "--model", "qwen3-next", "--requests", "40", "--quiet", "--json", str(out)]
    assert kvindex_main(argv) == 0
    text = capsys.readouterr().out
    assert "all full attention" in text and "mamba" in text and "radix:" in text
    r = json.loads(out.read_text())
    assert r["model"] == "qwen3-next" and r["hash_chain"]["layout"]["prompt_tokens"] > 0
    # A custom layout file, and Mamba caching off: nothing can hit.
    f = tmp_path / "l.json"
    f.write_text(json.dumps(PRESETS["gemma3-1b"].to_json()))
    assert kvindex_main(["simulate", "--model", str(f), "--requests", "20", "--quiet"]) == 0
    assert kvindex_main(["simulate", "--model", "nope", "--requests", "20", "--quiet"]) != 0
    r = simulate_model(
        PRESETS["qwen3-next"].with_mamba_cache_mode("none"), Fixed([np.arange(2000)] * 2)
    )
    assert r["hash_chain"]["layout"]["hit_tokens"] == 0
    assert r["hash_chain"]["full_attention"]["hit_tokens"] > 0


def test_model_options_conflicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvindex_main(["simulate", "--model", "gemma3", "--cluster", "2", "--quiet"]) == 2
    assert "does not combine with --cluster" in capsys.readouterr().err
    argv = ["simulate", "--mamba-cache-mode", "none", "--requests", "20", "--quiet"]
    argv += ["--capacity", "inf", "--block-size", "16"]
    assert kvindex_main(argv) == 0
    assert "applies to --model only" in capsys.readouterr().err
