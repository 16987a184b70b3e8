"""Token arrays every array-taking entry point must refuse with ``DTypeError``
(a ``TypeError``), shared by the hash-chain and radix boundary tests."""

from __future__ import annotations

import numpy as np

BASE = np.arange(1, 13, dtype=np.int64)


def _unaligned(dtype: type) -> np.ndarray:
    """A C-contiguous array of ``dtype`` at an odd address (numpy allows it)."""
    item = np.dtype(dtype).itemsize
    raw = np.zeros(len(BASE) * item + 1, dtype=np.uint8)
    a = raw[1:].view(dtype)
    a[:] = BASE
    assert a.flags.c_contiguous and not a.flags.aligned
    return a


BAD_ARRAYS = {
    "float64": BASE.astype(np.float64),
    "float32": BASE.astype(np.float32),
    "uint8": BASE.astype(np.uint8),
    "uint32": BASE.astype(np.uint32),
    "uint64": BASE.astype(np.uint64),
    "int16": BASE.astype(np.int16),
    "object": BASE.astype(object),
    "bool": BASE.astype(bool),
    "big-endian-int64": BASE.astype(">i8"),
    "big-endian-int32": BASE.astype(">i4"),
    "unaligned-int32": _unaligned(np.int32),
    "unaligned-int64": _unaligned(np.int64),
    "timedelta64": BASE.astype("m8[s]"),
    "list": BASE.tolist(),
    "tuple": tuple(BASE.tolist()),
    "2-D": BASE.reshape(3, 4),
    "2-D-column": BASE.reshape(12, 1),
    "0-D": np.array(5, dtype=np.int64),
    "numpy-scalar": np.int64(5),
    "non-contiguous": BASE[::2],
    "non-contiguous-int32": BASE.astype(np.int32)[::3],
    "reversed": BASE[::-1],
    "None": None,
}
