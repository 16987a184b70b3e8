"""The transport: every worker's KV-event stream received on one background thread.

Each worker is a SUB socket (vLLM 0.33 frames ``[topic, seq, payload]``) and, with a
replay endpoint, a DEALER socket to its publisher's ROUTER. Payloads go straight into
:meth:`ClusterIndex.apply` (decoded and applied in Rust). A gap is repaired through
replay on the receive thread (bounded by ``replay_timeout``); what replay cannot
supply is given up (the worker is degraded). Bad frames and malformed payloads are
counted and logged, never raised. Queries on the index are safe from any thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvindex._core import ClusterIndex
from kvindex.events._batch import END_SEQ, seq_bytes
from kvindex.events._zmq import zmq

logger = logging.getLogger("kvindex.cluster")


@dataclass
class _Stream:
    slot: int
    name: str
    sub: Any = None
    replay: Any = None
    counters: dict[str, int] = field(default_factory=dict)


class ClusterListener:
    """Feeds ``index`` from workers' event streams on a background thread.

    :meth:`add_worker` registers a worker in the index at once (returning its slot) and
    has the thread connect its sockets; :meth:`remove_worker` disconnects and drops its
    blocks. :attr:`stats` counts messages, bad frames, malformed payloads, gaps,
    batches repaired by replay and batches given up, and the time spent in the
    index's ``apply`` (``apply_ns``, first attempts). :meth:`close` stops the thread.
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        replay_timeout: float = 1.0,
        poll_interval: float = 0.01,
        rcvhwm: int = 100_000,
    ) -> None:
        self.index = index
        self._replay_timeout = replay_timeout
        self._poll_ms = max(int(poll_interval * 1000), 1)
        self._rcvhwm = rcvhwm
        self._ctx = zmq.Context()
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._stats = {
            "received": 0,
            "applied": 0,
            "bad_frames": 0,
            "malformed": 0,
            "duplicates": 0,
            "gaps": 0,
            "repaired": 0,
            "given_up": 0,
            "restarts": 0,
            "unknown_worker": 0,
            "apply_ns": 0,
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="kvindex-cluster-listener", daemon=True
        )
        self._thread.start()

    @property
    def stats(self) -> dict[str, int]:
        """Counters over every stream (see the class docstring)."""
        with self._lock:
            return dict(self._stats)

    def add_worker(
        self,
        name: str,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str | bytes = "",
        dp_rank: int = 0,
    ) -> int:
        """Registers a worker (slot returned now) and subscribes to its stream."""
        slot = self.index.add_worker(name, dp_rank)
        t = topic.encode() if isinstance(topic, str) else bytes(topic)
        done = threading.Event()
        self._commands.put(("add", (slot, name, endpoint, replay_endpoint, t, done)))
        done.wait(5.0)
        return slot

    def remove_worker(self, slot: int) -> None:
        """Unsubscribes a worker and removes it (and its blocks) from the index."""
        done = threading.Event()
        self._commands.put(("remove", (slot, done)))
        done.wait(5.0)

    def close(self, timeout: float = 2.0) -> None:
        """Stops the thread and closes the sockets. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout)
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)

    def __enter__(self) -> ClusterListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the receive thread ---------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _commands_pending(self, poller: Any) -> None:
        while True:
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                slot, name, endpoint, replay_endpoint, topic, done = arg
                s = _Stream(slot, name)
                s.sub = self._ctx.socket(zmq.SUB)
                s.sub.setsockopt(zmq.LINGER, 0)
                s.sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
                s.sub.setsockopt(zmq.SUBSCRIBE, topic)
                s.sub.connect(endpoint)
                if replay_endpoint is not None:
                    s.replay = self._ctx.socket(zmq.DEALER)
                    s.replay.setsockopt(zmq.LINGER, 0)
                    s.replay.connect(replay_endpoint)
                self._streams[slot] = s
                poller.register(s.sub, zmq.POLLIN)
                done.set()
            else:
                slot, done = arg
                gone = self._streams.pop(slot, None)
                if gone is not None:
                    poller.unregister(gone.sub)
                    gone.sub.close(linger=0)
                    if gone.replay is not None:
                        gone.replay.close(linger=0)
                try:
                    self.index.remove_worker(slot)
                except ValueError as exc:
                    logger.warning("kvindex.cluster: remove_worker(%d): %s", slot, exc)
                done.set()

    def _run(self) -> None:
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                self._commands_pending(poller)
                for sock, _ in poller.poll(self._poll_ms):
                    stream = next((s for s in self._streams.values() if s.sub is sock), None)
                    if stream is None:
                        continue
                    for _ in range(1000):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(stream, frames)
        except Exception:  # pragma: no cover - a bug; keep the caller alive
            logger.exception("kvindex.cluster: listener thread failed")
        finally:
            for s in self._streams.values():
                s.sub.close(linger=0)
                if s.replay is not None:
                    s.replay.close(linger=0)

    def _handle(self, s: _Stream, frames: list[bytes]) -> None:
        self._count("received")
        if len(frames) != 3 or len(frames[1]) != 8:
            self._count("bad_frames")
            logger.warning(
                "kvindex.cluster: %s: message of %d frames / bad sequence frame skipped",
                s.name,
                len(frames),
            )
            return
        seq = int.from_bytes(frames[1], "big")
        self._apply(s, seq, frames[2], replayed=False)

    def _apply(self, s: _Stream, seq: int, payload: bytes, *, replayed: bool) -> None:
        t0 = time.perf_counter_ns()
        outcome, expected = self.index.apply(s.slot, seq, payload)
        self._count("apply_ns", time.perf_counter_ns() - t0)
        if outcome == "gap" and not replayed:
            self._count("gaps")
            logger.warning("kvindex.cluster: %s: gap %d..%d", s.name, expected, seq - 1)
            got = self._repair(s, expected, seq)
            outcome, expected = self.index.apply(s.slot, seq, payload)
            if outcome == "gap":
                self._count("given_up", seq - expected)
                logger.warning(
                    "kvindex.cluster: %s: %d batches lost (replay had %d); degraded",
                    s.name,
                    seq - expected,
                    got,
                )
                self.index.give_up(s.slot, seq)
                outcome, expected = self.index.apply(s.slot, seq, payload)
        if outcome in ("applied", "restarted"):
            self._count("applied")
            if outcome == "restarted":
                self._count("restarts")
                logger.warning("kvindex.cluster: %s: publisher restarted; state dropped", s.name)
        elif outcome == "duplicate":
            self._count("duplicates")
        elif outcome == "unknown_worker":
            self._count("unknown_worker")
        elif outcome.startswith("malformed"):
            self._count("malformed")
            logger.warning("kvindex.cluster: %s: batch %d %s", s.name, seq, outcome)

    def _repair(self, s: _Stream, start: int, stop: int) -> int:
        """Fetches ``start..stop-1`` through replay and applies them; returns how many."""
        sock = s.replay
        if sock is None:
            return 0
        sock.send_multipart((b"", seq_bytes(start)))
        deadline = time.monotonic() + self._replay_timeout
        got = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                logger.warning("kvindex.cluster: %s: replay from %d timed out", s.name, start)
                return got
            frames = sock.recv_multipart()
            if len(frames) == 3 and frames[0] == b"":
                _, seq_frame, payload = frames
            elif len(frames) == 4 and frames[0] == b"":
                _, _, seq_frame, payload = frames
            else:
                self._count("bad_frames")
                continue
            if seq_frame == END_SEQ:
                return got
            if len(seq_frame) != 8:
                self._count("bad_frames")
                continue
            seq = int.from_bytes(seq_frame, "big")
            if start <= seq < stop:
                before = self.index.worker_info(s.slot)["next_seq"]
                self._apply(s, seq, payload, replayed=True)
                if self.index.worker_info(s.slot)["next_seq"] > before:
                    got += 1
                    self._count("repaired")
