"""Adversarial inputs to :mod:`kvindex.sizing`: every bad value raises ``SizingError``
(a ``KvIndexError``), never a bare ``OverflowError``, ``ValueError`` or
``AttributeError``, and counts stay ints.

Regression cases: a GPU size too large for a float overflowed in the fraction
product (now exact); a memory size past Python's 4300-digit int limit raised a plain
``ValueError``; a non-str model shape raised ``AttributeError``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvindex import KvIndexError
from kvindex.sizing import (
    ModelShape,
    SizingError,
    kv_budget_bytes,
    kv_bytes_per_token,
    kv_pool_size,
    parse_bytes,
)

BAD: list[Any] = [
    None,
    True,
    1.5,
    math.nan,
    math.inf,
    -1,
    2**63,
    10**400,
    "1",
    [1],
    "\ud800",
]


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize("rule", ["bytes", "vllm", "sglang"])
@pytest.mark.parametrize(
    "field",
    [
        "budget_bytes",
        "gpu_memory_bytes",
        "fraction",
        "weight_bytes",
        "activation_bytes",
        "other_bytes",
    ],
)
def test_budget_inputs(value: Any, rule: str, field: str) -> None:
    kw: dict[str, Any] = (
        {"budget_bytes": 10**9}
        if rule == "bytes"
        else {"gpu_memory_bytes": 10**10, "fraction": 0.5}
    )
    kw[field] = value
    try:
        out = kv_budget_bytes(rule, **kw)
    except KvIndexError:
        return
    assert isinstance(out, int) and out >= 0
    pool = kv_pool_size(1024, 16, rule=rule, **kw)
    assert isinstance(pool.num_blocks, int)


@pytest.mark.parametrize("rule", ["vllm", "sglang"])
def test_gpu_memory_past_the_float_range(rule: str) -> None:
    for gpu in (10**400, 2**1100):
        out = kv_budget_bytes(rule, gpu_memory_bytes=gpu, fraction=0.5)
        assert isinstance(out, int) and out == gpu // 2
    assert kv_budget_bytes("vllm", gpu_memory_bytes=2**63, fraction=1.0) == 2**63


@pytest.mark.parametrize(
    "text",
    ["1" * 5000 + "B", "1." + "1" * 5000 + "GiB", "9" * 4400 + "TiB", "", "GiB", "1 2GiB"],
    ids=lambda t: t[:12],
)
def test_parse_bytes_refuses_bad_text(text: str) -> None:
    with pytest.raises(SizingError):
        parse_bytes(text)


@pytest.mark.parametrize("value", [None, 5, 1.5, b"4GiB", ["4GiB"]], ids=repr)
def test_parsers_refuse_non_str(value: Any) -> None:
    with pytest.raises(SizingError):
        parse_bytes(value)
    with pytest.raises(SizingError):
        ModelShape.parse(value)


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_shape_and_pool_ints(value: Any) -> None:
    for args in ((value, 8, 128), (32, value, 128), (32, 8, value)):
        try:
            out = kv_bytes_per_token(*args)
        except KvIndexError:
            continue
        assert isinstance(out, int) and out > 0
    with pytest.raises(KvIndexError):
        kv_bytes_per_token(32, 8, 128, dtype=value)
    for args2 in ((value, 16), (1024, value)):
        try:
            pool = kv_pool_size(*args2, budget_bytes=10**9)
        except KvIndexError:
            continue
        assert isinstance(pool.num_blocks, int)
    try:
        shape = ModelShape.parse(f"layers={value},kv_heads=8,head_dim=128")
    except KvIndexError:
        return
    assert isinstance(shape.bytes_per_token, int) and shape.bytes_per_token > 0
