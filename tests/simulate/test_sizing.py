"""KV pool sizing from a memory budget: bytes per token, the engines' budget
rules, memory capacities in ``kvindex simulate``, and bad units and shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvindex
from kvindex.simulate import SimulationError, parse_capacity
from kvindex.simulate.cli import main as simulate_main
from kvindex.sizing import (
    ModelShape,
    SizingError,
    kv_budget_bytes,
    kv_bytes_per_token,
    kv_pool_size,
    parse_bytes,
)

GIB = 2**30
LLAMA3_8B = "layers=32,kv_heads=8,head_dim=128,dtype=bf16"


def test_bytes_per_token_known_shapes() -> None:
    assert kvindex.kv_bytes_per_token(32, 8, 128, "bf16") == 131_072  # Llama-3-8B-like
    assert kv_bytes_per_token(32, 8, 128, "fp8") == 65_536
    assert kv_bytes_per_token(32, 8, 128, "float32") == 262_144
    assert kv_bytes_per_token(80, 8, 128, "torch.bfloat16") == 327_680  # Llama-3-70B-like
    assert kv_bytes_per_token(28, 2, 128, 2) == 28_672  # Qwen2.5-1.5B-like, dtype as bytes
    assert kv_bytes_per_token(32, 32, 128, "fp16") == 524_288  # Llama-2-7B (MHA)


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ((0, 8, 128, "bf16"), "num_layers"),
        ((32, -1, 128, "bf16"), "num_kv_heads"),
        ((32, 8, 0, "bf16"), "head_dim"),
        ((32, 8, 128, "bf15"), "unknown KV dtype 'bf15'"),
        ((32, 8, 128, 3), "byte count"),
        ((32.0, 8, 128, "bf16"), "num_layers"),
    ],
)
def test_bytes_per_token_rejects_bad_shapes(args: tuple[object, ...], msg: str) -> None:
    with pytest.raises(SizingError, match=msg):
        kv_bytes_per_token(*args)  # type: ignore[arg-type]


def test_parse_bytes() -> None:
    assert parse_bytes("40GiB") == 40 * GIB
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5gib") == 3 * GIB // 2
    assert parse_bytes("2.47GiB") == 247 * GIB // 100
    assert parse_bytes("4096") == parse_bytes("4096B") == 4096
    for bad in ("40GX", "GiB", "-1GiB", "4 0GiB", "1e9", ""):
        with pytest.raises(SizingError, match="bad memory size"):
            parse_bytes(bad)


def test_pool_from_a_budget() -> None:
    bpt = kv_bytes_per_token(32, 8, 128, "bf16")
    pool = kvindex.kv_pool_size(bpt, 16, budget_bytes=40 * GIB)
    assert (pool.num_tokens, pool.num_blocks, pool.pool_blocks) == (327_680, 20_480, 20_481)
    assert kv_pool_size(bpt, 1, budget_bytes=40 * GIB).num_tokens == 327_680
    # Rounded down to whole blocks.
    assert kv_pool_size(bpt, 16, budget_bytes=17 * bpt).num_blocks == 1
    assert kv_pool_size(bpt, 16, budget_bytes=15 * bpt).num_blocks == 0


def test_engine_budget_rules() -> None:
    gpu, weights = 80 * GIB, 16 * GIB
    # SGLang: mem_fraction_static covers weights + KV; the rest is headroom.
    assert kv_budget_bytes("sglang", gpu_memory_bytes=gpu, fraction=0.5, weight_bytes=weights) == (
        24 * GIB
    )
    # vLLM: gpu_memory_utilization (default 0.9) minus weights, activation peak, other.
    v = kv_budget_bytes(
        "vllm", gpu_memory_bytes=gpu, weight_bytes=weights, activation_bytes=GIB, other_bytes=GIB
    )
    assert v == int(0.9 * gpu) - 18 * GIB
    # Same GPU, same model: the rules alone give different pools (the seed's smoke test).
    bpt = kv_bytes_per_token(28, 2, 128, "bf16")
    small = kv_pool_size(
        bpt,
        1,
        rule="sglang",
        gpu_memory_bytes=4 * GIB,
        fraction=0.6,
        weight_bytes=parse_bytes("2.23GiB"),
    )
    large = kv_pool_size(
        bpt, 16, rule="vllm", gpu_memory_bytes=4 * GIB, weight_bytes=parse_bytes("2.47GiB")
    )
    assert small.num_tokens < large.num_tokens


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"rule": "bytes"}, "needs budget_bytes"),
        ({"rule": "sglang", "gpu_memory_bytes": GIB}, "needs fraction"),
        ({"rule": "vllm"}, "gpu_memory_bytes"),
        ({"rule": "vllm", "gpu_memory_bytes": GIB, "fraction": 1.5}, "fraction"),
        ({"rule": "vllm", "gpu_memory_bytes": GIB, "weight_bytes": 2 * GIB}, "negative"),
        (
            {"rule": "sglang", "gpu_memory_bytes": GIB, "fraction": 0.9, "activation_bytes": 1},
            "headroom",
        ),
        ({"rule": "tgi", "budget_bytes": GIB}, "unknown budget rule"),
    ],
)
def test_budget_rule_errors(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(SizingError, match=msg):
        kv_budget_bytes(**kw)  # type: ignore[arg-type]


def test_model_shape_parsing() -> None:
    s = ModelShape.parse(LLAMA3_8B)
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.dtype) == (32, 8, 128, "bf16")
    assert s.bytes_per_token == 131_072 and ModelShape.parse(str(s)) == s
    assert ModelShape.parse("layers=2, kv_heads=1, head_dim=64").bytes_per_token == 512
    for bad, msg in [
        ("layers=32,kv_heads=8", "missing head_dim"),
        ("layers=32,kv_heads=8,head_dim=128,heads=4", "unknown key 'heads'"),
        ("layers=x,kv_heads=8,head_dim=128", "layers must be an integer"),
        ("layers=32,kv_heads=8,head_dim=128,dtype=int3", "unknown KV dtype"),
        ("layers32,kv_heads=8,head_dim=128", "key=value"),
        ("layers=0,kv_heads=8,head_dim=128", "num_layers"),
    ]:
        with pytest.raises(SizingError, match=msg):
            ModelShape.parse(bad)


def test_memory_capacity_values() -> None:
    shape = ModelShape.parse(LLAMA3_8B)
    cap = parse_capacity("40GiB", shape)
    assert cap.tokens() == 327_680 and cap.usable_blocks(16, 0) == 20_480
    assert parse_capacity("64k").tokens() == 64_000
    assert parse_capacity("64Ki").tokens() == 65_536
    assert parse_capacity("3M").tokens() == 3_000_000
    assert parse_capacity("4096blocks").usable_blocks(16, 0) == 4096
    assert parse_capacity("inf").infinite
    with pytest.raises(SimulationError, match="--model-shape"):
        parse_capacity("40GiB")
    with pytest.raises(SimulationError, match="bad capacity"):
        parse_capacity("40GX", shape)


def test_simulate_reports_the_token_capacity_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["--quiet", "--requests", "30", "--block-size", "16", "--index", "hash_chain"]
    argv += ["--capacity", "2GiB,inf", "--model-shape", LLAMA3_8B, "--json", str(out)]
    argv += ["--budget-rule", "vllm", "--gpu-memory", "24GiB", "--weights", "19GiB"]
    assert simulate_main(argv) == 0
    text = capsys.readouterr().out
    assert "131,072 KV bytes per token" in text and "16,384" in text  # 2 GiB -> 16,384 tokens
    runs = json.loads(out.read_text())["runs"]
    assert [r["capacity_tokens"] for r in runs[:1]] == [16_384]
    vllm = runs[-1]
    assert vllm["capacity"].startswith("vllm(") and vllm["capacity_kind"] == "bytes"
    expect = (int(0.9 * 24 * GIB) - 19 * GIB) // 131_072 // 16 * 16
    assert vllm["capacity_tokens"] == expect


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--capacity", "40GX", "--model-shape", LLAMA3_8B], "bad capacity"),
        (["--capacity", "40GiB", "--model-shape", "layers=32"], "missing kv_heads, head_dim"),
        (["--capacity", "40GiB", "--model-shape", LLAMA3_8B.replace("bf16", "bf9")], "dtype"),
        (["--capacity", "1MiB", "--model-shape", LLAMA3_8B], "below request"),
        (["--budget-rule", "sglang", "--gpu-memory", "8GiB"], "needs --model-shape"),
        (
            ["--budget-rule", "sglang", "--gpu-memory", "8GiB", "--model-shape", LLAMA3_8B],
            "needs fraction",
        ),
    ],
)
def test_simulate_rejects_bad_units_and_shapes(
    argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate_main(["--quiet", "--requests", "20", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
