"""Fault injection over real loopback sockets: 16 engines publishing (EventPublisher with
replay, snapshot endpoint and heartbeats) through a proxy that drops, corrupts,
duplicates and injects messages and delays, swallows or garbles replay answers; engine
restarts, a listener restart, and late joins of quiet and busy workers. After each fault
phase the traffic stops and every worker of the index must equal the brute-force oracle
of its engine (blocks with their reference counts, status live) within a bound; the
receive thread never dies and memory stays bounded.

The CI run is short and seeded; ``KVINDEX_FAULT_SOAK_S`` (seconds per traffic phase)
and ``KVINDEX_FAULT_SEED`` make the long one (``make soak``).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest
from faultlib import Engine, FaultProxy, add, attach, converge, mismatches, wait_for

from kvindex.cluster import ClusterIndex, ClusterListener, index_snapshot

ENGINES = 16
PHASE_S = float(os.environ.get("KVINDEX_FAULT_SOAK_S", "1.5"))
SEED = int(os.environ.get("KVINDEX_FAULT_SEED", "20261201"))
RATE = 60.0  # batches per second per engine
# An idle stream's faults are seen at its next heartbeat (0.1 s); a repair that replay
# cannot fill falls back to a snapshot after replay_timeout (0.3 s); the rest is the
# shared machine's scheduling.
CONVERGE_S = 3.0
REPLAY_TIMEOUT = 0.3


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kvr", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def traffic(engines: list[Engine], seconds: float, rng: random.Random) -> int:
    """Each engine publishes at about RATE batches per second (some skip steps, so
    streams are uneven); returns the batches published."""
    n = 0
    end = time.monotonic() + seconds
    period = 1.0 / RATE
    while time.monotonic() < end:
        t0 = time.monotonic()
        for e in engines:
            if rng.random() < 0.8:
                e.step()
                n += 1
        time.sleep(max(period - (time.monotonic() - t0), 0.0))
    return n


def test_sixteen_engines_under_faults_match_the_oracle(base: str) -> None:
    rng = random.Random(SEED)
    proxy = FaultProxy(base, SEED)
    engines = [Engine(base, f"e{i}", SEED + i) for i in range(ENGINES)]
    listeners: list[ClusterListener] = []
    times: dict[str, float] = {}
    try:
        for e in engines:
            attach(proxy, e)
        time.sleep(0.2)  # the proxy's subscriptions reach the engines
        # Before any listener: busy engines run past their replay buffer (64), quiet ones
        # publish a little and stop.
        busy, quiet = engines[::2], engines[1::2]
        for _ in range(100):
            for e in busy:
                e.step()
        for _ in range(5):
            for e in quiet:
                e.step()

        def start_listener(members: list[Engine]) -> tuple[ClusterListener, dict[str, int]]:
            lst = ClusterListener(
                ClusterIndex(4), replay_timeout=REPLAY_TIMEOUT, stale_after=1.0, max_held=5000
            )
            listeners.append(lst)
            return lst, {e.name: add(lst, proxy, e) for e in members}

        # Late joins: 12 engines now, 4 more (2 busy, 2 quiet) during faulty traffic.
        first = busy[:6] + quiet[:6]
        later = busy[6:] + quiet[6:]
        lst, slots = start_listener(first)
        times["late joins (quiet and busy)"] = converge(lst, slots, first, CONVERGE_S)
        rss0 = rss_bytes()

        proxy.set_all(drop=0.05, corrupt=0.01, duplicate=0.02, inject=0.02)
        traffic(engines, PHASE_S / 2, rng)
        slots.update({e.name: add(lst, proxy, e) for e in later})
        traffic(engines, PHASE_S / 2, rng)
        times["dropped, corrupt, duplicate, bad frames"] = converge(lst, slots, engines, CONVERGE_S)

        proxy.set_all(drop=0.1)
        for i, e in enumerate(engines):
            proxy.faults(e.name).replay = ("late", "never", "garbage", "ok")[i % 4]
            proxy.faults(e.name).drop = 0.1
        traffic(engines, PHASE_S, rng)
        times["replay late / never / garbage"] = converge(lst, slots, engines, CONVERGE_S)

        proxy.set_all(drop=0.05)
        for e in engines[:4]:
            e.restart()
        traffic(engines, PHASE_S, rng)
        times["publisher restarts"] = converge(lst, slots, engines, CONVERGE_S)

        # A stream cut off for a while (batches and heartbeats lost) comes back.
        for e in engines[4:6]:
            proxy.faults(e.name).block = True
        traffic(engines, PHASE_S / 2, rng)
        wait_for(lambda: lst.worker_info(slots["e4"])["health"] == "stale", "stale", 5.0)
        for e in engines[4:6]:
            proxy.faults(e.name).block = False
        times["a stream cut off, then back"] = converge(lst, slots, engines, CONVERGE_S)

        assert lst.alive
        st = lst.stats
        assert st["errors"] == 0, st
        assert st["bad_frames"] > 0 and st["snapshots"] > 0 and st["repaired"] > 0, st
        assert st["restarts"] >= 4 and st["malformed"] > 0, st
        m = lst.metrics()
        assert m["healthy"] == ENGINES, m
        print("listener counters under faults:", st)

        # Listener restart: a new index rebuilt from every worker's snapshot.
        lst.close()
        proxy.set_all()
        lst2, slots2 = start_listener(engines)
        traffic(engines, PHASE_S / 2, rng)
        times["listener restart"] = converge(lst2, slots2, engines, CONVERGE_S)

        # A router replica warmed from its peer's index answers as the peer does.
        peer = index_snapshot(lst2.index)
        lst3 = ClusterListener(ClusterIndex(4), replay_timeout=REPLAY_TIMEOUT)
        listeners.append(lst3)
        slots3 = {
            e.name: lst3.add_worker(
                e.name,
                proxy.endpoints(e.name)[0],
                replay_endpoint=proxy.endpoints(e.name)[1],
                resume=peer[(e.name, 0)],
            )
            for e in engines
        }
        assert not mismatches(lst3.index, slots3, engines)  # warm at once, no traffic yet
        traffic(engines, PHASE_S / 2, rng)
        times["replica warmed from a peer"] = converge(lst3, slots3, engines, CONVERGE_S)
        converge(lst2, slots2, engines, CONVERGE_S)
        for e in engines:
            a, _ = lst2.index.snapshot_worker(slots2[e.name])
            b, _ = lst3.index.snapshot_worker(slots3[e.name])
            assert a.tolist() == b.tolist()

        # Memory stays bounded: nothing is held once converged; the index is its blocks.
        for x in (lst2, lst3):
            assert x.alive and x.stats["errors"] == 0
            assert all(not s.held for s in x._streams.values())
            pairs = x.index.num_pairs
            assert x.index.memory_bytes < 64 * max(pairs, 1) + (1 << 20)
        grown = rss_bytes() - rss0
        assert grown < 256 << 20, f"RSS grew by {grown >> 20} MiB"
    finally:
        for x in listeners:
            x.close()
        for e in engines:
            e.close()
        proxy.close()
    print("converged after each fault (s):", {k: round(v, 3) for k, v in times.items()})
    print(f"RSS grew by {grown / 2**20:.1f} MiB")
