"""``kvindex explain`` and :func:`kvindex.explain`: the presets as vLLM 0.33 groups their
models' layers, the JSON layout format and its errors, the figures of a repeated prompt
(computed by the core group rules) on hand-worked layouts, the 0%-hit checks, traces, and
the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvindex
from kvindex.__main__ import main as kvindex_main
from kvindex.layouts import PRESETS, Group, Layout, load_layout, parse_layout


def test_presets_group_as_vllm_does() -> None:
    def shape(name: str) -> list[tuple[str, int, int]]:
        return [(g.kind, g.block_size, g.layers) for g in PRESETS[name].groups]

    # 18 sliding + 18 full layers: two groups of 18, the sliding one first (layer 0).
    assert shape("gpt-oss") == [("sliding_window", 16, 18), ("full_attention", 16, 18)]
    # 52 local + 10 global: group size 10, six local groups (the last padded), one global.
    assert shape("gemma3") == [("sliding_window", 16, 10)] * 6 + [("full_attention", 16, 10)]
    assert PRESETS["gemma3"].groups[0].window == 1024
    assert PRESETS["gemma3-1b"].groups[0].window == 512
    assert shape("llama4") == [("chunked_local_attention", 16, 12)] * 3 + [
        ("full_attention", 16, 12)
    ]
    assert PRESETS["llama4"].groups[0].chunk == 8192
    # The attention block holds one gated delta-net state: 16 * ceil(1097728 / (16 * 2048)).
    assert shape("qwen3-next") == [("mamba", 544, 12)] * 3 + [("full_attention", 544, 12)]
    assert shape("deepseek-v3.2") == [("mla_attention", 64, 61)] * 2
    for layout in PRESETS.values():
        assert parse_layout(json.loads(json.dumps(layout.to_json()))) == layout
        assert layout.source


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ([], "JSON object"),
        ({"groups": []}, "non-empty"),
        ({"groups": [{"kind": "full_attention"}]}, "block_size is required"),
        ({"groups": [{"kind": "nope", "block_size": 16}]}, "kind must be one of"),
        ({"groups": [{"kind": "sliding_window", "block_size": 16}]}, "window is required"),
        ({"groups": [{"kind": "full_attention", "block_size": 16, "window": 4}]}, "does not apply"),
        ({"groups": [{"kind": "full_attention", "block_size": 0}]}, "block_size must be in"),
        ({"groups": [{"kind": "full_attention", "block_size": True}]}, "must be an integer"),
        (
            {"groups": [{"kind": "mamba", "block_size": 16, "mamba_cache_mode": "all"}]},
            "mamba_cache_mode",
        ),
        ({"groups": [{"kind": "full_attention", "block_size": 16, "colour": 1}]}, "unknown field"),
        ({"groups": [{"kind": "full_attention", "block_size": 16}], "extra": 1}, "unknown field"),
        ({"groups": ["x"]}, "must be an object"),
        ({"groups": [{"kind": "full_attention", "block_size": 16}] * 65}, "at most 64"),
    ],
)
def test_bad_layouts_name_the_field(doc: Any, needle: str) -> None:
    with pytest.raises(kvindex.InvalidArgumentError, match=needle):
        parse_layout(doc)


def test_layout_files_and_names(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text(
        json.dumps({"name": "m", "groups": [{"kind": "full_attention", "block_size": 32}]})
    )
    assert load_layout(f).groups == (Group("full_attention", 32),)
    assert load_layout("gemma3") is PRESETS["gemma3"]
    with pytest.raises(kvindex.InvalidArgumentError, match="neither a preset"):
        load_layout(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(kvindex.InvalidArgumentError, match="cannot read"):
        load_layout(tmp_path / "bad.json")


def layout(*groups: Group) -> Layout:
    return Layout("t", groups)


def test_repeated_prompt_figures() -> None:
    full = layout(Group("full_attention", 16))
    r = kvindex.explain(full, 100)
    assert (r["hit_tokens"], r["min_prompt"], r["alignment"]) == (96, 17, 16)
    # Block sizes 16 and 64: hashes at 16, hits aligned to the lcm.
    r = kvindex.explain(layout(Group("full_attention", 16), Group("full_attention", 64)), 100)
    assert (r["hash_block_size"], r["alignment"], r["hit_tokens"]) == (16, 64, 64)
    # A window of 32 keeps 2 blocks of 16: the hit keeps them and nulls the rest.
    r = kvindex.explain(
        layout(Group("full_attention", 16), Group("sliding_window", 16, window=32)), 100
    )
    swa = r["sets"][1]
    assert (swa["window_blocks"], swa["reused"], swa["nulls"], r["hit_tokens"]) == (2, 2, 4, 96)
    # Mamba in align mode: prefilled at once the only state is at 96, past the bound of 95.
    m = layout(Group("full_attention", 16), Group("mamba", 16, mamba_cache_mode="align"))
    r = kvindex.explain(m, 96)
    assert r["hit_tokens"] == 0 and r["full_attention_hit_tokens"] == 80
    assert r["sets"][1]["loss"] == 80
    assert kvindex.explain(m, 96, chunk=32)["hit_tokens"] == 64


def test_zero_hit_causes_are_checked() -> None:
    def status(r: dict[str, Any], check: str) -> str:
        return next(c["status"] for c in r["checks"] if c["check"] == check)

    q = kvindex.explain("qwen3-next", 500)
    assert q["hit_tokens"] == 0 and status(q, "block_size_alignment") == "fail"
    off = kvindex.explain("qwen3-next", 5000, mamba_cache_mode="none")
    assert off["hit_tokens"] == 0 and status(off, "mamba_cache_mode") == "fail"
    assert "align" in off["layout_error"]
    on = kvindex.explain("qwen3-next", 5000)
    assert on["hit_tokens"] == 4896 and status(on, "mamba_cache_mode") == "ok"
    g = kvindex.explain("gemma3", 3000)
    assert status(g, "router_events") == "warn" and "Group 0 is sliding_window" in next(
        c["message"] for c in g["checks"] if c["check"] == "router_events"
    )
    assert not any(
        c["check"] == "router_events" for c in kvindex.explain("deepseek-v3.2", 3000)["checks"]
    )
    # A full-attention block larger than the hash block: prompt tails' partial entries.
    wide = layout(Group("full_attention", 32), Group("sliding_window", 16, window=64))
    w = kvindex.explain(wide, 1000)
    assert status(w, "partial_block_entries") == "ok" and "groups [0]" in next(
        c["message"] for c in w["checks"] if c["check"] == "partial_block_entries"
    )
    assert not any(c["check"] == "partial_block_entries" for c in g["checks"])
    with pytest.raises(kvindex.InvalidArgumentError):
        kvindex.explain("gemma3", 0)
    with pytest.raises(kvindex.InvalidArgumentError):
        kvindex.explain("gemma3")
    with pytest.raises(kvindex.InvalidArgumentError):
        kvindex.explain("gemma3", 10, mamba_cache_mode="sometimes")


def test_trace(tmp_path: Path) -> None:
    t = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 1400, "output_length": 4, "hash_ids": [1, 2, 4]},
    ]
    t.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = kvindex.explain("qwen3-next", trace=t)
    # The second request shares 1024 tokens: 544 of them on the alignment.
    assert (r["requests"], r["shared_prefix_tokens"], r["hit_tokens_upper_bound"]) == (2, 1024, 544)
    assert r["zero_hit_requests"] == 1 and r["alignment_lost_tokens"] == 480


def test_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert kvindex_main(["explain", "gpt-oss", "--prompt-tokens", "1000"]) == 0
    out = capsys.readouterr().out
    assert "group 0: sliding_window" in out and "checks:" in out
    assert kvindex_main(["explain", "llama4", "--prompt-tokens", "20000", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"] == "llama4" and r["hit_tokens"] > 0
    assert kvindex_main(["explain", "nope", "--prompt-tokens", "5"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert kvindex_main(["explain", "gemma3", "--trace", str(tmp_path / "absent")]) == 2
