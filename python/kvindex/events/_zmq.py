"""The optional pyzmq dependency, imported once with a helpful error."""

from __future__ import annotations

try:
    import zmq
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvindex.events needs pyzmq: pip install 'kvindex[events]'") from exc

__all__ = ["zmq"]
