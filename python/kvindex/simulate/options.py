"""Parsers of the option values ``kvindex simulate`` and its cluster mode share: lists of
block sizes and the designs to run, each ``design[@size,...]``. Bad values raise
:class:`~kvindex.simulate.errors.SimulationError` naming the option."""

from __future__ import annotations

from kvindex.protocol import DESIGNS
from kvindex.simulate.errors import SimulationError

__all__ = ["MAX_BLOCK_SIZE", "parse_designs", "parse_ints"]

#: The largest block (page) size the caches accept.
MAX_BLOCK_SIZE = 2**20


def parse_ints(text: str, what: str) -> list[int]:
    """The distinct integers of a comma-separated list, in order, each in
    ``1..MAX_BLOCK_SIZE``; ``what`` names the value in errors (``"block size"``)."""
    out: list[int] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            v = int(part)
        except ValueError:
            raise SimulationError(f"bad {what} {part.strip()!r}: expected an integer") from None
        if v < 1:
            raise SimulationError(f"{what} must be >= 1, got {v}")
        if v > MAX_BLOCK_SIZE:
            raise SimulationError(f"{what} must be at most 2**20 = {MAX_BLOCK_SIZE:,}, got {v:,}")
        if v not in out:
            out.append(v)
    if not out:
        raise SimulationError(f"no {what} given")
    return out


def parse_designs(spec: str, block_sizes: list[int]) -> list[tuple[str, int]]:
    """The distinct ``(design, block size)`` pairs of a comma-separated list of designs,
    in order: ``design@16`` runs that design at one block size, a bare ``design`` at every
    size of ``block_sizes``."""
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        design, _, bs = item.partition("@")
        design = design.strip()
        if design not in DESIGNS:
            raise SimulationError(
                f"unknown design {design!r}; expected one of {', '.join(DESIGNS)}"
            )
        for b in parse_ints(bs, "block size") if bs else block_sizes:
            if (design, b) not in out:
                out.append((design, b))
    if not out:
        raise SimulationError("no design given (--design)")
    return out
