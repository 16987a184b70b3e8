"""Argument checks shared by the pure-Python entry points (the cluster router, the event
transport, the simulators): one rule for every count, flag, number and name.

- a count is an ``int`` (or an object with ``__index__``), never a ``bool`` and never a
  ``float``: ``DTypeError``; outside its range (an int >= 2**63 included):
  ``InvalidArgumentError``, never a bare ``OverflowError``;
- a flag is a ``bool``: ``DTypeError`` for anything else (a string ``"no"`` is not false);
- a real number is an ``int`` or a ``float``, not a ``bool``; NaN, and infinity where the
  value must be finite, are ``InvalidArgumentError``;
- a name is a ``str`` with a UTF-8 form (no lone surrogates).

Each raises before anything changes. This module imports nothing optional (no pyzmq), so
the router can use it without the event transport.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from kvindex.exceptions import DTypeError, InvalidArgumentError

__all__ = ["count", "flag", "integer", "real", "text"]


def integer(name: str, value: Any) -> int:
    """An int (not a bool, not a float), of any size."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise DTypeError(f"{name} must be an int, got {type(value).__name__}")
    return operator.index(value)


def count(name: str, value: Any, *, low: int = 0, high: int = 2**63 - 1) -> int:
    """An int (not a bool, not a float) in ``low..=high``."""
    n = integer(name, value)
    if not low <= n <= high:
        raise InvalidArgumentError(f"{name} must be an int in {low}..={high}, got {n}")
    return n


def flag(name: str, value: Any) -> bool:
    """A bool."""
    if not isinstance(value, bool):
        raise DTypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def real(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    low_open: bool = False,
    finite: bool = True,
) -> float:
    """A real number (int or float, not a bool), not NaN, ``>= low`` (``> low`` with
    ``low_open``), finite unless ``finite=False``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf if value > 0 else -math.inf
    if math.isnan(x) or (finite and math.isinf(x)):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")
    if x < low or (low_open and x == low):
        rel = ">" if low_open else ">="
        raise InvalidArgumentError(f"{name} must be {rel} {low:g}, got {value!r}")
    return x


def text(name: str, value: Any) -> str:
    """A str that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise DTypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} must be valid Unicode (no lone surrogates)") from None
    return value
