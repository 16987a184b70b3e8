"""The transport: every worker's KV-event stream received on one background thread.

Each worker is a SUB socket (vLLM 0.33 frames ``[topic, seq, payload]``), with a replay
endpoint a DEALER socket to its publisher's ROUTER, and with a snapshot endpoint
(kvindex's extension, ``kvindex/events/WIRE.md``) a DEALER socket to its snapshot
ROUTER. Payloads go straight into :meth:`ClusterIndex.apply` (decoded and applied in
Rust). Nothing received stops the thread: bad frames (a sequence number above
``2**63-1`` included) and malformed payloads are counted and logged, never raised, and
an unexpected error in handling one message is counted (``errors``) and logged with
the other streams untouched. Queries on the index are safe from any thread.

Gap repair never blocks the receive loop. A gap sends one replay request and puts the
stream in repair: its later batches are held (in order) while the loop goes on receiving
every stream, the replay answers included, as they arrive. Replayed batches in the gap
are applied as they come; when the gap is filled, the replay ends (its end marker) or
``replay_timeout`` passes, or more than ``max_held`` batches wait behind it, the held
batches are applied in order. What replay did not supply is fetched as a snapshot when
the worker has a snapshot endpoint (the worker is resyncing until it arrives), else
given up (the worker degraded).

Bootstrap: a worker added with a snapshot endpoint asks for its snapshot at once and
is resyncing until it arrives (asked again every ``replay_timeout``); its live batches
wait behind it, and the ones the snapshot already covers are dropped. Without one, the
stream's start is fetched through replay at once, and again while the stream has sent
nothing, so a quiet late joiner is known as soon as its publisher answers. A heartbeat
tells a quiet stream's lost last batches (fetched as a gap's) and a new epoch a
publisher restart (its state dropped and fetched again).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvindex import _checks
from kvindex._core import ClusterIndex
from kvindex.events import _options as _opt
from kvindex.events._batch import (
    END_SEQ,
    SNAPSHOT,
    read_heartbeat,
    read_seq,
    read_snapshot,
    seq_bytes,
)
from kvindex.events._zmq import attach, zmq
from kvindex.exceptions import ClosedError, DTypeError, InvalidArgumentError, KvIndexError

logger = logging.getLogger("kvindex.cluster")

# Most messages taken from one socket before the others are looked at again.
_BURST = 1000
# A repair of the stream's start (or a probe of a quiet stream): no end but the replay's.
_OPEN = 2**64
# Longest poll_interval / replay_timeout / stale_after accepted (seconds).
_MAX_WAIT_S = 86_400.0

HEALTH: tuple[str, ...] = ("healthy", "resyncing", "degraded", "stale")
"""Per-worker health names (:meth:`ClusterListener.worker_info`)."""


def _wait(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    """A finite number of seconds in ``(0, _MAX_WAIT_S]`` (None when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    v = float(value) if isinstance(value, float) or abs(value) < 2**53 else float("inf")
    if not 0 < v <= _MAX_WAIT_S:  # nan and inf fail too
        raise InvalidArgumentError(f"{name} must be in (0, {_MAX_WAIT_S:g}] seconds, got {value}")
    return v


def _recoverable(exc: BaseException) -> bool:
    """Whether the receive thread goes on after ``exc``: any error, a Rust panic
    included (pyo3's ``PanicException`` derives from ``BaseException``), but not an
    interpreter exit."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


@dataclass
class _Repair:
    start: int  # the first missing sequence number
    stop: int  # the first not asked for (the held batch that showed the gap), or _OPEN
    deadline: float


@dataclass
class _Stream:
    slot: int
    name: str
    sub: Any = None
    replay: Any = None
    snap: Any = None
    repair: _Repair | None = None
    # deadline of the snapshot request in flight (None: no bootstrap)
    boot: float | None = None
    held: deque[tuple[int, bytes]] = field(default_factory=deque)
    # replay requests sent whose end marker has not come back
    outstanding: int = 0
    # snapshot requests sent and not answered; answers to skip (earlier bootstraps')
    snaps_due: int = 0
    snaps_skip: int = 0
    # whether a message (batch or heartbeat) has come in on the SUB socket yet
    joined: bool = False
    epoch: bytes | None = None
    # batches below this were covered by the last snapshot restored (dropped)
    floor: int = 0
    added: float = 0.0
    last_rx: float | None = None
    next_probe: float = 0.0
    bad_frames: int = 0


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
    up, heartbeats, snapshots requested and restored, batches a snapshot covered
    (``superseded``), errors, and the time spent in the index's ``apply``
    (``apply_ns``). At most ``max_held`` batches per stream wait behind a repair: one
    more ends it, giving up what replay has not supplied (behind a snapshot request the
    oldest is dropped instead). :meth:`worker_info` adds the listener's view of a worker
    (``health``: ``healthy``, ``resyncing``, ``degraded``, or ``stale`` when nothing,
    heartbeat or batch, came for ``stale_after`` seconds) and :meth:`metrics` sums it
    up. :meth:`close` stops the thread.

    ``replay_timeout``, ``poll_interval`` and ``stale_after`` are seconds in
    ``(0, 86400]`` (``stale_after`` None: never stale), ``rcvhwm`` a ZMQ high-water
    mark; other values raise a ``KvIndexError`` subclass before any thread starts.
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        replay_timeout: float = 1.0,
        poll_interval: float = 0.01,
        rcvhwm: int = 100_000,
        max_held: int = 100_000,
        stale_after: float | None = None,
    ) -> None:
        if not isinstance(index, ClusterIndex):
            raise DTypeError(f"index must be a ClusterIndex, got {type(index).__name__}")
        timeout = _wait("replay_timeout", replay_timeout)
        poll = _wait("poll_interval", poll_interval)
        assert timeout is not None and poll is not None
        self._stale_after = _wait("stale_after", stale_after, allow_none=True)
        self._max_held = _opt.count("max_held", max_held, low=1, high=2**62)
        self._rcvhwm = _opt.count("rcvhwm", rcvhwm, low=0, high=_opt.INT_OPTION_MAX)
        self.index = index
        self._replay_timeout = timeout
        self._poll_ms = max(int(poll * 1000), 1)
        self._ctx = zmq.Context()
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        # socket -> (stream, kind: "sub", "replay" or "snap")
        self._sockets: dict[Any, tuple[_Stream, str]] = {}
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
            "heartbeats": 0,
            "replay_requests": 0,
            "snapshot_requests": 0,
            "snapshots": 0,
            "stale_snapshots": 0,
            "requests_not_sent": 0,
            "superseded": 0,
            "errors": 0,
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

    @property
    def alive(self) -> bool:
        """Whether the receive thread runs."""
        return self._thread.is_alive()

    def worker_info(self, slot: int) -> dict[str, Any]:
        """The index's :meth:`~ClusterIndex.worker_info` of ``slot`` plus ``health``
        (``healthy``, ``resyncing``, ``degraded`` or ``stale``), ``since_last_s`` (seconds
        since its last batch or heartbeat; None before any), ``epoch`` (hex, from its
        heartbeats or snapshot; None before any) and ``bad_frames``."""
        info = self.index.worker_info(slot)
        s = self._streams.get(slot)
        now = time.monotonic()
        last = None if s is None else s.last_rx
        info["since_last_s"] = None if last is None else now - last
        info["epoch"] = None if s is None or s.epoch is None else s.epoch.hex()
        info["bad_frames"] = 0 if s is None else s.bad_frames
        info["health"] = self._health(s, str(info["status"]), now)
        return info

    def _health(self, s: _Stream | None, status: str, now: float) -> str:
        if status == "resyncing" or (s is not None and (s.boot is not None or s.repair)):
            return "resyncing"
        if status == "degraded":
            return "degraded"
        if s is not None and self._stale_after is not None:
            last = s.added if s.last_rx is None else s.last_rx
            if now - last > self._stale_after:
                return "stale"
        return "healthy"

    def metrics(self) -> dict[str, int]:
        """Workers per health (``workers``, ``healthy``, ``resyncing``, ``degraded``,
        ``stale``), streams in repair and bootstrapping, and every counter of
        :attr:`stats`."""
        out = dict.fromkeys(("workers", *HEALTH), 0)
        statuses = self.index.statuses()
        now = time.monotonic()
        booting = 0
        for slot, s in list(self._streams.items()):
            if slot < len(statuses) and statuses[slot]:
                out["workers"] += 1
                out[self._health(s, statuses[slot], now)] += 1
                booting += s.boot is not None
        out["repairing"] = self._repairs
        out["bootstrapping"] = booting
        out.update(self.stats)
        return out

    def add_worker(
        self,
        name: str,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str | bytes = "",
        dp_rank: int = 0,
        snapshot_endpoint: str | None = None,
        resume: tuple[Any, int] | None = None,
        groups: Sequence[tuple[str, int, int, str]] | None = None,
    ) -> int:
        """Subscribes to a worker's stream and registers it in the index; returns its
        slot. With ``snapshot_endpoint`` the worker is rebuilt from its publisher's
        snapshot first (resyncing until then); ``resume`` (``(hashes, next_seq)``, e.g.
        from a peer's :func:`index_snapshot`) starts it from that state instead.
        ``groups`` declares its KV cache groups before its first batch
        (:meth:`ClusterIndex.set_worker_layout`; e.g. a layout's
        ``[g.core_tuple() for g in layout.groups]``): it is then scored by its engine's
        hybrid hit. Raises
        ``InvalidArgumentError`` for a malformed endpoint, ``DTypeError`` /
        ``InvalidArgumentError`` for a bad name, ``dp_rank`` or ``resume`` (nothing
        changed), and ``ClosedError`` after :meth:`close`."""
        if self._stop.is_set():
            raise ClosedError("ClusterListener is closed")
        name = _checks.text("name", name)
        dp_rank = _checks.count("dp_rank", dp_rank, low=-(2**63), high=2**63 - 1)
        endpoint = _opt.text("endpoint", endpoint)
        if replay_endpoint is not None:
            replay_endpoint = _opt.text("replay_endpoint", replay_endpoint)
        if snapshot_endpoint is not None:
            snapshot_endpoint = _opt.text("snapshot_endpoint", snapshot_endpoint)
        if resume is not None:
            if not isinstance(resume, tuple) or len(resume) != 2:
                raise DTypeError("resume must be a (hashes, next_seq) tuple")
            hashes = np.ascontiguousarray(resume[0], dtype=np.uint64)
            nxt = _opt.count("resume next_seq", resume[1], low=0, high=2**63 - 1)
            resume = (hashes, nxt)
        t = _opt.topic_bytes(topic)
        reply = _Reply()
        args = (
            name,
            dp_rank,
            endpoint,
            replay_endpoint,
            snapshot_endpoint,
            t,
            resume,
            groups,
            reply,
        )
        self._commands.put(("add", args))
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
        (
            name,
            dp_rank,
            endpoint,
            replay_endpoint,
            snapshot_endpoint,
            topic,
            resume,
            groups,
            reply,
        ) = arg
        socks: list[Any] = []
        slot = None
        try:
            sub = self._ctx.socket(zmq.SUB)
            socks.append(sub)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            attach(sub, endpoint, bind=False)
            dealers = []
            for ep, option in (
                (replay_endpoint, "replay_endpoint"),
                (snapshot_endpoint, "snapshot_endpoint"),
            ):
                d = None
                if ep is not None:
                    d = self._ctx.socket(zmq.DEALER)
                    socks.append(d)
                    d.setsockopt(zmq.LINGER, 0)
                    attach(d, ep, bind=False, option=option)
                dealers.append(d)
            slot = self.index.add_worker(name, dp_rank)
            if groups is not None:
                self.index.set_worker_layout(slot, groups)
            if resume is not None:
                self.index.restore_worker(slot, resume[0], resume[1])
        except (KvIndexError, ValueError, TypeError, zmq.ZMQError) as e:
            for sock in socks:
                sock.close(linger=0)
            if slot is not None:
                self.index.remove_worker(slot)
            reply.error = e
            reply.done.set()
            return
        now = time.monotonic()
        s = _Stream(slot, name, sub, dealers[0], dealers[1], added=now)
        self._streams[slot] = s
        for sock, kind in ((sub, "sub"), (s.replay, "replay"), (s.snap, "snap")):
            if sock is not None:
                self._sockets[sock] = (s, kind)
                poller.register(sock, zmq.POLLIN)
        if resume is not None:
            s.floor = resume[1]
        elif s.snap is not None:
            self._start_boot(s)
        elif s.replay is not None:
            # The stream's start, fetched now: a quiet worker is known without waiting
            # for a batch (which ZMQ's slow joiner may drop anyway).
            self._start_repair(s, 0, _OPEN)
        s.next_probe = now + self._replay_timeout
        reply.slot = slot
        reply.done.set()

    def _remove(self, poller: Any, arg: Any) -> None:
        slot, reply = arg
        gone = self._streams.pop(slot, None)
        if gone is not None:
            self._repairs -= gone.repair is not None
            for sock in (gone.sub, gone.replay, gone.snap):
                if sock is not None:
                    poller.unregister(sock)
                    self._sockets.pop(sock, None)
                    sock.close(linger=0)
        try:
            self.index.remove_worker(slot)
        except KvIndexError as exc:
            reply.error = exc
        reply.done.set()

    def _commands_pending(self, poller: Any) -> None:
        while True:
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                if cmd == "add":
                    self._add(poller, arg)
                else:
                    self._remove(poller, arg)
            except BaseException as exc:  # a bug: answer the caller, keep the thread
                if not _recoverable(exc):
                    raise
                self._count("errors")
                logger.exception("kvindex.cluster: %s failed", cmd)
                reply = arg[-1]
                reply.error = InvalidArgumentError(f"{cmd}_worker failed: {exc}")
                reply.done.set()

    def _run(self) -> None:
        poller = zmq.Poller()
        next_tick = 0.0
        try:
            while not self._stop.is_set():
                self._commands_pending(poller)
                try:
                    ready = poller.poll(self._poll_ms)
                except zmq.ZMQError as exc:
                    if self._stop.is_set():
                        break
                    self._count("errors")
                    logger.warning("kvindex.cluster: poll failed: %s", exc)
                    time.sleep(self._poll_ms / 1000)
                    continue
                for sock, _ in ready:
                    stream, kind = self._sockets.get(sock, (None, ""))
                    if stream is None:
                        continue
                    for _ in range(_BURST):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(stream, kind, frames)
                        if self._streams.get(stream.slot) is not stream:
                            break
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self._poll_ms / 1000
                    self._tick(now)
        except Exception:  # pragma: no cover - the loop itself failed; keep the caller alive
            logger.exception("kvindex.cluster: listener thread failed")
        finally:
            for s in self._streams.values():
                for sock in (s.sub, s.replay, s.snap):
                    if sock is not None:
                        sock.close(linger=0)
            while True:  # callers waiting on a command get their answer
                try:
                    cmd, arg = self._commands.get_nowait()
                except queue.Empty:
                    break
                reply = arg[-1]
                reply.error = ClosedError("ClusterListener is closed")
                reply.done.set()

    def _handle(self, s: _Stream, kind: str, frames: list[bytes]) -> None:
        """One message; whatever goes wrong is counted and logged, never raised."""
        try:
            if kind == "sub":
                self._received(s, frames)
            elif kind == "replay":
                self._replayed(s, frames)
            else:
                self._snapshot(s, frames)
        except BaseException as exc:
            if not _recoverable(exc):
                raise
            self._count("errors")
            logger.exception(
                "kvindex.cluster: %s: message of %d frames failed", s.name, len(frames)
            )

    def _tick(self, now: float) -> None:
        for s in list(self._streams.values()):
            try:
                self._expire(s, now)
            except BaseException as exc:
                if not _recoverable(exc):
                    raise
                self._count("errors")
                logger.exception("kvindex.cluster: %s: timer failed", s.name)

    def _expire(self, s: _Stream, now: float) -> None:
        if s.repair is not None and now >= s.repair.deadline:
            if s.repair.stop != _OPEN:
                logger.warning(
                    "kvindex.cluster: %s: replay from %d timed out", s.name, s.repair.start
                )
            self._end_repair(s, answered=False)
        if s.boot is not None and now >= s.boot:
            logger.info("kvindex.cluster: %s: no snapshot yet; asking again", s.name)
            self._ask_snapshot(s)
        if not s.joined and s.repair is None and s.boot is None and now >= s.next_probe:
            # Nothing came on the stream yet: ask again for what it may have sent.
            s.next_probe = now + self._replay_timeout
            if s.replay is not None:
                self._start_repair(s, self._next_seq(s), _OPEN)
            elif s.snap is not None:
                self._start_boot(s)

    def _bad(self, s: _Stream, what: str) -> None:
        s.bad_frames += 1
        self._count("bad_frames")
        logger.warning("kvindex.cluster: %s: %s skipped", s.name, what)

    def _next_seq(self, s: _Stream) -> int:
        return int(self.index.worker_info(s.slot)["next_seq"])

    def _received(self, s: _Stream, frames: list[bytes]) -> None:
        self._count("received")
        hb = read_heartbeat(frames)
        if hb is not None:
            self._heartbeat(s, *hb)
            return
        if len(frames) != 3:
            self._bad(s, f"message of {len(frames)} frames")
            return
        seq = read_seq(frames[1])
        if seq is None:
            self._bad(s, f"sequence frame {frames[1][:16].hex()} (8 bytes, at most 2**63-1)")
            return
        s.last_rx = time.monotonic()
        if not s.joined:
            s.joined = True
            if seq > 0 and self._next_seq(s) == 0:
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
                self._offer(s, seq, frames[2], joining=s.repair is None and s.boot is None)
                return
        self._offer(s, seq, frames[2])

    def _heartbeat(self, s: _Stream, epoch: bytes, next_seq: int) -> None:
        self._count("heartbeats")
        s.joined = True
        s.last_rx = time.monotonic()
        if s.epoch is not None and epoch != s.epoch:
            # A new start of the publisher: what came before it is gone.
            self._count("restarts")
            logger.warning("kvindex.cluster: %s: new publisher epoch: restarted", s.name)
            s.epoch = epoch
            s.outstanding = s.snaps_due = s.snaps_skip = 0
            if s.repair is not None:
                s.repair = None
                self._repairs -= 1
            self._count("superseded", len(s.held))
            s.held.clear()
            s.floor = 0
            if s.snap is not None:
                self._start_boot(s)
                return
            self.index.restore_worker(s.slot, [], 0)
        s.epoch = epoch
        if s.repair is not None or s.boot is not None:
            return
        expected = self._next_seq(s)
        if next_seq > expected:
            # The stream's last batches never arrived.
            self._count("gaps")
            logger.warning(
                "kvindex.cluster: %s: heartbeat: batches %d..%d missed",
                s.name,
                expected,
                next_seq - 1,
            )
            self._recover(s, expected, next_seq)

    def _apply(self, s: _Stream, seq: int, payload: bytes) -> tuple[str, int]:
        t0 = time.perf_counter_ns()
        out = self.index.apply(s.slot, seq, payload)
        self._count("apply_ns", time.perf_counter_ns() - t0)
        return out

    def _hold(self, s: _Stream, seq: int, payload: bytes) -> None:
        s.held.append((seq, payload))
        self._count("held")
        if len(s.held) <= self._max_held:
            return
        if s.boot is not None:
            # Behind a snapshot the oldest are the likeliest to be covered by it.
            s.held.popleft()
            self._count("superseded")
            return
        r = s.repair
        assert r is not None
        logger.warning(
            "kvindex.cluster: %s: %d batches held behind replay from %d; giving up",
            s.name,
            len(s.held),
            r.start,
        )
        self._end_repair(s, answered=False)

    def _offer(self, s: _Stream, seq: int, payload: bytes, *, joining: bool = False) -> None:
        """A live batch: held behind a repair or snapshot in flight, dropped when the
        last snapshot covered it, else applied; a gap starts a repair (``joining``: the
        stream's start, fetched the same way but not a gap)."""
        if s.repair is not None or s.boot is not None:
            self._hold(s, seq, payload)
            return
        if seq < s.floor:
            self._count("superseded")
            return
        outcome, expected = self._apply(s, seq, payload)
        if outcome != "gap":
            self._tally(s, seq, outcome)
            return
        if not joining:
            self._count("gaps")
            logger.warning("kvindex.cluster: %s: gap %d..%d", s.name, expected, seq - 1)
        s.held.append((seq, payload))
        self._count("held")
        self._recover(s, expected, seq)

    def _recover(self, s: _Stream, start: int, stop: int) -> None:
        """Fetches ``start..stop-1``: through replay, else the snapshot, else gives up."""
        if s.replay is not None:
            self._start_repair(s, start, stop)
        elif s.snap is not None:
            self._start_boot(s)
        else:
            self._give_up(s, stop, start)
            self._release(s)

    def _start_repair(self, s: _Stream, start: int, stop: int) -> None:
        assert s.repair is None and s.replay is not None
        if self._request(s, s.replay, (b"", seq_bytes(start))):
            self._count("replay_requests")
            s.outstanding += 1
        s.repair = _Repair(start, stop, time.monotonic() + self._replay_timeout)
        self._repairs += 1

    def _start_boot(self, s: _Stream) -> None:
        """Rebuilds the worker from its snapshot: live batches wait until it arrives."""
        if s.repair is not None:
            s.repair = None
            self._repairs -= 1
        # Answers still due to earlier bootstraps come first (one pipe, in order) and
        # describe an older state than the one this bootstrap needs.
        s.snaps_skip = s.snaps_due
        self._ask_snapshot(s)

    def _ask_snapshot(self, s: _Stream) -> None:
        assert s.snap is not None
        if self._request(s, s.snap, (b"", SNAPSHOT)):
            self._count("snapshot_requests")
            s.snaps_due += 1
        s.boot = time.monotonic() + self._replay_timeout

    def _request(self, s: _Stream, sock: Any, frames: tuple[bytes, ...]) -> bool:
        """Sends a request; False (counted, asked again at the timeout) when the socket's
        queue is full (its publisher has been away for long)."""
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self._count("requests_not_sent")
            return False
        return True

    def _snapshot(self, s: _Stream, frames: list[bytes]) -> None:
        snap = read_snapshot(frames)
        if snap is None:
            self._bad(s, f"snapshot answer of {len(frames)} frames")
            return
        s.snaps_due = max(s.snaps_due - 1, 0)
        if s.boot is None or s.snaps_skip > 0:
            s.snaps_skip = max(s.snaps_skip - 1, 0)
            self._count("stale_snapshots")  # an answer to an earlier request
            return
        hashes = np.frombuffer(snap.hashes, dtype="<u8").astype(np.uint64, copy=False)
        self.index.restore_worker(s.slot, hashes, snap.resume_seq)
        s.boot = None
        s.epoch = snap.epoch
        s.floor = snap.resume_seq
        self._count("snapshots")
        logger.info(
            "kvindex.cluster: %s: rebuilt from its snapshot (%d blocks, resuming at %d)",
            s.name,
            len(hashes),
            snap.resume_seq,
        )
        if not snap.exact:
            logger.warning("kvindex.cluster: %s: its publisher's snapshot is not exact", s.name)
        self._release(s)

    def _release(self, s: _Stream) -> None:
        """Offers the held batches in order (a gap among them starts the next repair)."""
        held, s.held = s.held, deque()
        while held:
            seq, payload = held.popleft()
            if s.repair is not None or s.boot is not None:
                s.held.append((seq, payload))
            else:
                self._offer(s, seq, payload)

    def _give_up(self, s: _Stream, seq: int, expected: int) -> None:
        lost = seq - expected
        if lost <= 0:
            return
        self._count("given_up", lost)
        logger.warning("kvindex.cluster: %s: %d batches lost; degraded", s.name, lost)
        self.index.give_up(s.slot, seq)

    def _replayed(self, s: _Stream, frames: list[bytes]) -> None:
        """One replay answer: a batch of the gap (applied now) or the end marker."""
        if len(frames) == 3 and frames[0] == b"":
            _, seq_frame, payload = frames
        elif len(frames) == 4 and frames[0] == b"":
            _, _, seq_frame, payload = frames
        else:
            self._bad(s, f"replay answer of {len(frames)} frames")
            return
        r = s.repair
        if seq_frame == END_SEQ:
            s.outstanding = max(s.outstanding - 1, 0)
            if r is not None and s.outstanding == 0:
                self._end_repair(s, answered=True)
            return
        seq = read_seq(seq_frame)
        if seq is None:
            self._bad(s, f"replay sequence frame {seq_frame[:16].hex()}")
            return
        if r is None or not r.start <= seq < r.stop:
            return  # outside the gap: an answer to an earlier request, or held already
        before = self._next_seq(s)
        if seq < before:
            return  # applied already
        outcome, expected = self._apply(s, seq, payload)
        if outcome == "gap":
            # Replay's answer starts after what is missing: it no longer has it.
            if s.snap is not None:
                self._start_boot(s)
                return
            self._give_up(s, seq, expected)
            outcome, _ = self._apply(s, seq, payload)
        after = self._next_seq(s)
        if after > before:
            self._count("repaired")
        if outcome != "gap":
            self._tally(s, seq, outcome)
        if after >= r.stop or (s.held and after >= s.held[0][0]):
            self._end_repair(s, answered=True)

    def _end_repair(self, s: _Stream, *, answered: bool) -> None:
        """Ends the repair in flight: what replay did not supply is fetched as a snapshot
        (or given up), then the held batches are offered in order."""
        r = s.repair
        assert r is not None
        s.repair = None
        self._repairs -= 1
        nxt = self._next_seq(s)
        target = s.held[0][0] if s.held else (None if r.stop == _OPEN else r.stop)
        if target is not None and nxt < target:
            if s.snap is not None:
                self._start_boot(s)
                return
            self._give_up(s, target, nxt)
        elif target is None and answered and nxt == 0 and self.index.status(s.slot) == "resyncing":
            # Replay from the start answered with nothing: the stream is empty so far.
            self.index.restore_worker(s.slot, [], 0)
        self._release(s)

    def _tally(self, s: _Stream, seq: int, outcome: str) -> None:
        if outcome in ("applied", "restarted"):
            self._count("applied")
            if outcome == "restarted":
                self._count("restarts")
                logger.warning("kvindex.cluster: %s: publisher restarted; state dropped", s.name)
                s.floor = 0
            elif s.floor and seq >= s.floor:
                s.floor = 0  # past the snapshot: sequence tracking alone again
        elif outcome == "duplicate":
            self._count("duplicates")
        elif outcome == "unknown_worker":
            self._count("unknown_worker")
        elif outcome.startswith("malformed"):
            self._count("malformed")
            logger.warning("kvindex.cluster: %s: batch %d %s", s.name, seq, outcome)
            if s.snap is not None:
                self._start_boot(s)  # the snapshot knows what that batch did
