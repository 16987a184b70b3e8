"""Fault injection between KV-event publishers and a listener, over real sockets.

:class:`FaultProxy` forwards every engine's live stream (PUB -> SUB) and replay (ROUTER
<-> DEALER) through one thread and, per engine, as its :class:`Faults` say: drops,
garbles or duplicates live batches, injects bad messages (sequence numbers at and above
2**63, wrong frame counts, bad heartbeats), cuts a stream off (batches and heartbeats),
and delays, swallows or garbles replay answers. Snapshot requests go to the engine
directly. Used by ``kvindex simulate --cluster --faults`` and the recovery tests.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any

from kvindex.events._zmq import zmq

__all__ = ["BAD_MESSAGES", "FaultProxy", "Faults", "parse_faults"]

REPLAY_MODES = ("ok", "late", "never", "garbage")


@dataclass
class Faults:
    """One engine's fault switches (read by the proxy thread)."""

    drop: float = 0.0  # probability a live batch is dropped
    corrupt: float = 0.0  # probability a live batch's payload is garbled
    duplicate: float = 0.0  # probability a live batch is sent twice
    inject: float = 0.0  # probability a bad message is injected before a batch
    replay: str = "ok"  # "ok", "late" (answers held past the timeout), "never", "garbage"
    block: bool = False  # drop every live message (batches and heartbeats)
    late_s: float = 1.5  # how long "late" holds a replay answer


def parse_faults(spec: str) -> Faults:
    """``drop=0.05,corrupt=0.01,duplicate=0.02,inject=0.02,replay=late`` (any subset;
    ``default`` for those five). Raises ``ValueError`` for an unknown key or a bad
    value."""
    if spec.strip() == "default":
        return Faults(drop=0.05, corrupt=0.01, duplicate=0.02, inject=0.02, replay="late")
    kinds = {f.name: f.type for f in fields(Faults)}
    out = Faults()
    for part in spec.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in kinds or key == "block":
            raise ValueError(
                f"--faults: expected key=value with keys drop, corrupt, duplicate, inject, "
                f"replay, late_s; got {part!r}"
            )
        if key == "replay":
            if value not in REPLAY_MODES:
                raise ValueError(f"--faults: replay must be one of {', '.join(REPLAY_MODES)}")
            out.replay = value
            continue
        try:
            x = float(value)
        except ValueError:
            raise ValueError(f"--faults: {key} must be a number, got {value!r}") from None
        high = 60.0 if key == "late_s" else 1.0
        if not 0.0 <= x <= high:
            raise ValueError(f"--faults: {key} must be in [0, {high:g}], got {value}")
        setattr(out, key, x)
    return out


BAD_MESSAGES: list[list[bytes]] = [
    [b"", b"\xff" * 8, b"\x93\x00\x90\xc0"],  # sequence number 2**64-1
    [b"", b"\x80" + b"\x00" * 7, b"\x93\x00\x90\xc0"],  # 2**63
    [b"", b"\x00" * 7, b"x"],  # 7-byte sequence frame
    [b"only one frame"],
    [b"", b"\x00" * 8, b"x", b"y", b"z"],
    [b"", b"\xffKVHB1", b"short", b"\x00" * 8],  # a heartbeat with a bad epoch
]
"""Messages no listener may be stopped by (each must be a counted bad frame)."""


@dataclass
class _Link:
    name: str
    sub: Any
    pub: Any
    front: Any  # ROUTER the listener's DEALER talks to
    back: Any  # DEALER to the engine's replay ROUTER
    faults: Faults = field(default_factory=Faults)
    ident: bytes = b""
    late: list[tuple[float, list[bytes]]] = field(default_factory=list)


@dataclass
class ProxyStats:
    forwarded: int = 0
    dropped: int = 0
    corrupted: int = 0
    duplicated: int = 0
    injected: int = 0
    replay_faults: int = 0


class FaultProxy:
    """Forwards engines' live streams and replay through one thread, injecting faults.
    Endpoints are ipc paths under ``base``."""

    def __init__(self, base: str, seed: int = 0) -> None:
        self.ctx = zmq.Context()
        self.base = base
        self.rng = random.Random(seed)
        self.links: dict[str, _Link] = {}
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvindex-fault-proxy", daemon=True)
        self._thread.start()

    def endpoints(self, name: str) -> tuple[str, str]:
        """The live and replay endpoints the listener connects to for engine ``name``."""
        return f"ipc://{self.base}/{name}.ppub", f"ipc://{self.base}/{name}.preplay"

    def attach(self, name: str, endpoint: str, replay_endpoint: str) -> None:
        """Starts forwarding engine ``name``'s stream (``endpoint``) and replay."""
        ctx = self.ctx
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(endpoint)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 0)
        ep, rep = self.endpoints(name)
        pub.bind(ep)
        front = ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 0)
        front.bind(rep)
        back = ctx.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        back.connect(replay_endpoint)
        with self._lock:
            self.links[name] = _Link(name, sub, pub, front, back)

    def faults(self, name: str) -> Faults:
        """Engine ``name``'s switches (change them in place)."""
        return self.links[name].faults

    def set_all(self, faults: Faults | None = None, **kw: Any) -> None:
        """Gives every engine a copy of ``faults`` (or ``Faults(**kw)``)."""
        for link in self.links.values():
            link.faults = Faults(**kw) if faults is None else Faults(**vars(faults))

    def _run(self) -> None:
        poller = zmq.Poller()
        known: set[str] = set()
        while not self._stop.is_set():
            with self._lock:
                links = list(self.links.values())
            for link in links:
                if link.name not in known:
                    known.add(link.name)
                    for sock in (link.sub, link.front, link.back):
                        poller.register(sock, zmq.POLLIN)
            try:
                ready = dict(poller.poll(5))
            except zmq.ZMQError:
                return  # closed
            now = time.monotonic()
            for link in links:
                if link.sub in ready:
                    for _ in range(1000):
                        try:
                            frames = link.sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._live(link, frames)
                if link.front in ready:
                    while link.front.poll(0):
                        frames = link.front.recv_multipart()
                        link.ident = frames[0]
                        if link.faults.replay == "never":
                            self.stats.replay_faults += 1
                        else:
                            link.back.send_multipart(frames[1:])
                if link.back in ready:
                    while link.back.poll(0):
                        self._answer(link, link.back.recv_multipart(), now)
                if link.late:
                    due = [f for t, f in link.late if t <= now]
                    link.late = [(t, f) for t, f in link.late if t > now]
                    for f in due:
                        link.front.send_multipart([link.ident, *f])

    def _live(self, link: _Link, frames: list[bytes]) -> None:
        f, rng, st = link.faults, self.rng, self.stats
        if f.block:
            st.dropped += 1
            return
        if len(frames) == 3:
            if rng.random() < f.inject:
                link.pub.send_multipart(rng.choice(BAD_MESSAGES))
                st.injected += 1
            if rng.random() < f.drop:
                st.dropped += 1
                return
            if rng.random() < f.corrupt:
                frames = [frames[0], frames[1], rng.randbytes(12)]
                st.corrupted += 1
            if rng.random() < f.duplicate:
                link.pub.send_multipart(frames)
                st.duplicated += 1
        link.pub.send_multipart(frames)
        st.forwarded += 1

    def _answer(self, link: _Link, frames: list[bytes], now: float) -> None:
        mode = link.faults.replay
        if mode == "ok":
            link.front.send_multipart([link.ident, *frames])
            return
        self.stats.replay_faults += 1
        if mode == "late":
            link.late.append((now + link.faults.late_s, frames))
        elif mode == "garbage":
            garbage = [b"", self.rng.randbytes(self.rng.randrange(0, 12))]
            link.front.send_multipart([link.ident, *garbage])
            if len(frames) > 1 and frames[1] == b"\xff" * 8:  # the end marker ends the repair
                link.front.send_multipart([link.ident, *frames])

    def close(self) -> None:
        """Stops the thread and closes the sockets."""
        self._stop.set()
        self._thread.join(2.0)
        self.ctx.destroy(linger=0)
