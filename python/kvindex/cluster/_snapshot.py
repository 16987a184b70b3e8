"""An index's workers as snapshots, to start a router replica from a peer's index."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvindex._core import ClusterIndex


def index_snapshot(
    index: ClusterIndex,
) -> dict[tuple[str, int], tuple[npt.NDArray[np.uint64], int]]:
    """Every live worker of ``index`` as ``(name, dp_rank) -> (hashes, next_seq)``: what
    a new router replica passes as ``resume`` to :meth:`ClusterListener.add_worker` to
    start from this index instead of empty."""
    out: dict[tuple[str, int], tuple[npt.NDArray[np.uint64], int]] = {}
    for slot, status in enumerate(index.statuses()):
        if status == "live":
            info = index.worker_info(slot)
            out[(str(info["name"]), int(info["dp_rank"]))] = index.snapshot_worker(slot)
    return out
