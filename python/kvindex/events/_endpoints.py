"""ZMQ endpoint conventions shared with vLLM's publisher."""

from __future__ import annotations

from kvindex import _checks


def offset_endpoint(endpoint: str, data_parallel_rank: int) -> str:
    """The endpoint of data-parallel rank ``r``: TCP ports move up by ``r``; ipc and
    inproc paths get a ``_dp<r>`` suffix. Rank 0 (and a wildcard port) keep the endpoint.
    ``r`` is an int in ``0..2**31`` (a bool or a float is a ``DTypeError``)."""
    endpoint = _checks.text("endpoint", endpoint)
    data_parallel_rank = _checks.count("data_parallel_rank", data_parallel_rank, high=2**31 - 1)
    if data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{data_parallel_rank}"
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint.rpartition(":")
        if sep and port.isdigit() and int(port) != 0:
            return f"{host}:{int(port) + data_parallel_rank}"
    return endpoint


def should_bind(endpoint: str) -> bool:
    """Whether a publisher binds (wildcard hosts and ports, ipc, inproc) or connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
