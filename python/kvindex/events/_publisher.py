"""A KV-event publisher with vLLM's ZMQ protocol (PUB stream + ROUTER replay).

The scheduler's thread only encodes (one Rust call per step) and enqueues; a background
thread owns both sockets and does every send. Nothing the scheduler calls blocks: a
full queue drops the batch (its sequence number is spent, so subscribers see a gap)
and counts it; a PUB socket at its high-water mark drops as ZMQ does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from kvindex._core import EventEncoder, HashChainCache, RadixCache, RadixPrefixCache
from kvindex.events._batch import END_SEQ, Event, seq_bytes
from kvindex.events._endpoints import offset_endpoint, should_bind
from kvindex.events._zmq import attach, zmq
from kvindex.exceptions import ClosedError, DTypeError

from . import _options as _opt

logger = logging.getLogger("kvindex.events")

_STOP = object()
# How long the sender thread waits for a batch before servicing replay again (s).
_IDLE_POLL_S = 0.02
# Most batches sent in one go before replay requests are looked at again.
_MAX_BURST = 1024


class EventPublisher:
    """Publishes KV-event batches as vLLM 0.33's ``ZmqEventPublisher`` does.

    Every batch goes out as ``[topic, seq (8 bytes, big-endian), payload]`` on a PUB
    socket, sequence numbers from 0. With ``replay_endpoint`` a ROUTER socket answers
    a request ``[identity, b"", start_seq]`` with ``[identity, b"", seq, payload]`` for
    each of the last ``buffer_steps`` batches from ``start_seq`` on, then
    ``[identity, b"", -1, b""]``. Endpoints with a wildcard, ipc and inproc are bound,
    others connected (``bind`` overrides that); ``data_parallel_rank`` offsets TCP ports
    (``+rank``) and ipc paths (``_dp<rank>``), and is written into every batch.

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
    ) -> None:
        endpoint = _opt.text("endpoint", endpoint)
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
        self, cache: HashChainCache | RadixCache | RadixPrefixCache, ts: float | None = None
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
        ``bad_replay_requests``, and ``queued`` (waiting now)."""
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
            if self._replay is not None:
                self._replay.close(linger=0)

    def _send(self, seq: int, payload: bytes) -> None:
        try:
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
            self._stats["sent"] += 1
        except zmq.ZMQError as exc:
            self._stats["send_errors"] += 1
            logger.warning("kvindex.events: batch %d not sent: %s", seq, exc)
        self._buffer.append((seq, payload))

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
            try:
                for seq, payload in self._buffer:
                    if seq >= start_seq:
                        sock.send_multipart((ident, b"", seq_bytes(seq), payload), zmq.NOBLOCK)
                        self._stats["replayed"] += 1
                sock.send_multipart((ident, b"", END_SEQ, b""), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                logger.warning("kvindex.events: replay answer cut short: %s", exc)
