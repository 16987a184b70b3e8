"""kvindex's exception hierarchy.

Every error a caller can cause raises a :class:`KvIndexError` subclass that is
also the closest builtin exception, so ``except ValueError`` keeps working.
The operation that raised left the cache unchanged.
"""

from __future__ import annotations

__all__ = [
    "BlockInUseError",
    "CapacityError",
    "ClosedError",
    "DTypeError",
    "DuplicateRequestError",
    "InvalidArgumentError",
    "InvariantViolation",
    "KvIndexError",
    "LockError",
    "RequestTooLargeError",
    "StaleHandleError",
    "UnknownRequestError",
]


class KvIndexError(Exception):
    """Base class of every error a caller of kvindex can cause."""


class InvalidArgumentError(KvIndexError, ValueError):
    """A value is out of range or inconsistent with the cache's state."""


class DTypeError(KvIndexError, TypeError):
    """An array has the wrong dtype, rank or memory layout (kvindex never copies silently)."""


class UnknownRequestError(KvIndexError, KeyError):
    """The request id is not running (never admitted, or already freed)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateRequestError(KvIndexError, ValueError):
    """The request id is already running."""


class BlockInUseError(KvIndexError, RuntimeError):
    """The operation needs idle blocks but some are held by running requests."""


class StaleHandleError(KvIndexError, KeyError):
    """A radix node handle no longer names a live node (evicted, or the tree was reset)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LockError(KvIndexError, RuntimeError):
    """Unlocking a radix node that holds no lock."""


class CapacityError(KvIndexError, MemoryError):
    """A size that cannot be held: tables this machine cannot allocate (``num_blocks``, ...;
    nothing was built), or a request larger than the pool (:class:`RequestTooLargeError`)."""


class RequestTooLargeError(CapacityError):
    """``admit`` of a prompt that needs more blocks than the pool's usable ones
    (``num_blocks - 1``): no state of the cache could ever hold it.

    ``admit`` returns ``None`` for "not now" (blocks are held or cached and may free up);
    this error says "never", so a scheduler can reject the request instead of waiting.
    """


class ClosedError(KvIndexError, RuntimeError):
    """A call on an event publisher, subscriber or cluster listener after its ``close()``
    (``close()`` itself may be called again)."""


class InvariantViolation(AssertionError):
    """``check_invariants()`` found a broken internal invariant (a kvindex bug)."""
