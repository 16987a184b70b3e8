"""KV pool sizing: bytes per token of a model shape, and a memory budget turned into blocks.

The same GPU can hold very different KV pools depending on how an engine budgets its
memory — the seed notes' 4 GB smoke test saw an SGLang pool of 2,302 tokens against
vLLM's 25,008, not because a radix tree costs memory but because of the budgeting rule.
This module states the rules and does the arithmetic::

    >>> kv_bytes_per_token(32, 8, 128, "bf16")          # a Llama-3-8B-like shape
    131072
    >>> pool = kv_pool_size(131072, 16, budget_bytes=parse_bytes("40GiB"))
    >>> pool.num_tokens, pool.num_blocks
    (327680, 20480)

Budget rules (``rule=``), all returning the bytes left for the KV pool:

``"bytes"``
    ``budget_bytes`` as given.
``"sglang"``
    ``mem_fraction_static × GPU memory − weights``: SGLang's static fraction covers the
    weights *and* the KV pool; the rest (``1 − fraction``) is headroom for activations,
    CUDA graphs and the like. SGLang picks the fraction from the GPU size and parallelism,
    so ``fraction`` has no default here: pass the one the server logs.
``"vllm"``
    ``gpu_memory_utilization × GPU memory − weights − peak activation − other``: vLLM's
    fraction caps the whole process; the profiled activation peak and non-torch memory
    (CUDA graphs, NCCL buffers: ``other_bytes``) come out of it before the KV cache.
    ``fraction`` defaults to vLLM's 0.9.

Either way the pool is ``budget // (block_size × bytes_per_token)`` blocks (both engines
round down to whole blocks/pages). kvindex pools also hold a null block 0, so a cache
built from the result takes ``num_blocks + 1`` (:attr:`KvPool.pool_blocks`).
The formula covers standard multi-head / grouped-query attention (K and V per layer per
KV head); MLA and hybrid (sliding-window, Mamba) models need their own accounting.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from kvindex.exceptions import KvIndexError

__all__ = [
    "BUDGET_RULES",
    "DTYPE_BYTES",
    "KvPool",
    "ModelShape",
    "SizingError",
    "kv_budget_bytes",
    "kv_bytes_per_token",
    "kv_pool_size",
    "parse_bytes",
]

#: Bytes per element of the KV cache dtypes (names as engines and torch spell them).
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

#: Budget rules :func:`kv_budget_bytes` knows.
BUDGET_RULES: tuple[str, ...] = ("bytes", "sglang", "vllm")

BudgetRule = Literal["bytes", "sglang", "vllm"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


# Longest number parse_bytes reads (Python refuses to parse ints past 4300 digits).
_MAX_DIGITS = 100


class SizingError(KvIndexError, ValueError):
    """A bad model shape, dtype, memory size or budget (a :class:`kvindex.KvIndexError`)."""


def _dtype_bytes(dtype: str | int) -> int:
    if isinstance(dtype, bool) or not isinstance(dtype, (str, int)):
        raise SizingError(f"dtype must be a name or a byte count, got {dtype!r}")
    if isinstance(dtype, int):
        if dtype not in (1, 2, 4, 8):
            raise SizingError(f"dtype byte count must be 1, 2, 4 or 8, got {dtype}")
        return dtype
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise SizingError(f"unknown KV dtype {dtype!r}; known: {known}")
    return DTYPE_BYTES[key]


def _byte_count(name: str, value: int) -> int:
    """A byte count: an ``int`` (not a float, bool, nan or inf) >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{name} must be an integer byte count, got {value!r}")
    if value < 0:
        raise SizingError(f"{name} must be >= 0, got {value}")
    return value


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SizingError(f"{name} must be a positive integer, got {value!r}")
    return value


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: str | int = "bf16"
) -> int:
    """KV-cache bytes one token occupies: ``2 (K and V) × layers × KV heads × head_dim ×
    dtype bytes``.

    ``dtype`` is a name from :data:`DTYPE_BYTES` (``"bf16"``, ``"fp8"``, ``"torch.float16"``,
    ...) or a byte count. A Llama-3-8B-like shape (32 layers, 8 KV heads, head_dim 128) in
    bf16 takes 131,072 bytes. Raises :class:`SizingError` for a non-positive dimension or an
    unknown dtype.
    """
    layers = _positive("num_layers", num_layers)
    heads = _positive("num_kv_heads", num_kv_heads)
    dim = _positive("head_dim", head_dim)
    return 2 * layers * heads * dim * _dtype_bytes(dtype)


def parse_bytes(text: str) -> int:
    """Parses a memory size: ``"40GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"4096"`` (bytes).

    Decimal units (``KB MB GB TB``, powers of 1000) and binary ones (``KiB MiB GiB TiB``,
    powers of 1024), case-insensitive; the result is rounded down to whole bytes.
    Raises :class:`SizingError` for anything else.
    """
    if not isinstance(text, str):
        raise SizingError(f"a memory size must be a str, got {type(text).__name__}")
    m = _BYTES_RE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise SizingError(
            f"bad memory size {text!r}: expected a number and a unit such as 40GiB, 512MiB, "
            "80GB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    number, unit = m.group(1), m.group(2).lower()
    scale = _UNITS[unit]
    if len(number) > _MAX_DIGITS:
        raise SizingError(f"bad memory size {text[:40]!r}...: more than {_MAX_DIGITS} digits")
    if "." in number:
        whole, _, frac = number.partition(".")
        # Exact decimal arithmetic: no float rounding for sizes like 2.47GiB.
        den: int = 10 ** len(frac)
        return (int(whole or "0") * den + int(frac or "0")) * scale // den
    return int(number) * scale


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The attention shape that fixes KV bytes per token."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    @property
    def bytes_per_token(self) -> int:
        """:func:`kv_bytes_per_token` of this shape."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    def __str__(self) -> str:
        return (
            f"layers={self.num_layers},kv_heads={self.num_kv_heads},"
            f"head_dim={self.head_dim},dtype={self.dtype}"
        )

    @classmethod
    def parse(cls, text: str) -> ModelShape:
        """Parses ``"layers=32,kv_heads=8,head_dim=128,dtype=bf16"`` (``dtype`` optional,
        default bf16). Raises :class:`SizingError` naming the bad or missing field."""
        if not isinstance(text, str):
            raise SizingError(f"a model shape must be a str, got {type(text).__name__}")
        fields: dict[str, str] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or not value.strip():
                raise SizingError(f"bad model shape {text!r}: expected key=value, got {part!r}")
            if key not in ("layers", "kv_heads", "head_dim", "dtype"):
                raise SizingError(
                    f"bad model shape {text!r}: unknown key {key!r} "
                    "(expected layers, kv_heads, head_dim, dtype)"
                )
            fields[key] = value.strip()
        missing = [k for k in ("layers", "kv_heads", "head_dim") if k not in fields]
        if missing:
            raise SizingError(f"bad model shape {text!r}: missing {', '.join(missing)}")
        dims: list[int] = []
        for key in ("layers", "kv_heads", "head_dim"):
            try:
                dims.append(int(fields[key]))
            except ValueError:
                raise SizingError(
                    f"bad model shape {text!r}: {key} must be an integer, got {fields[key]!r}"
                ) from None
        shape = cls(dims[0], dims[1], dims[2], fields.get("dtype", "bf16"))
        _ = shape.bytes_per_token  # validates the dimensions and the dtype
        return shape


def kv_budget_bytes(
    rule: BudgetRule | str = "bytes",
    *,
    budget_bytes: int | None = None,
    gpu_memory_bytes: int | None = None,
    fraction: float | None = None,
    weight_bytes: int = 0,
    activation_bytes: int = 0,
    other_bytes: int = 0,
) -> int:
    """Bytes an engine leaves for its KV pool under ``rule`` (see the module docstring).

    ``"bytes"`` needs ``budget_bytes``; ``"sglang"`` needs ``gpu_memory_bytes`` and
    ``fraction`` (``mem_fraction_static``) and subtracts ``weight_bytes``; ``"vllm"`` needs
    ``gpu_memory_bytes``, takes ``fraction`` (``gpu_memory_utilization``, default 0.9) and
    subtracts weights, ``activation_bytes`` (profiled peak) and ``other_bytes``. Byte
    counts are ``int`` (a float, nan or inf raises :class:`SizingError`); the result is
    an ``int``. Raises :class:`SizingError` for a missing input, an unknown rule, or a
    budget below zero.
    """
    if rule == "bytes":
        if budget_bytes is None:
            raise SizingError("rule 'bytes' needs budget_bytes")
        budget = _byte_count("budget_bytes", budget_bytes)
    elif rule in ("sglang", "vllm"):
        if gpu_memory_bytes is None or (_byte_count("gpu_memory_bytes", gpu_memory_bytes) == 0):
            raise SizingError(f"rule {rule!r} needs a positive gpu_memory_bytes")
        if fraction is None:
            if rule == "sglang":
                raise SizingError(
                    "rule 'sglang' needs fraction (mem_fraction_static; SGLang derives its "
                    "default from the GPU size, so pass the value the server uses)"
                )
            fraction = 0.9
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise SizingError(f"fraction must be a number in (0, 1], got {fraction!r}")
        if not 0.0 < fraction <= 1.0:
            raise SizingError(f"fraction must be in (0, 1], got {fraction}")
        for name, v in (
            ("weight_bytes", weight_bytes),
            ("activation_bytes", activation_bytes),
            ("other_bytes", other_bytes),
        ):
            _byte_count(name, v)
        try:
            share = int(fraction * gpu_memory_bytes)
        except OverflowError:
            # A size past the float range: the exact product, rounded down.
            share = math.floor(Fraction(fraction) * gpu_memory_bytes)
        budget = share - weight_bytes
        if rule == "vllm":
            budget -= activation_bytes + other_bytes
        elif activation_bytes or other_bytes:
            raise SizingError(
                "rule 'sglang' takes no activation_bytes/other_bytes: they live in the "
                "(1 - mem_fraction_static) headroom"
            )
    else:
        raise SizingError(f"unknown budget rule {rule!r}; expected one of {BUDGET_RULES}")
    if budget < 0:
        raise SizingError(
            f"KV budget is negative ({budget} bytes): weights and overheads exceed the "
            "memory the rule allows"
        )
    return budget


@dataclass(frozen=True, slots=True)
class KvPool:
    """A KV pool sized from a memory budget."""

    #: The budget rule used.
    rule: str
    #: Bytes the rule left for the KV pool.
    budget_bytes: int
    #: KV bytes per token of the model shape.
    bytes_per_token: int
    #: Tokens per block (page); 1 for a token-granular pool.
    block_size: int
    #: Usable blocks: ``budget_bytes // (block_size * bytes_per_token)``.
    num_blocks: int

    @property
    def num_tokens(self) -> int:
        """Token slots of the pool (``num_blocks × block_size``)."""
        return self.num_blocks * self.block_size

    @property
    def pool_blocks(self) -> int:
        """``num_blocks + 1``: what to pass to a kvindex cache (block 0 is the null block)."""
        return self.num_blocks + 1


def kv_pool_size(
    bytes_per_token: int,
    block_size: int = 16,
    *,
    rule: BudgetRule | str = "bytes",
    budget_bytes: int | None = None,
    gpu_memory_bytes: int | None = None,
    fraction: float | None = None,
    weight_bytes: int = 0,
    activation_bytes: int = 0,
    other_bytes: int = 0,
) -> KvPool:
    """Turns a memory budget into a pool of blocks of ``block_size`` tokens.

    The budget comes from :func:`kv_budget_bytes` with the same keywords. Example, a 4 GiB
    GPU with 2.47 GiB of weights under vLLM's rule (no activation peak given)::

        kv_pool_size(kv_bytes_per_token(28, 2, 128, "bf16"), 16, rule="vllm",
                     gpu_memory_bytes=parse_bytes("4GiB"), weight_bytes=parse_bytes("2.47GiB"))

    Raises :class:`SizingError` for a bad input (a budget under one block gives 0 blocks).
    """
    bpt = _positive("bytes_per_token", bytes_per_token)
    bs = _positive("block_size", block_size)
    budget = kv_budget_bytes(
        rule,
        budget_bytes=budget_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        fraction=fraction,
        weight_bytes=weight_bytes,
        activation_bytes=activation_bytes,
        other_bytes=other_bytes,
    )
    return KvPool(str(rule), budget, bpt, bs, budget // (bs * bpt))
