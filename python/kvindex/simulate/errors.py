"""Errors of ``kvindex simulate``: caller mistakes reported as one clear line, not a traceback."""

from __future__ import annotations

from kvindex.exceptions import KvIndexError

__all__ = ["SimulationError", "TraceFormatError"]


class SimulationError(KvIndexError, ValueError):
    """A bad simulator input: unknown design, bad capacity, a request that cannot fit
    (a :class:`kvindex.KvIndexError`)."""


class TraceFormatError(SimulationError):
    """A malformed trace line; the message starts with ``FILE:LINE:``."""
