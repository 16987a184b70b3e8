"""A KV-event publisher with vLLM's ZMQ protocol (PUB stream + ROUTER replay).

The scheduler's thread only encodes (one Rust call per step) and enqueues; a background
thread owns both sockets and does every send. Nothing the scheduler calls blocks: a
full queue drops the batch (its sequence number is spent, so subscribers see a gap)
and counts it; a PUB socket at its high-water mark drops as ZMQ does.

Opt-in extension (``WIRE.md``): heartbeats on an idle stream, an epoch per start, and a
snapshot endpoint answering with the stream's state and the sequence number to resume
from. Replay and snapshot answers never drop at the ROUTER's high-water mark: an answer
that does not fit waits (its rest is sent as the socket drains), a bounded number of
answers wait at once, and what cannot be sent is counted.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from typing import Any

from kvindex._core import (
    BlockStored,
    ClusterIndex,
    EventEncoder,
    HashChainCache,
    RadixPrefixCache,
    RadixTree,
    decode_event_batch,
)
from kvindex.events._batch import END_SEQ, EPOCH_BYTES, HEARTBEAT, SNAPSHOT, Event, seq_bytes
from kvindex.events._endpoints import offset_endpoint, should_bind
from kvindex.events._zmq import attach, zmq
from kvindex.exceptions import ClosedError, DTypeError, InvalidArgumentError, KvIndexError

from . import _options as _opt

logger = logging.getLogger("kvindex.events")

_STOP = object()
# How long the sender thread waits for a batch before servicing replay again (s).
_IDLE_POLL_S = 0.02
# Most batches sent in one go before replay requests are looked at again.
_MAX_BURST = 1024
# Most replay / snapshot answers waiting for their socket to drain; one more is refused.
_MAX_PENDING = 64
# An answer that could not be sent for this long is abandoned (its consumer is gone).
_PENDING_TTL_S = 5.0


class _Pending:
    """An answer being sent: its socket and consumer, the messages left, and when it
    last made progress."""

    __slots__ = ("ident", "items", "since", "sock", "what")

    def __init__(self, sock: Any, ident: bytes, items: deque[tuple[bytes, ...]], what: str) -> None:
        self.sock = sock
        self.ident = ident
        self.items = items
        self.since = time.monotonic()
        self.what = what


class EventPublisher:
    """Publishes KV-event batches as vLLM 0.33's ``ZmqEventPublisher`` does.

    Every batch goes out as ``[topic, seq (8 bytes, big-endian), payload]`` on a PUB
    socket, sequence numbers from 0. With ``replay_endpoint`` a ROUTER socket answers
    a request ``[identity, b"", start_seq]`` with ``[identity, b"", seq, payload]`` for
    each of the last ``buffer_steps`` batches from ``start_seq`` on, then
    ``[identity, b"", -1, b""]``. Endpoints with a wildcard, ipc and inproc are bound,
    others connected (``bind`` overrides that); ``data_parallel_rank`` offsets TCP ports
    (``+rank``) and ipc paths (``_dp<rank>``), and is written into every batch.

    Opt-in extension (the stock stream is unchanged without it): ``heartbeat_interval``
    seconds without a batch send a heartbeat ``[topic, HEARTBEAT, epoch, next_seq]``;
    with ``snapshot_endpoint`` a ROUTER socket answers ``[identity, b"", SNAPSHOT]`` with
    the stream's state (every block hash its batches left stored, once per announcement)
    and the sequence number of the first batch not in it. :attr:`epoch` is drawn at
    every start. The publisher keeps that state from the payloads it is given (one Rust
    call per batch on the caller's thread, only with ``snapshot_endpoint``), so the
    snapshot matches the stream exactly, dropped batches included. ``block_size`` is
    taken from the first ``BlockStored`` unless given.

    ``publish(cache)`` drains the cache's event buffer (the cache must have been built
    with ``enable_events=True``) in one Rust call. It never blocks: when ``max_queue_size``
    batches wait for the sender thread, the new batch is dropped and counted
    (``stats["dropped"]``), leaving a gap in the sequence. :meth:`close` sends what is
    queued and returns within ``timeout`` seconds.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        *,
        replay_endpoint: str | None = None,
        topic: str | bytes = "",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        array_tagged: bool = False,
        medium: str | None = "GPU",
        group_idx: int | None = 0,
        kv_cache_spec_kind: str | None = "full_attention",
        bind: bool | None = None,
        snapshot_endpoint: str | None = None,
        heartbeat_interval: float | None = None,
        block_size: int | None = None,
    ) -> None:
        endpoint = _opt.text("endpoint", endpoint)
        if snapshot_endpoint is not None:
            snapshot_endpoint = _opt.text("snapshot_endpoint", snapshot_endpoint)
        self._heartbeat_s: float | None = None
        if heartbeat_interval is not None:
            hb = _opt.seconds("heartbeat_interval", heartbeat_interval)
            if hb is None or hb <= 0:
                raise InvalidArgumentError(
                    "heartbeat_interval must be a finite number of seconds > 0, "
                    f"got {heartbeat_interval}"
                )
            self._heartbeat_s = hb
        if block_size is not None:
            block_size = _opt.count("block_size", block_size, low=1, high=2**20)
        if replay_endpoint is not None:
            replay_endpoint = _opt.text("replay_endpoint", replay_endpoint)
        buffer_steps = _opt.count("buffer_steps", buffer_steps, low=1, high=2**62)
        max_queue_size = _opt.count("max_queue_size", max_queue_size, low=1, high=2**62)
        hwm = _opt.count("hwm", hwm, low=0, high=_opt.INT_OPTION_MAX)
        data_parallel_rank = _opt.count(
            "data_parallel_rank", data_parallel_rank, low=0, high=2**31 - 1
        )
        if bind is not None and not isinstance(bind, bool):
            raise DTypeError(f"bind must be a bool or None, got {type(bind).__name__}")
        self._topic = _opt.topic_bytes(topic)
        self._encoder = EventEncoder(
            data_parallel_rank=data_parallel_rank,
            medium=medium,
            group_idx=group_idx,
            kv_cache_spec_kind=kv_cache_spec_kind,
            array_tagged=array_tagged,
        )
        # SimpleQueue: a C-level put (no Condition) keeps the scheduler's side cheap;
        # the bound is checked by hand.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._max_queue = max_queue_size
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._epoch = os.urandom(EPOCH_BYTES)
        # The stream's state for snapshots: a one-worker index fed every payload.
        self._mirror: ClusterIndex | None = None
        self._mirror_lock = threading.Lock()
        self._mirror_exact = True
        self._snapshots = snapshot_endpoint is not None
        if self._snapshots and block_size is not None:
            self._mirror = self._new_mirror(block_size, 0)
        self._pending: deque[_Pending] = deque()
        self._last_send = time.monotonic()
        self._closed = False
        self._abort = threading.Event()
        self._stats = {
            "published": 0,
            "dropped": 0,
            "sent": 0,
            "send_errors": 0,
            "replay_requests": 0,
            "replayed": 0,
            "bad_replay_requests": 0,
            "replay_refused": 0,
            "replay_abandoned": 0,
            "heartbeats": 0,
            "snapshot_requests": 0,
            "snapshots": 0,
            "snapshot_refused": 0,
            "snapshot_abandoned": 0,
        }
        self._ctx = zmq.Context()
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            self.endpoint = self._open(
                self._pub, offset_endpoint(endpoint, data_parallel_rank), bind, "endpoint"
            )
            self._replay: Any = None
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = self._open(
                    self._replay,
                    offset_endpoint(replay_endpoint, data_parallel_rank),
                    bind,
                    "replay_endpoint",
                )
            self._snap: Any = None
            self.snapshot_endpoint: str | None = None
            if snapshot_endpoint is not None:
                self._snap = self._ctx.socket(zmq.ROUTER)
                self._snap.setsockopt(zmq.LINGER, 0)
                self.snapshot_endpoint = self._open(
                    self._snap,
                    offset_endpoint(snapshot_endpoint, data_parallel_rank),
                    bind,
                    "snapshot_endpoint",
                )
            for sock in (self._replay, self._snap):
                if sock is not None:
                    # A full pipe raises instead of dropping the message silently.
                    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        except Exception:
            self._ctx.destroy(linger=0)
            raise
        self._thread = threading.Thread(
            target=self._run, name="kvindex-event-publisher", daemon=True
        )
        self._thread.start()

    @staticmethod
    def _open(sock: Any, endpoint: str, bind: bool | None, option: str) -> str:
        if should_bind(endpoint) if bind is None else bind:
            attach(sock, endpoint, bind=True, option=option)
            last: bytes = sock.getsockopt(zmq.LAST_ENDPOINT)
            return last.decode()
        attach(sock, endpoint, bind=False, option=option)
        return endpoint

    # -- the scheduler's side -------------------------------------------------------------

    def publish(
        self, cache: HashChainCache | RadixTree | RadixPrefixCache, ts: float | None = None
    ) -> int | None:
        """Drains ``cache``'s buffered events into one batch stamped ``ts`` (default:
        ``time.time()``) and queues it. Returns its sequence number, or None when the
        cache had no events (nothing is sent). After :meth:`close` raises ``ClosedError``
        with the cache's events left in place."""
        self._check_open()
        payload = self._encoder.encode(cache, time.time() if ts is None else _opt.timestamp(ts))
        if payload is None:
            return None
        return self.publish_payload(payload)

    def publish_events(self, events: list[Event], ts: float | None = None) -> int:
        """Queues a batch of event objects as they are. Returns its sequence number."""
        self._check_open()
        return self.publish_payload(
            self._encoder.encode_events(events, time.time() if ts is None else _opt.timestamp(ts))
        )

    def publish_payload(self, payload: bytes) -> int:
        """Queues an encoded batch. Returns its sequence number (spent even when the batch
        is dropped because the queue is full). ``payload`` must be bytes-like
        (``DTypeError`` otherwise, nothing queued); ``ClosedError`` after :meth:`close`."""
        self._check_open()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise DTypeError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        if self._snapshots:
            with self._mirror_lock:
                seq = self._next_seq
                self._next_seq += 1
                self._mirror_apply(seq, payload)
        else:
            seq = self._next_seq
            self._next_seq += 1
        if self._queue.qsize() >= self._max_queue:
            self._stats["dropped"] += 1
        else:
            self._queue.put((seq, payload))
            self._stats["published"] += 1
        return seq

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"EventPublisher on {self.endpoint!r} is closed")

    @staticmethod
    def _new_mirror(block_size: int, next_seq: int) -> ClusterIndex:
        mirror = ClusterIndex(block_size)
        mirror.add_worker("publisher")
        mirror.restore_worker(0, [], next_seq)
        return mirror

    def _mirror_apply(self, seq: int, payload: bytes) -> None:
        """Feeds one payload to the snapshot state (under ``_mirror_lock``)."""
        if self._mirror is None:
            # The block size comes from the first BlockStored; until then the state is
            # empty and stays so (removals and clears of nothing change nothing).
            try:
                _, events, _, _ = decode_event_batch(payload)
            except KvIndexError:
                self._mirror_exact = False
                return
            sizes = [e.block_size for e in events if isinstance(e, BlockStored)]
            if not sizes:
                return
            self._mirror = self._new_mirror(sizes[0], seq)
        outcome, _ = self._mirror.apply(0, seq, payload)
        if outcome != "applied":
            self._mirror_exact = False
            logger.warning("kvindex.events: batch %d not in the snapshot state: %s", seq, outcome)

    def snapshot(self) -> tuple[bytes, int, bool]:
        """The stream's state as a snapshot answer carries it: ``(hashes as uint64
        little-endian bytes, resume_seq, exact)``. Needs ``snapshot_endpoint``."""
        if not self._snapshots:
            raise InvalidArgumentError("EventPublisher was built without snapshot_endpoint")
        with self._mirror_lock:
            if self._mirror is None:
                return b"", self._next_seq, self._mirror_exact
            hashes, next_seq = self._mirror.snapshot_worker(0)
            exact = self._mirror_exact and self._mirror.status(0) == "live"
        return hashes.astype("<u8", copy=False).tobytes(), next_seq, exact

    @property
    def epoch(self) -> bytes:
        """This start's epoch (random bytes, a new value at every start)."""
        return self._epoch

    @property
    def encoder(self) -> EventEncoder:
        """The encoder that turns a cache's events into payloads."""
        return self._encoder

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch gets."""
        return self._next_seq

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``published`` (queued), ``dropped`` (queue full), ``sent``,
        ``send_errors``, ``replay_requests``, ``replayed`` (batches re-sent),
        ``bad_replay_requests`` (snapshot requests included), ``replay_refused`` (too
        many answers waiting: answered with the end marker alone), ``replay_abandoned``
        (answers whose consumer stopped reading or left), ``heartbeats``,
        ``snapshot_requests``, ``snapshots`` (sent), ``snapshot_refused``,
        ``snapshot_abandoned``, and ``queued`` (waiting now)."""
        out = dict(self._stats)
        out["queued"] = self._queue.qsize()
        return out

    def close(self, timeout: float = 1.0) -> None:
        """Sends what is queued and stops, within ``timeout`` seconds (what is still
        queued then is discarded; ``inf`` waits without a bound). Idempotent."""
        if self._closed:
            return
        wait = _opt.seconds("timeout", timeout)
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(wait)
        if self._thread.is_alive():
            self._abort.set()
            self._thread.join(1.0)
        if not self._thread.is_alive():
            self._ctx.term()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"EventPublisher(endpoint={self.endpoint!r}, replay_endpoint="
            f"{self.replay_endpoint!r}, topic={self._topic!r}, next_seq={self._next_seq}, {state})"
        )

    # -- the sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._abort.is_set():
                self._service_replay()
                self._service_snapshots()
                self._flush_pending()
                self._heartbeat()
                try:
                    item = self._queue.get(timeout=_IDLE_POLL_S)
                except queue.Empty:
                    continue
                # Send what is already queued (up to a burst) before looking at replay.
                burst = 0
                while item is not None:
                    if item is _STOP or self._abort.is_set():
                        return
                    self._send(*item)
                    burst += 1
                    item = None
                    if burst < _MAX_BURST:
                        try:
                            item = self._queue.get_nowait()
                        except queue.Empty:
                            pass
        except Exception:  # pragma: no cover - a bug; keep the scheduler alive
            logger.exception("kvindex.events: publisher thread failed")
        finally:
            self._pub.close(linger=0)
            for sock in (self._replay, self._snap):
                if sock is not None:
                    sock.close(linger=0)

    def _send(self, seq: int, payload: bytes) -> None:
        try:
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
            self._stats["sent"] += 1
        except zmq.ZMQError as exc:
            self._stats["send_errors"] += 1
            logger.warning("kvindex.events: batch %d not sent: %s", seq, exc)
        self._buffer.append((seq, payload))
        self._last_send = time.monotonic()

    def _heartbeat(self) -> None:
        hb = self._heartbeat_s
        if hb is None or time.monotonic() - self._last_send < hb or not self._queue.empty():
            return
        frames = (self._topic, HEARTBEAT, self._epoch, seq_bytes(self._next_seq))
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
            self._stats["heartbeats"] += 1
        except zmq.ZMQError as exc:
            self._stats["send_errors"] += 1
            logger.warning("kvindex.events: heartbeat not sent: %s", exc)
        self._last_send = time.monotonic()

    def _answer(self, sock: Any, ident: bytes, items: deque[tuple[bytes, ...]], what: str) -> None:
        """Queues an answer for ``_flush_pending``; refused (counted) when too many wait."""
        if len(self._pending) >= _MAX_PENDING:
            self._stats[f"{what}_refused"] += 1
            logger.warning(
                "kvindex.events: %s request refused: %d answers waiting", what, len(self._pending)
            )
            if what != "replay":
                return
            # The end marker alone tells the consumer at once that nothing comes.
            items = deque([(END_SEQ, b"")])
        self._pending.append(_Pending(sock, ident, items, what))

    def _flush_pending(self) -> None:
        """Sends what the sockets take of the waiting answers; an answer whose consumer
        stopped reading (no progress for a while) or left is abandoned, counted."""
        now = time.monotonic()
        for _ in range(len(self._pending)):
            p = self._pending.popleft()
            try:
                while p.items:
                    p.sock.send_multipart((p.ident, b"", *p.items[0]), zmq.NOBLOCK)
                    p.items.popleft()
                    p.since = now
                    if p.what == "replay" and p.items:
                        self._stats["replayed"] += 1
                if p.what == "snapshot":
                    self._stats["snapshots"] += 1
                continue
            except zmq.Again:
                if now - p.since < _PENDING_TTL_S:
                    self._pending.append(p)
                    continue
            except zmq.ZMQError:
                pass  # unroutable: the consumer is gone
            self._stats[f"{p.what}_abandoned"] += 1
            logger.warning("kvindex.events: %s answer abandoned (consumer not reading)", p.what)

    def _service_snapshots(self) -> None:
        sock = self._snap
        if sock is None:
            return
        while sock.poll(0):
            frames = sock.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or frames[2] != SNAPSHOT:
                self._stats["bad_replay_requests"] += 1
                logger.warning(
                    "kvindex.events: ignored a snapshot request of %d frames", len(frames)
                )
                continue
            self._stats["snapshot_requests"] += 1
            hashes, resume, exact = self.snapshot()
            flag = b"\x01" if exact else b"\x00"
            answer = (SNAPSHOT, self._epoch, seq_bytes(resume), flag, hashes)
            self._answer(sock, frames[0], deque([answer]), "snapshot")

    def _service_replay(self) -> None:
        sock = self._replay
        if sock is None:
            return
        while sock.poll(0):
            frames = sock.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                self._stats["bad_replay_requests"] += 1
                logger.warning(
                    "kvindex.events: ignored a replay request of %d frames "
                    "(expected [identity, b'', start_seq as 8 bytes])",
                    len(frames),
                )
                continue
            ident, _, start = frames
            start_seq = int.from_bytes(start, "big", signed=True)
            self._stats["replay_requests"] += 1
            items: deque[tuple[bytes, ...]] = deque(
                (seq_bytes(seq), payload) for seq, payload in self._buffer if seq >= start_seq
            )
            items.append((END_SEQ, b""))
            self._answer(sock, ident, items, "replay")
