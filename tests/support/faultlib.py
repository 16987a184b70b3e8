"""Engines, a brute-force oracle and a fault-injecting proxy for the recovery tests, over
real loopback sockets (ipc:// in a temporary directory).

An :class:`Engine` is an ``EventPublisher`` (PUB + replay + snapshot, heartbeats) fed
random store / remove / clear batches, with the oracle of what it holds: a Counter of
block hashes (one per announcement), updated as each batch is published. The
:class:`FaultProxy` sits between every engine's PUB and replay sockets and the listener
(one thread for all), and drops, corrupts, duplicates or injects messages, and delays,
swallows or garbles replay answers, as the test asks.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kvindex
from kvindex.cluster import ClusterIndex, ClusterListener
from kvindex.events import EventEncoder, EventPublisher
from kvindex.events._zmq import zmq

BS = 4
ENC = EventEncoder()
Event = kvindex.BlockStored | kvindex.BlockRemoved | kvindex.AllBlocksCleared


def stored(hashes: list[int]) -> kvindex.BlockStored:
    return kvindex.BlockStored(hashes, None, [1] * (BS * len(hashes)), BS, None, "GPU", None)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Engine:
    """One publisher and its oracle."""

    def __init__(self, base: str, name: str, seed: int, *, buffer_steps: int = 64) -> None:
        self.name = name
        self.base = base
        self.rng = random.Random(seed)
        self.buffer_steps = buffer_steps
        self.held: Counter[int] = Counter()
        self.pub: EventPublisher | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.base}/{self.name}.pub"

    @property
    def replay_endpoint(self) -> str:
        return f"ipc://{self.base}/{self.name}.replay"

    @property
    def snapshot_endpoint(self) -> str:
        return f"ipc://{self.base}/{self.name}.snap"

    def start(self) -> None:
        """A (new) start of the engine: empty cache, a new epoch, sequence from 0."""
        self.held = Counter()
        self.pub = EventPublisher(
            self.endpoint,
            replay_endpoint=self.replay_endpoint,
            snapshot_endpoint=self.snapshot_endpoint,
            heartbeat_interval=0.1,
            buffer_steps=self.buffer_steps,
            block_size=BS,
        )

    def restart(self) -> None:
        assert self.pub is not None
        self.pub.close()
        self.start()

    def step(self) -> None:
        """Publishes one random batch and updates the oracle."""
        assert self.pub is not None
        rng = self.rng
        events: list[Event] = []
        for _ in range(rng.randrange(1, 4)):
            r = rng.random()
            if r < 0.02:
                events.append(kvindex.AllBlocksCleared())
                self.held.clear()
            elif r < 0.6 or not self.held:
                hs = [
                    rng.getrandbits(64) if rng.random() < 0.5 else rng.randrange(64)
                    for _ in range(rng.randrange(1, 6))
                ]
                events.append(stored(hs))
                self.held.update(hs)
            else:
                keys = list(self.held)
                hs = [rng.choice(keys) for _ in range(rng.randrange(1, 4))]
                events.append(kvindex.BlockRemoved(hs, medium="GPU"))
                for h in hs:
                    if self.held[h] > 0:
                        self.held[h] -= 1
                        if self.held[h] == 0:
                            del self.held[h]
        self.pub.publish_events(events, 0.0)

    def oracle(self) -> list[int]:
        return sorted(self.held.elements())

    def close(self) -> None:
        if self.pub is not None:
            self.pub.close()


@dataclass
class Faults:
    """Per-engine fault switches (read by the proxy thread)."""

    drop: float = 0.0  # probability a live batch is dropped
    corrupt: float = 0.0  # probability a live batch's payload is garbled
    duplicate: float = 0.0  # probability a live batch is sent twice
    inject: float = 0.0  # probability a bad message is injected before a batch
    replay: str = "ok"  # "ok", "late" (answers held past the timeout), "never", "garbage"
    block: bool = False  # drop every live message (batches and heartbeats)


@dataclass
class _Link:
    engine: Engine
    sub: Any
    pub: Any
    front: Any  # ROUTER the listener's DEALER talks to
    back: Any  # DEALER to the engine's replay ROUTER
    faults: Faults = field(default_factory=Faults)
    ident: bytes = b""
    late: list[tuple[float, list[bytes]]] = field(default_factory=list)


BAD_MESSAGES: list[list[bytes]] = [
    [b"", b"\xff" * 8, b"\x93\x00\x90\xc0"],  # sequence number 2**64-1
    [b"", b"\x80" + b"\x00" * 7, b"\x93\x00\x90\xc0"],  # 2**63
    [b"", b"\x00" * 7, b"x"],  # 7-byte sequence frame
    [b"only one frame"],
    [b"", b"\x00" * 8, b"x", b"y", b"z"],
    [b"", b"\xffKVHB1", b"short", b"\x00" * 8],  # a heartbeat with a bad epoch
]


class FaultProxy:
    """Forwards every engine's live stream and replay through one thread, injecting faults."""

    def __init__(self, base: str, seed: int) -> None:
        self.ctx = zmq.Context()
        self.base = base
        self.rng = random.Random(seed)
        self.links: dict[str, _Link] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.forwarded = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def endpoints(self, name: str) -> tuple[str, str]:
        return f"ipc://{self.base}/{name}.ppub", f"ipc://{self.base}/{name}.preplay"

    def attach(self, engine: Engine) -> None:
        ctx = self.ctx
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(engine.endpoint)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 0)
        ep, rep = self.endpoints(engine.name)
        pub.bind(ep)
        front = ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 0)
        front.bind(rep)
        back = ctx.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        back.connect(engine.replay_endpoint)
        with self.lock:
            self.links[engine.name] = _Link(engine, sub, pub, front, back)

    def faults(self, name: str) -> Faults:
        return self.links[name].faults

    def set_all(self, **kw: Any) -> None:
        for link in self.links.values():
            link.faults = Faults(**kw)

    def _run(self) -> None:
        poller = zmq.Poller()
        known: set[str] = set()
        while not self.stop.is_set():
            with self.lock:
                links = list(self.links.values())
            for link in links:
                if link.engine.name not in known:
                    known.add(link.engine.name)
                    for sock in (link.sub, link.front, link.back):
                        poller.register(sock, zmq.POLLIN)
            ready = dict(poller.poll(5))
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
                        if link.faults.replay != "never":
                            link.back.send_multipart(frames[1:])
                if link.back in ready:
                    while link.back.poll(0):
                        frames = link.back.recv_multipart()
                        self._answer(link, frames, now)
                due = [f for t, f in link.late if t <= now]
                if due:
                    link.late = [(t, f) for t, f in link.late if t > now]
                    for f in due:
                        link.front.send_multipart([link.ident, *f])

    def _live(self, link: _Link, frames: list[bytes]) -> None:
        f, rng = link.faults, self.rng
        if f.block:
            return
        if len(frames) == 3:
            if rng.random() < f.inject:
                link.pub.send_multipart(rng.choice(BAD_MESSAGES))
            if rng.random() < f.drop:
                return
            if rng.random() < f.corrupt:
                frames = [frames[0], frames[1], bytes(rng.getrandbits(8) for _ in range(12))]
            if rng.random() < f.duplicate:
                link.pub.send_multipart(frames)
        link.pub.send_multipart(frames)
        self.forwarded += 1

    def _answer(self, link: _Link, frames: list[bytes], now: float) -> None:
        mode = link.faults.replay
        if mode == "late":
            link.late.append((now + 1.5, frames))
        elif mode == "garbage":
            garbage = [b"", self.rng.randbytes(self.rng.randrange(0, 12))]
            link.front.send_multipart([link.ident, *garbage])
            if frames[1] == b"\xff" * 8:  # pass the end marker so the repair ends
                link.front.send_multipart([link.ident, *frames])
        elif mode == "ok":
            link.front.send_multipart([link.ident, *frames])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2.0)
        self.ctx.destroy(linger=0)


def add(lst: ClusterListener, proxy: FaultProxy, engine: Engine) -> int:
    """Adds ``engine`` to ``lst`` through ``proxy`` (live and replay) and its own
    snapshot endpoint."""
    ep, rep = proxy.endpoints(engine.name)
    return lst.add_worker(
        engine.name, ep, replay_endpoint=rep, snapshot_endpoint=engine.snapshot_endpoint
    )


def mismatches(index: ClusterIndex, slots: dict[str, int], engines: list[Engine]) -> list[str]:
    """The engines whose worker differs from the oracle (blocks, or not live)."""
    out = []
    for e in engines:
        slot = slots[e.name]
        hashes, _ = index.snapshot_worker(slot)
        if index.status(slot) != "live" or not np.array_equal(
            hashes, np.array(e.oracle(), dtype=np.uint64)
        ):
            out.append(f"{e.name}: {index.status(slot)}, {len(hashes)} vs {len(e.oracle())}")
    return out


def converge(
    lst: ClusterListener, slots: dict[str, int], engines: list[Engine], timeout: float
) -> float:
    """Waits until every worker equals its oracle; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        bad = mismatches(lst.index, slots, engines)
        if not bad:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"not converged after {timeout} s: {bad[:4]}"
        time.sleep(0.01)
