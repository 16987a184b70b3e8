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


# -- kvindex's opt-in extension (see WIRE.md): heartbeats and snapshots ---------------------

SEQ_MAX: int = 2**63 - 1
"""The largest sequence number: sequence frames are read as unsigned, and a number
above this is a bad frame (the end marker, ``-1``, is the only negative one)."""

HEARTBEAT: bytes = b"\xffKVHB1"
"""Second frame of a heartbeat ``[topic, HEARTBEAT, epoch, next_seq]`` (never 8 bytes,
so a consumer that checks the sequence frame's length skips it)."""

SNAPSHOT: bytes = b"\xffKVSNAP1"
"""Snapshot request ``[b"", SNAPSHOT]`` and the first frame of its answer
``[b"", SNAPSHOT, epoch, resume_seq, exact, hashes]``."""

EPOCH_BYTES = 16
"""Length of a publisher epoch (random bytes drawn at every start)."""


def read_seq(frame: bytes) -> int | None:
    """A sequence frame's number, or None when it is not 8 bytes or above :data:`SEQ_MAX`."""
    if len(frame) != 8:
        return None
    seq = int.from_bytes(frame, "big")
    return seq if seq <= SEQ_MAX else None


def read_heartbeat(frames: list[bytes]) -> tuple[bytes, int] | None:
    """``(epoch, next_seq)`` of a well-formed heartbeat, else None."""
    if len(frames) != 4 or frames[1] != HEARTBEAT or len(frames[2]) != EPOCH_BYTES:
        return None
    seq = read_seq(frames[3])
    return None if seq is None else (frames[2], seq)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A publisher's stream state: the block ``hashes`` it holds (once per announcement),
    the sequence number of the first live batch they do not include (``resume_seq``), the
    publisher's ``epoch``, and ``exact`` (False after a batch the publisher could not read)."""

    epoch: bytes
    resume_seq: int
    exact: bool
    hashes: bytes  # uint64, little-endian


def read_snapshot(frames: list[bytes]) -> Snapshot | None:
    """A well-formed snapshot answer (``[b"", SNAPSHOT, epoch, resume_seq, exact,
    hashes]``) or None."""
    if len(frames) != 6 or frames[0] != b"" or frames[1] != SNAPSHOT:
        return None
    _, _, epoch, seq_frame, exact, hashes = frames
    seq = read_seq(seq_frame)
    if len(epoch) != EPOCH_BYTES or seq is None or exact not in (b"\x00", b"\x01"):
        return None
    if len(hashes) % 8:
        return None
    return Snapshot(epoch, seq, exact == b"\x01", hashes)
