"""The exception hierarchy: classes are created once, and every caller error of every
module is a ``KvIndexError`` that is also the closest builtin exception."""

from __future__ import annotations

import numpy as np
import pytest

import kvindex
import kvindex.exceptions as exc
from kvindex.simulate.errors import SimulationError, TraceFormatError
from kvindex.sizing import SizingError, kv_bytes_per_token


def test_native_errors_use_the_classes_imported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    original = exc.InvalidArgumentError

    class Impostor(Exception):
        pass

    # Replacing the module attribute does not change what the extension raises:
    # the class was imported once and kept.
    monkeypatch.setattr(exc, "InvalidArgumentError", Impostor)
    c = kvindex.HashChainCache(8, 4)
    with pytest.raises(original):
        c.ref_count(100)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (SizingError, ValueError),
        (SimulationError, ValueError),
        (TraceFormatError, ValueError),
        (exc.InvalidArgumentError, ValueError),
        (exc.DTypeError, TypeError),
        (exc.UnknownRequestError, KeyError),
        (exc.DuplicateRequestError, ValueError),
        (exc.BlockInUseError, RuntimeError),
        (exc.StaleHandleError, KeyError),
        (exc.LockError, RuntimeError),
        (exc.CapacityError, MemoryError),
        (exc.RequestTooLargeError, exc.CapacityError),
    ],
)
def test_every_caller_error_is_a_kvindex_error(cls: type, builtin: type) -> None:
    assert issubclass(cls, exc.KvIndexError)
    assert issubclass(cls, builtin)


def test_sizing_errors_are_caught_as_kvindex_errors() -> None:
    with pytest.raises(kvindex.KvIndexError):
        kv_bytes_per_token(0, 8, 128)


def test_each_kind_raises_its_class() -> None:
    c = kvindex.HashChainCache(8, 4)
    assert c.admit(1, np.arange(8, dtype=np.int32)) is not None
    with pytest.raises(exc.DuplicateRequestError):
        c.admit(1, np.arange(8, dtype=np.int32))
    with pytest.raises(exc.UnknownRequestError):
        c.free(2)
    with pytest.raises(exc.DTypeError):
        c.lookup(np.arange(8, dtype=np.float64))
    with pytest.raises(exc.BlockInUseError):
        c.reset()
