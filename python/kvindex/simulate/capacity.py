"""``--capacity`` values: tokens, blocks, memory (with a model shape), or ``inf``.

Grammar of one value (a list is comma-separated):

* ``inf`` — every request's blocks fit at once, so nothing is ever evicted;
* tokens: ``65536``, ``64k`` / ``3M`` (SI: ×1,000 / ×1,000,000), ``64Ki`` / ``2Mi``
  (×1,024 / ×1,048,576), optionally followed by ``tok``; rounded down to whole blocks;
* blocks: ``4096blocks`` / ``4096blk`` (any multiplier above), the same block count at
  every block size;
* memory: ``40GiB``, ``512MiB``, ``80GB`` (see :func:`kvindex.sizing.parse_bytes`); needs a
  model shape, turns into ``bytes // bytes_per_token`` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvindex.simulate.errors import SimulationError
from kvindex.sizing import ModelShape, SizingError, parse_bytes

__all__ = ["Capacity", "parse_capacities", "parse_capacity"]

_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
_COUNT_RE = re.compile(
    r"^([0-9]+(?:\.[0-9]+)?)\s*(k|m|g|ki|mi|gi)?\s*(tok|tokens|blk|blocks)?$", re.IGNORECASE
)
_BYTES_RE = re.compile(r"^[0-9.]+\s*[kmgt]?i?b$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Capacity:
    """A pool size: ``kind`` is ``inf``, ``tokens``, ``blocks`` or ``bytes``."""

    label: str
    kind: str
    value: int = 0
    bytes_per_token: int = 0

    @property
    def infinite(self) -> bool:
        """Whether this is ``inf``."""
        return self.kind == "inf"

    def usable_blocks(self, block_size: int, inf_blocks: int) -> int:
        """Blocks of ``block_size`` tokens this capacity gives (``inf_blocks`` for ``inf``)."""
        if self.kind == "inf":
            return inf_blocks
        if self.kind == "blocks":
            return self.value
        if self.kind == "bytes":
            return self.value // (self.bytes_per_token * block_size)
        return self.value // block_size

    def tokens(self) -> int | None:
        """Token slots before rounding to blocks (``None`` for ``inf`` and block counts)."""
        if self.kind == "tokens":
            return self.value
        if self.kind == "bytes":
            return self.value // self.bytes_per_token
        return None


def _scaled(number: str, suffix: str) -> int:
    scale = _SCALE[suffix.lower()]
    if "." in number:
        whole, _, frac = number.partition(".")
        den: int = 10 ** len(frac)
        return (int(whole) * den + int(frac)) * scale // den
    return int(number) * scale


def parse_capacity(text: str, shape: ModelShape | None = None) -> Capacity:
    """Parses one capacity value (see the module docstring).

    Raises :class:`SimulationError` for an unknown form, a zero size, or a memory size
    without a model shape.
    """
    t = text.strip()
    if t.lower() in ("inf", "infinite", "∞"):
        return Capacity("inf", "inf")
    m = _COUNT_RE.match(t)
    if m is not None:
        n = _scaled(m.group(1), m.group(2) or "")
        unit = (m.group(3) or "tok").lower()
        if n < 1:
            raise SimulationError(f"capacity {text!r} must be at least 1")
        if unit.startswith("b"):
            return Capacity(f"{n:,} blk", "blocks", n)
        return Capacity(f"{n:,} tok", "tokens", n)
    if _BYTES_RE.match(t):
        try:
            nbytes = parse_bytes(t)
        except SizingError as e:
            raise SimulationError(f"capacity {text!r}: {e}") from None
        if shape is None:
            raise SimulationError(
                f"capacity {text!r} is a memory size: give the model shape too, e.g. "
                "--model-shape layers=32,kv_heads=8,head_dim=128,dtype=bf16"
            )
        if nbytes < 1:
            raise SimulationError(f"capacity {text!r} must be at least 1 byte")
        return Capacity(t.replace(" ", ""), "bytes", nbytes, shape.bytes_per_token)
    raise SimulationError(
        f"bad capacity {text!r}: expected inf, a token count (65536, 64k, 3M, 64Ki), a block "
        "count (4096blocks) or a memory size with --model-shape (40GiB)"
    )


def parse_capacities(text: str, shape: ModelShape | None = None) -> list[Capacity]:
    """Parses a comma-separated list of capacity values (duplicates removed, order kept)."""
    out: list[Capacity] = []
    for part in text.split(","):
        if part.strip():
            c = parse_capacity(part, shape)
            if c not in out:
                out.append(c)
    if not out:
        raise SimulationError("no capacity given")
    return out
