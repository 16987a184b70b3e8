"""Cluster prefix index and KV-aware routing over many engines' KV-event streams.

- :class:`ClusterIndex` (Rust) — which worker (engine, data-parallel rank) holds which
  blocks; one ``apply`` call per received batch payload; per-worker leading-block
  overlaps for a prompt; sequence tracking (gaps, duplicates, restarts, degraded).
  Every KV cache group's events are kept apart (``group_idx``); a worker whose groups
  are declared (``set_worker_layout``, e.g. a :mod:`kvindex.layouts` layout's
  ``core_tuple()``s) is scored by its engine's hybrid hit (``scores``, ``route``).
- :class:`ClusterListener` — the transport: one background thread receiving every
  worker's ZMQ stream (vLLM 0.33 protocol), repairing gaps through replay.
- :class:`Router` — picks a worker per request: ``kv`` (Dynamo's cost shape:
  blocks left to prefill + decode load), ``random``, ``round_robin``,
  ``least_loaded`` and ``approx`` (no events: remembers its own decisions for a TTL).
- :func:`index_snapshot` — every live worker's state, to start a router replica's
  listener from a peer's index (``ClusterListener.add_worker(resume=...)``).

The listener needs pyzmq (``pip install 'kvindex[events]'``); the index and router do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvindex._core import ClusterIndex
from kvindex.cluster._router import POLICIES, Decision, Router
from kvindex.cluster._snapshot import index_snapshot

if TYPE_CHECKING:
    from kvindex.cluster._listener import ClusterListener

__all__ = ["POLICIES", "ClusterIndex", "ClusterListener", "Decision", "Router", "index_snapshot"]


def __getattr__(name: str) -> object:
    # The listener imports pyzmq; only load it when asked for.
    if name == "ClusterListener":
        from kvindex.cluster._listener import ClusterListener

        return ClusterListener
    raise AttributeError(f"module 'kvindex.cluster' has no attribute {name!r}")
