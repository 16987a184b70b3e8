"""Engines, a brute-force oracle and a fault-injecting proxy for the recovery tests, over
real loopback sockets (ipc:// in a temporary directory).

An :class:`Engine` is an ``EventPublisher`` (PUB + replay + snapshot, heartbeats) fed
random store / remove / clear batches, with the oracle of what it holds: a Counter of
block hashes (one per announcement), updated as each batch is published. The
proxy between every engine and the listener is ``kvindex.simulate.faults.FaultProxy``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

import kvindex
from kvindex.cluster import ClusterIndex, ClusterListener
from kvindex.events import EventEncoder, EventPublisher
from kvindex.simulate.faults import FaultProxy

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


def attach(proxy: FaultProxy, engine: Engine) -> None:
    proxy.attach(engine.name, engine.endpoint, engine.replay_endpoint)


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
