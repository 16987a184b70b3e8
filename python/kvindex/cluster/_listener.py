"""The transport: every worker's KV-event stream received on one background thread.

Each worker is a SUB socket (vLLM 0.33 frames ``[topic, seq, payload]``) and, with a
replay endpoint, a DEALER socket to its publisher's ROUTER. Payloads go straight into
:meth:`ClusterIndex.apply` (decoded and applied in Rust). Bad frames and malformed
payloads are counted and logged, never raised. Queries on the index are safe from any
thread.

Gap repair never blocks the receive loop. A gap sends one replay request and puts the
stream in repair: its later batches are held (in order) while the loop goes on receiving
every stream, the replay answers included, as they arrive. Replayed batches in the gap
are applied as they come; when the gap is filled, the replay ends (its end marker) or
``replay_timeout`` passes, or more than ``max_held`` batches wait behind it, the held
batches are applied in order, and what replay did not supply is given up (the worker
degraded). The index then ends in the state a
lossless run gives whenever replay had the missing batches.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvindex import _checks
from kvindex._core import ClusterIndex
from kvindex.events import _options as _opt
from kvindex.events._batch import END_SEQ, seq_bytes
from kvindex.events._zmq import attach, zmq
from kvindex.exceptions import ClosedError, KvIndexError

logger = logging.getLogger("kvindex.cluster")

# Most messages taken from one socket before the others are looked at again.
_BURST = 1000


@dataclass
class _Repair:
    start: int  # the first missing sequence number
    stop: int  # the batch that showed the gap (held)
    deadline: float


@dataclass
class _Stream:
    slot: int
    name: str
    sub: Any = None
    replay: Any = None
    repair: _Repair | None = None
    held: deque[tuple[int, bytes]] = field(default_factory=deque)
    # replay requests sent whose end marker has not come back
    outstanding: int = 0
    # whether a batch has come in on the SUB socket yet
    joined: bool = False


@dataclass
class _Reply:
    done: threading.Event = field(default_factory=threading.Event)
    slot: int = -1
    error: BaseException | None = None


class ClusterListener:
    """Feeds ``index`` from workers' event streams on a background thread.

    :meth:`add_worker` connects the worker's sockets and registers it in the index
    (returning its slot); a malformed endpoint raises ``InvalidArgumentError`` with
    nothing registered. :meth:`remove_worker` disconnects and drops its blocks.
    :attr:`stats` counts messages, bad frames, malformed payloads, gaps, late joins (a
    stream whose first batch received is not its first: subscribed mid-stream, or ZMQ's
    slow joiner; its start is fetched through replay like a gap's, logged at INFO
    level), batches held behind a repair, batches repaired by replay and batches given
    up, and the time spent in the index's ``apply`` (``apply_ns``). At most ``max_held``
    batches per stream wait behind a repair: one more ends it, giving up what replay has
    not supplied. :meth:`close` stops the thread.
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        replay_timeout: float = 1.0,
        poll_interval: float = 0.01,
        rcvhwm: int = 100_000,
        max_held: int = 100_000,
    ) -> None:
        self.index = index
        self._replay_timeout = replay_timeout
        self._max_held = _opt.count("max_held", max_held, low=1, high=2**62)
        self._poll_ms = max(int(poll_interval * 1000), 1)
        self._rcvhwm = rcvhwm
        self._ctx = zmq.Context()
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        # socket -> (stream, is the replay socket)
        self._sockets: dict[Any, tuple[_Stream, bool]] = {}
        self._lock = threading.Lock()
        self._repairs = 0  # streams in repair (written by the receive thread only)
        self._stats = {
            "received": 0,
            "applied": 0,
            "bad_frames": 0,
            "malformed": 0,
            "duplicates": 0,
            "gaps": 0,
            "late_joins": 0,
            "held": 0,
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

    @property
    def repairing(self) -> int:
        """Streams with a replay repair in flight now."""
        return self._repairs

    def add_worker(
        self,
        name: str,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str | bytes = "",
        dp_rank: int = 0,
    ) -> int:
        """Subscribes to a worker's stream and registers it in the index; returns its
        slot. Raises ``InvalidArgumentError`` for a malformed endpoint, ``DTypeError`` /
        ``InvalidArgumentError`` for a bad name or ``dp_rank`` (nothing changed), and
        ``ClosedError`` after :meth:`close`."""
        if self._stop.is_set():
            raise ClosedError("ClusterListener is closed")
        name = _checks.text("name", name)
        dp_rank = _checks.count("dp_rank", dp_rank, low=-(2**63), high=2**63 - 1)
        endpoint = _opt.text("endpoint", endpoint)
        if replay_endpoint is not None:
            replay_endpoint = _opt.text("replay_endpoint", replay_endpoint)
        t = _opt.topic_bytes(topic)
        reply = _Reply()
        self._commands.put(("add", (name, dp_rank, endpoint, replay_endpoint, t, reply)))
        self._answer(reply)
        return reply.slot

    def remove_worker(self, slot: int) -> None:
        """Unsubscribes a worker and removes it (and its blocks) from the index. Raises
        ``InvalidArgumentError`` for a slot without a worker, ``DTypeError`` for a slot
        that is not an int, and ``ClosedError`` after :meth:`close` (at once)."""
        if self._stop.is_set():
            raise ClosedError("ClusterListener is closed")
        slot = _checks.count("slot", slot, low=0, high=2**32 - 1)
        reply = _Reply()
        self._commands.put(("remove", (slot, reply)))
        self._answer(reply)

    def _answer(self, reply: _Reply) -> None:
        """Waits for the receive thread's answer to a command; raises its error, or
        ``ClosedError`` once the thread has stopped without answering (closed
        meanwhile)."""
        deadline = time.monotonic() + 5.0
        while not reply.done.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                if reply.done.is_set():
                    break
                raise ClosedError("ClusterListener's receive thread did not answer (closed?)")
        if reply.error is not None:
            raise reply.error

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

    def _add(self, poller: Any, arg: Any) -> None:
        name, dp_rank, endpoint, replay_endpoint, topic, reply = arg
        sub = replay = None
        try:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            attach(sub, endpoint, bind=False)
            if replay_endpoint is not None:
                replay = self._ctx.socket(zmq.DEALER)
                replay.setsockopt(zmq.LINGER, 0)
                attach(replay, replay_endpoint, bind=False, option="replay_endpoint")
            slot = self.index.add_worker(name, dp_rank)
        except (KvIndexError, ValueError, TypeError, zmq.ZMQError) as e:
            for sock in (sub, replay):
                if sock is not None:
                    sock.close(linger=0)
            reply.error = e
            reply.done.set()
            return
        s = _Stream(slot, name, sub, replay)
        self._streams[slot] = s
        self._sockets[sub] = (s, False)
        poller.register(sub, zmq.POLLIN)
        if replay is not None:
            self._sockets[replay] = (s, True)
            poller.register(replay, zmq.POLLIN)
        reply.slot = slot
        reply.done.set()

    def _commands_pending(self, poller: Any) -> None:
        while True:
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                self._add(poller, arg)
                continue
            slot, reply = arg
            gone = self._streams.pop(slot, None)
            if gone is not None:
                self._repairs -= gone.repair is not None
                for sock in (gone.sub, gone.replay):
                    if sock is not None:
                        poller.unregister(sock)
                        self._sockets.pop(sock, None)
                        sock.close(linger=0)
            try:
                self.index.remove_worker(slot)
            except KvIndexError as exc:
                reply.error = exc
            reply.done.set()

    def _run(self) -> None:
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                self._commands_pending(poller)
                wait = self._poll_ms
                deadlines = [s.repair.deadline for s in self._streams.values() if s.repair]
                if deadlines:
                    left = min(deadlines) - time.monotonic()
                    wait = max(min(wait, int(left * 1000) + 1), 0)
                for sock, _ in poller.poll(wait):
                    stream, is_replay = self._sockets.get(sock, (None, False))
                    if stream is None:
                        continue
                    for _ in range(_BURST):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if is_replay:
                            self._replayed(stream, frames)
                        else:
                            self._received(stream, frames)
                if deadlines:
                    self._expire_repairs()
        except Exception:  # pragma: no cover - a bug; keep the caller alive
            logger.exception("kvindex.cluster: listener thread failed")
        finally:
            for s in self._streams.values():
                s.sub.close(linger=0)
                if s.replay is not None:
                    s.replay.close(linger=0)
            while True:  # callers waiting on a command get their answer
                try:
                    cmd, arg = self._commands.get_nowait()
                except queue.Empty:
                    break
                reply = arg[-1]
                reply.error = ClosedError("ClusterListener is closed")
                reply.done.set()

    def _received(self, s: _Stream, frames: list[bytes]) -> None:
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
        if not s.joined:
            s.joined = True
            if seq > 0 and self.index.worker_info(s.slot)["next_seq"] == 0:
                # Subscribed mid-stream (or ZMQ's slow joiner: PUB drops what it sends
                # before the subscription reaches it): not a loss, the start of the
                # stream comes through replay.
                self._count("late_joins")
                logger.info(
                    "kvindex.cluster: %s: joined at batch %d; fetching 0..%d through replay",
                    s.name,
                    seq,
                    seq - 1,
                )
                self._offer(s, seq, frames[2], joining=True)
                return
        self._offer(s, seq, frames[2])

    def _apply(self, s: _Stream, seq: int, payload: bytes) -> tuple[str, int]:
        t0 = time.perf_counter_ns()
        out = self.index.apply(s.slot, seq, payload)
        self._count("apply_ns", time.perf_counter_ns() - t0)
        return out

    def _offer(self, s: _Stream, seq: int, payload: bytes, *, joining: bool = False) -> None:
        """A live batch: held behind a repair in flight, else applied; a gap starts one
        (``joining``: the stream's start, fetched the same way but not a gap)."""
        if s.repair is not None:
            s.held.append((seq, payload))
            self._count("held")
            if len(s.held) > self._max_held:
                logger.warning(
                    "kvindex.cluster: %s: %d batches held behind replay from %d; giving up",
                    s.name,
                    len(s.held),
                    s.repair.start,
                )
                self._end_repair(s)
            return
        outcome, expected = self._apply(s, seq, payload)
        if outcome != "gap":
            self._tally(s, seq, outcome)
            return
        if not joining:
            self._count("gaps")
            logger.warning("kvindex.cluster: %s: gap %d..%d", s.name, expected, seq - 1)
        if s.replay is None:
            self._give_up(s, seq, payload, expected, 0)
            return
        s.replay.send_multipart((b"", seq_bytes(expected)))
        s.outstanding += 1
        s.repair = _Repair(expected, seq, time.monotonic() + self._replay_timeout)
        self._repairs += 1
        s.held.append((seq, payload))
        self._count("held")

    def _give_up(self, s: _Stream, seq: int, payload: bytes, expected: int, got: int) -> None:
        lost = seq - expected
        self._count("given_up", lost)
        logger.warning(
            "kvindex.cluster: %s: %d batches lost (replay had %d); degraded", s.name, lost, got
        )
        self.index.give_up(s.slot, seq)
        self._tally(s, seq, self._apply(s, seq, payload)[0])

    def _replayed(self, s: _Stream, frames: list[bytes]) -> None:
        """One replay answer: a batch of the gap (applied now) or the end marker."""
        if len(frames) == 3 and frames[0] == b"":
            _, seq_frame, payload = frames
        elif len(frames) == 4 and frames[0] == b"":
            _, _, seq_frame, payload = frames
        else:
            self._count("bad_frames")
            return
        r = s.repair
        if seq_frame == END_SEQ:
            s.outstanding = max(s.outstanding - 1, 0)
            if r is not None and s.outstanding == 0:
                self._end_repair(s)
            return
        if len(seq_frame) != 8:
            self._count("bad_frames")
            return
        seq = int.from_bytes(seq_frame, "big")
        if r is None or not r.start <= seq < r.stop:
            return  # outside the gap: an answer to an earlier request, or held already
        before = self.index.worker_info(s.slot)["next_seq"]
        outcome, _ = self._apply(s, seq, payload)
        after = self.index.worker_info(s.slot)["next_seq"]
        if after > before:
            self._count("repaired")
        if outcome != "gap":
            self._tally(s, seq, outcome)
        if after >= r.stop:
            self._end_repair(s)

    def _expire_repairs(self) -> None:
        now = time.monotonic()
        for s in list(self._streams.values()):
            if s.repair is not None and now >= s.repair.deadline:
                logger.warning(
                    "kvindex.cluster: %s: replay from %d timed out", s.name, s.repair.start
                )
                self._end_repair(s)

    def _end_repair(self, s: _Stream) -> None:
        """Applies the held batches in order; the first one (the gap's end) gives up what
        replay did not supply. A later gap among them starts the next repair."""
        r = s.repair
        assert r is not None
        s.repair = None
        self._repairs -= 1
        held, s.held = s.held, deque()
        seq, payload = held.popleft()
        outcome, expected = self._apply(s, seq, payload)
        if outcome == "gap":
            got = max(expected - r.start, 0)
            self._give_up(s, seq, payload, expected, got)
        else:
            self._tally(s, seq, outcome)
        while held:
            seq, payload = held.popleft()
            if s.repair is not None:
                s.held.append((seq, payload))
            else:
                self._offer(s, seq, payload)

    def _tally(self, s: _Stream, seq: int, outcome: str) -> None:
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
