"""The optional pyzmq dependency, imported once with a helpful error, and the one place
sockets are bound or connected (so that a bad endpoint is a caller error)."""

from __future__ import annotations

from typing import Any

try:
    import zmq
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvindex.events needs pyzmq: pip install 'kvindex[events]'") from exc

from kvindex.exceptions import InvalidArgumentError

__all__ = ["attach", "zmq"]


def attach(sock: Any, endpoint: str, *, bind: bool, option: str = "endpoint") -> None:
    """Binds or connects ``sock`` to ``endpoint``. A malformed endpoint (unknown transport,
    no port, a bad address) or one that cannot be bound raises
    :class:`~kvindex.InvalidArgumentError` naming ``option`` and ZMQ's reason; the socket
    is left as it was."""
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as e:
        raise InvalidArgumentError(
            f"{option} {endpoint!r}: cannot {'bind' if bind else 'connect'}: {e} "
            "(expected tcp://HOST:PORT, ipc://PATH or inproc://NAME)"
        ) from None
