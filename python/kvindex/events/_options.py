"""Checks of the publisher's and subscriber's options and call arguments.

Every bad value raises :class:`kvindex.InvalidArgumentError` (a ``ValueError``) or
:class:`kvindex.DTypeError` (a ``TypeError``) before any socket or thread exists, so
a refused constructor leaks nothing and a refused call changes nothing.
"""

from __future__ import annotations

import math
from typing import Any

from kvindex._checks import integer, text
from kvindex.exceptions import DTypeError, InvalidArgumentError

__all__ = ["INT_OPTION_MAX", "POLL_MS_MAX", "count", "seconds", "text", "timestamp", "topic_bytes"]

# ZMQ socket options (high-water marks) are C ints.
INT_OPTION_MAX = 2**31 - 1
# Longest wait ZMQ's poll takes, in milliseconds (longer waits have no bound).
POLL_MS_MAX = 2**31 - 1


def count(name: str, value: Any, *, low: int, high: int) -> int:
    """An ``int`` (not a bool) in ``low..=high``."""
    n = integer(name, value)
    if not low <= n <= high:
        raise InvalidArgumentError(f"{name} must be in {low}..={high}, got {n}")
    return n


def topic_bytes(value: Any) -> bytes:
    """A topic: a ``str`` (UTF-8 encoded) or a bytes-like object."""
    if isinstance(value, str):
        return text("topic", value).encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise DTypeError(f"topic must be a str or bytes, got {type(value).__name__}")


def seconds(name: str, value: Any) -> float | None:
    """A wait in seconds: a real number >= 0; ``inf`` (or a wait too long to
    represent) means no bound and gives ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if isinstance(value, int):
        value = math.inf if value >= 2**53 else -1.0 if value < 0 else float(value)
    if math.isnan(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be >= 0 seconds, got {value}")
    return None if value * 1000 > POLL_MS_MAX else float(value)


def timestamp(value: Any) -> float:
    """A batch timestamp: a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"ts must be a number, got {type(value).__name__}")
    try:
        ts = float(value)
    except OverflowError:
        raise InvalidArgumentError(f"ts must be a finite number, got {value}") from None
    if not math.isfinite(ts):
        raise InvalidArgumentError(f"ts must be a finite number, got {ts}")
    return ts
