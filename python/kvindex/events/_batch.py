"""Decoded KV-event batches (vLLM 0.33 ``KVEventBatch``) and the frame layout.

A publisher sends three frames per batch: ``[topic, seq.to_bytes(8, "big"), payload]``;
replay answers carry ``[seq, payload]`` after the ROUTER envelope and end with
:data:`END_SEQ` and an empty payload.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvindex._core import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch
from kvindex.exceptions import DTypeError, InvalidArgumentError

Event = BlockStored | BlockRemoved | AllBlocksCleared
"""One KV event."""

END_SEQ: bytes = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay answer."""


def seq_bytes(seq: int) -> bytes:
    """The 8-byte big-endian sequence frame of ``seq`` (an int in ``-2**63..2**63``;
    ``InvalidArgumentError`` beyond, ``DTypeError`` for a bool or a non-int)."""
    if seq.__class__ is bool:
        raise DTypeError("seq must be an int, got bool")
    try:
        return seq.to_bytes(8, "big", signed=True)
    except OverflowError:
        raise InvalidArgumentError(f"seq must be in -2**63..2**63, got {seq}") from None
    except AttributeError:
        raise DTypeError(f"seq must be an int, got {type(seq).__name__}") from None


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One step's events as a subscriber received them.

    ``ts``, ``events`` and ``data_parallel_rank`` are vLLM's ``KVEventBatch`` fields;
    ``seq`` and ``topic`` come from the frames (None / ``b""`` for a bare payload),
    ``replayed`` says the batch was fetched through replay, and ``skipped_types`` lists
    the type tags of events of unknown types that were left out.
    """

    ts: float
    events: list[Event]
    data_parallel_rank: int | None
    seq: int | None = None
    topic: bytes = b""
    replayed: bool = False
    skipped_types: tuple[str, ...] = ()


def decode_batch(
    payload: bytes,
    *,
    block_size: int | None = None,
    seq: int | None = None,
    topic: bytes = b"",
    replayed: bool = False,
) -> KVEventBatch:
    """Decodes one msgpack payload (map- or array-tagged events; hashes as unsigned or
    signed ints or bytes). With ``block_size``, every ``BlockStored`` must have that block
    size. Raises ``kvindex.InvalidArgumentError`` (a ``ValueError``) for malformed input."""
    ts, events, dp_rank, skipped = decode_event_batch(payload, block_size=block_size)
    return KVEventBatch(ts, events, dp_rank, seq, topic, replayed, tuple(skipped))
