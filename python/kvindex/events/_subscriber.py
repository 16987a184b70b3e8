"""A KV-event subscriber: decodes batches, tracks sequence numbers, fills gaps by replay.

Everything it is sent is either a batch handed to the caller or a counted, logged
skip: wrong frame counts, bad sequence frames, malformed msgpack, unknown event types
and wrong block sizes never raise.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from kvindex.events._batch import (
    END_SEQ,
    KVEventBatch,
    decode_batch,
    read_heartbeat,
    read_seq,
    seq_bytes,
)
from kvindex.events._zmq import attach, zmq
from kvindex.exceptions import ClosedError, KvIndexError

from . import _options as _opt

logger = logging.getLogger("kvindex.events")


class EventSubscriber:
    """Receives one publisher's KV-event stream (vLLM 0.33 protocol).

    Connects a SUB socket to ``endpoint`` (subscribed to ``topic`` as a prefix) and,
    with ``replay_endpoint``, a DEALER socket to the publisher's ROUTER. Sequence
    numbers are tracked per subscriber: a jump forward is a gap (its batches are fetched
    through replay when a replay endpoint is set, within ``replay_timeout`` seconds; what
    replay cannot supply is counted as ``lost``); a number at or below the last one seen
    is a publisher restart (counted; tracking restarts from it). With ``block_size``,
    a batch with a ``BlockStored`` of another block size is skipped.

    :meth:`poll` returns the batches in sequence order, replayed ones marked
    ``replayed=True``. :attr:`stats` counts everything else. Sequence numbers are
    ``0..2**63-1``; a frame with a larger one is a bad frame. A publisher's heartbeat
    (``WIRE.md``) is counted; it tells a quiet stream's last batches missed (fetched as a
    gap's), and a new :attr:`epoch` behind the last sequence number a restart. A replay
    answer that comes after ``replay_timeout`` is skipped where it falls outside the gap
    being fetched, and its end marker does not end a later fetch.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str | bytes = "",
        block_size: int | None = None,
        replay_timeout: float = 1.0,
        rcvhwm: int = 100_000,
    ) -> None:
        endpoint = _opt.text("endpoint", endpoint)
        if replay_endpoint is not None:
            replay_endpoint = _opt.text("replay_endpoint", replay_endpoint)
        self._topic = _opt.topic_bytes(topic)
        if block_size is not None:
            block_size = _opt.count("block_size", block_size, low=1, high=2**63 - 1)
        self._block_size = block_size
        wait = _opt.seconds("replay_timeout", replay_timeout)
        self._replay_timeout = float("inf") if wait is None else wait
        rcvhwm = _opt.count("rcvhwm", rcvhwm, low=0, high=_opt.INT_OPTION_MAX)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._replay: Any = None
        try:
            attach(self._sub, endpoint, bind=False)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.DEALER)
                self._replay.setsockopt(zmq.LINGER, 0)
                attach(self._replay, replay_endpoint, bind=False, option="replay_endpoint")
        except Exception:
            self._ctx.destroy(linger=0)
            raise
        self.last_seq: int | None = None
        self.epoch: bytes | None = None
        # End markers still due for replay requests that timed out: the next ones
        # received belong to those, not to the request in flight.
        self._stale_ends = 0
        self._stats = {
            "received": 0,
            "delivered": 0,
            "bad_frames": 0,
            "bad_payloads": 0,
            "skipped_events": 0,
            "gaps": 0,
            "missed": 0,
            "replayed": 0,
            "lost": 0,
            "restarts": 0,
            "heartbeats": 0,
            "errors": 0,
        }

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``received`` (messages), ``delivered`` (batches returned, replayed
        included), ``bad_frames`` (wrong frame count or sequence frame), ``bad_payloads``
        (undecodable or wrong block size), ``skipped_events`` (unknown types), ``gaps``,
        ``missed`` (sequence numbers skipped), ``replayed`` (recovered through replay),
        ``lost`` (missed and not recovered), ``restarts``, ``heartbeats``, ``errors``
        (a socket error while fetching replay: logged, the messages read kept)."""
        return dict(self._stats)

    def poll(self, timeout: float = 0.0, max_messages: int = 10_000) -> list[KVEventBatch]:
        """Waits up to ``timeout`` seconds for the first message, then takes every message
        already there (at most ``max_messages``). Returns the decoded batches in order.
        ``timeout`` is >= 0 (``inf`` waits without a bound). After :meth:`close` raises
        ``ClosedError``."""
        if self._ctx.closed:
            raise ClosedError("EventSubscriber is closed")
        wait = _opt.seconds("timeout", timeout)
        max_messages = _opt.count("max_messages", max_messages, low=0, high=2**62)
        out: list[KVEventBatch] = []
        if not self._sub.poll(None if wait is None else int(wait * 1000)):
            return out
        for _ in range(max_messages):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._stats["received"] += 1
            try:
                self._handle(frames, out)
            except zmq.ZMQError as exc:  # the replay socket failed: keep what was read
                self._bad("errors", f"replay failed: {exc}")
        self._stats["delivered"] += len(out)
        return out

    def _handle(self, frames: list[bytes], out: list[KVEventBatch]) -> None:
        hb = read_heartbeat(frames)
        if hb is not None:
            self._heartbeat(*hb, frames[0], out)
            return
        if len(frames) != 3:
            self._bad(
                "bad_frames", f"message of {len(frames)} frames (expected 3: topic, seq, payload)"
            )
            return
        topic, seq_frame, payload = frames
        if len(seq_frame) != 8:
            self._bad("bad_frames", f"sequence frame of {len(seq_frame)} bytes (expected 8)")
            return
        seq = read_seq(seq_frame)
        if seq is None:
            self._bad("bad_frames", f"sequence number {seq_frame.hex()} above 2**63-1")
            return
        last = self.last_seq
        if last is not None and seq <= last:
            self._stats["restarts"] += 1
            logger.warning(
                "kvindex.events: sequence went back from %d to %d: publisher restarted", last, seq
            )
        elif last is not None and seq > last + 1:
            missed = seq - last - 1
            self._stats["gaps"] += 1
            self._stats["missed"] += missed
            logger.warning("kvindex.events: gap of %d batches (%d..%d)", missed, last + 1, seq - 1)
            got = self._fetch_replay(last + 1, seq, topic, out)
            self._stats["lost"] += missed - got
        self.last_seq = seq
        batch = self._decode(payload, seq, topic, replayed=False)
        if batch is not None:
            out.append(batch)

    def _heartbeat(
        self, epoch: bytes, next_seq: int, topic: bytes, out: list[KVEventBatch]
    ) -> None:
        self._stats["heartbeats"] += 1
        last = self.last_seq
        if self.epoch is not None and epoch != self.epoch and last is not None and next_seq <= last:
            # A new start whose stream is behind what was seen: its batches are fetched.
            self._stats["restarts"] += 1
            logger.warning("kvindex.events: new publisher epoch: publisher restarted")
            last = self.last_seq = -1
        self.epoch = epoch
        if last is None or next_seq <= last + 1:
            return
        # The stream's last batches never arrived: a gap like any other.
        missed = next_seq - last - 1
        self._stats["gaps"] += 1
        self._stats["missed"] += missed
        logger.warning("kvindex.events: heartbeat: batches %d..%d missed", last + 1, next_seq - 1)
        got = self._fetch_replay(last + 1, next_seq, topic, out)
        self._stats["lost"] += missed - got
        self.last_seq = next_seq - 1

    def _decode(
        self, payload: bytes, seq: int, topic: bytes, *, replayed: bool
    ) -> KVEventBatch | None:
        try:
            batch = decode_batch(
                payload, block_size=self._block_size, seq=seq, topic=topic, replayed=replayed
            )
        except KvIndexError as exc:
            self._bad("bad_payloads", f"batch {seq} skipped: {exc}")
            return None
        if batch.skipped_types:
            self._stats["skipped_events"] += len(batch.skipped_types)
            logger.warning(
                "kvindex.events: batch %d: skipped events of unknown types %s",
                seq,
                ", ".join(sorted(set(batch.skipped_types))),
            )
        return batch

    def _bad(self, counter: str, msg: str) -> None:
        self._stats[counter] += 1
        logger.warning("kvindex.events: %s", msg)

    def _fetch_replay(self, start: int, stop: int, topic: bytes, out: list[KVEventBatch]) -> int:
        """Requests batches ``start..stop-1`` through replay; appends the ones that arrive
        before the end marker or the timeout. Returns how many were recovered."""
        sock = self._replay
        if sock is None:
            return 0
        sock.send_multipart((b"", seq_bytes(start)))
        deadline = time.monotonic() + self._replay_timeout
        want = start
        got = 0
        while True:
            left = deadline - time.monotonic()
            ms = None if math.isinf(left) else min(int(left * 1000) + 1, _opt.POLL_MS_MAX)
            if left <= 0 or not sock.poll(ms):
                logger.warning("kvindex.events: replay from %d timed out", start)
                self._stale_ends += 1
                return got
            frames = sock.recv_multipart()
            # [b"", seq, payload], or [b"", topic, seq, payload] from a publisher that
            # repeats the topic.
            if len(frames) == 3 and frames[0] == b"":
                _, seq_frame, payload = frames
            elif len(frames) == 4 and frames[0] == b"":
                _, _, seq_frame, payload = frames
            else:
                self._bad("bad_frames", f"replay answer of {len(frames)} frames")
                continue
            if seq_frame == END_SEQ:
                if self._stale_ends:
                    self._stale_ends -= 1  # the end of an answer that came too late
                    continue
                return got
            seq = read_seq(seq_frame)
            if seq is None:
                self._bad("bad_frames", f"replay sequence frame {seq_frame.hex()}")
                continue
            if seq < want or seq >= stop:
                continue  # before the gap (already seen) or after it (live stream has it)
            batch = self._decode(payload, seq, topic, replayed=True)
            want = seq + 1
            if batch is not None:
                out.append(batch)
                got += 1
                self._stats["replayed"] += 1

    def close(self) -> None:
        """Closes the sockets. Idempotent."""
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
