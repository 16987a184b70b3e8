"""ClusterListener recovery over real loopback sockets: no message stops the receive
thread, bad options are refused at construction, quiet late joiners are bootstrapped
(replay from the start, or the snapshot), per-worker health, heartbeats, and a replica
warmed from a peer's index."""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from faultlib import BS, Engine, FaultProxy, add, attach, converge, stored, wait_for

import kvindex
from kvindex.cluster import ClusterIndex, ClusterListener, index_snapshot
from kvindex.events import EventEncoder, EventPublisher, seq_bytes
from kvindex.events._zmq import zmq

ENC = EventEncoder()


@pytest.fixture
def base() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kvl", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("replay_timeout", math.inf),
        ("replay_timeout", math.nan),
        ("replay_timeout", "1"),
        ("replay_timeout", 0),
        ("replay_timeout", -1.0),
        ("replay_timeout", True),
        ("replay_timeout", 2**64),
        ("poll_interval", math.inf),
        ("poll_interval", math.nan),
        ("poll_interval", "0.01"),
        ("poll_interval", 0.0),
        ("poll_interval", None),
        ("rcvhwm", -1),
        ("rcvhwm", 2**31),
        ("rcvhwm", 2**63),
        ("rcvhwm", "10"),
        ("rcvhwm", 1.5),
        ("rcvhwm", True),
        ("stale_after", math.nan),
        ("stale_after", "x"),
        ("stale_after", 0),
        ("max_held", 0),
        ("max_held", 2**63),
    ],
)
def test_bad_options_are_refused_before_any_thread(option: str, value: Any) -> None:
    threads = threading.active_count()
    with pytest.raises(kvindex.KvIndexError):
        ClusterListener(ClusterIndex(BS), **{option: value})
    assert threading.active_count() == threads


def test_no_frame_stops_the_receive_thread() -> None:
    """A live frame with a sequence number >= 2**63 (and every other bad shape) is a
    counted bad frame; the other stream keeps flowing and the thread stays up."""
    ctx = zmq.Context()
    pubs = []
    try:
        with ClusterListener(ClusterIndex(BS), replay_timeout=0.5) as lst:
            slots = []
            for name in ("bad", "good"):
                p = ctx.socket(zmq.PUB)
                p.setsockopt(zmq.LINGER, 0)
                p.bind("tcp://127.0.0.1:*")
                pubs.append(p)
                slots.append(lst.add_worker(name, p.getsockopt_string(zmq.LAST_ENDPOINT)))
            bad, good = pubs
            payload = ENC.encode_events([stored([7])], 0.0)
            junk = [
                [b"", b"\xff" * 8, payload],
                [b"", b"\x80" + b"\x00" * 7, payload],
                [b"", (2**63 - 1).to_bytes(8, "big"), b"\xc1"],  # malformed, max seq
                [b"", b"\xff" * 8],
                [b"", b"\xffKVHB1", b"\x00" * 16, b"\xff" * 8],  # heartbeat, seq 2**64-1
                [b"", b"\x00" * 9, payload],
            ]
            deadline = time.monotonic() + 10
            while lst.index.worker_info(slots[1])["next_seq"] < 1:
                assert time.monotonic() < deadline
                for frames in junk:
                    bad.send_multipart(frames)
                good.send_multipart([b"", seq_bytes(0), payload])
                time.sleep(0.02)
            for frames in junk:
                bad.send_multipart(frames)
            good.send_multipart([b"", seq_bytes(1), ENC.encode_events([stored([8])], 0.0)])
            wait_for(lambda: lst.index.worker_info(slots[1])["next_seq"] == 2, "the good stream")
            assert lst.alive
            assert lst.index.worker_blocks(slots[1]).tolist() == [7, 8]
            st = lst.stats
            assert st["bad_frames"] >= 5 and st["errors"] == 0
            assert lst.worker_info(slots[0])["bad_frames"] >= 5
            # The thread still serves commands.
            extra = lst.add_worker("later", "tcp://127.0.0.1:9")
            lst.remove_worker(extra)
    finally:
        for p in pubs:
            p.close(linger=0)
        ctx.term()


def test_a_quiet_late_joiner_is_bootstrapped_through_replay() -> None:
    """No snapshot endpoint: the stream's start is fetched through replay as soon as the
    worker is added, so a worker that published and went quiet is known (live) at once;
    one that published nothing is live and empty; a batch lost to the slow joiner right
    after add_worker is fetched by the re-asks while the stream has sent nothing."""
    events = [[stored([1, 2])], [stored([3])], [kvindex.BlockRemoved([1], medium="GPU")]]
    with (
        EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as busy,
        EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as empty,
    ):
        for ev in events:
            busy.publish_events(ev, 0.0)
        wait_for(lambda: busy.stats["sent"] == 3, "sends")
        with ClusterListener(ClusterIndex(BS), replay_timeout=0.2, stale_after=5.0) as lst:
            assert busy.replay_endpoint and empty.replay_endpoint
            a = lst.add_worker("busy", busy.endpoint, replay_endpoint=busy.replay_endpoint)
            b = lst.add_worker("empty", empty.endpoint, replay_endpoint=empty.replay_endpoint)
            wait_for(lambda: lst.worker_info(a)["health"] == "healthy", "busy bootstrapped")
            assert lst.index.worker_info(a)["next_seq"] == 3
            assert lst.index.worker_blocks(a).tolist() == [2, 3]
            wait_for(lambda: lst.worker_info(b)["health"] == "healthy", "empty worker known")
            assert lst.worker_info(b)["health"] == "healthy"
            # Published right after add: maybe lost to the slow joiner, then re-asked.
            empty.publish_events([stored([9])], 0.0)
            wait_for(lambda: lst.index.worker_blocks(b).tolist() == [9], "the re-ask")
            assert lst.stats["gaps"] == 0 and lst.stats["given_up"] == 0


def test_snapshot_bootstrap_beyond_replay_and_health(base: str) -> None:
    """A busy engine whose replay buffer lost its start: rebuilt from its snapshot
    (resyncing until then), with per-worker health and metrics."""
    e = Engine(base, "e", 5, buffer_steps=8)
    proxy = FaultProxy(base, 5)
    try:
        attach(proxy, e)
        for _ in range(200):
            e.step()
        with ClusterListener(ClusterIndex(BS), replay_timeout=0.3, stale_after=1.0) as lst:
            slot = add(lst, proxy, e)
            converge(lst, {"e": slot}, [e], 5.0)
            info = lst.worker_info(slot)
            assert info["health"] == "healthy" and info["epoch"] == e.pub.epoch.hex()  # type: ignore[union-attr]
            assert lst.stats["snapshots"] >= 1
            m = lst.metrics()
            assert m["workers"] == m["healthy"] == 1 and m["bootstrapping"] == 0
            # Silence (heartbeats blocked) makes it stale; they come back, it is healthy.
            proxy.faults("e").block = True
            wait_for(lambda: lst.worker_info(slot)["health"] == "stale", "stale", 5.0)
            assert lst.metrics()["stale"] == 1
            proxy.faults("e").block = False
            wait_for(lambda: lst.worker_info(slot)["health"] == "healthy", "healthy", 5.0)
            # A lost last batch on a quiet stream is found by the next heartbeat.
            proxy.faults("e").drop = 1.0
            e.step()
            time.sleep(0.05)
            proxy.faults("e").drop = 0.0
            converge(lst, {"e": slot}, [e], 2.0)
    finally:
        e.close()
        proxy.close()


def test_until_the_snapshot_comes_the_worker_is_resyncing(base: str) -> None:
    """A worker whose snapshot endpoint does not answer stays resyncing (asked again),
    never live and empty."""
    e = Engine(base, "e", 6, buffer_steps=8)
    try:
        for _ in range(50):
            e.step()
        with ClusterListener(ClusterIndex(BS), replay_timeout=0.1) as lst:
            slot = lst.add_worker(
                "e",
                e.endpoint,
                replay_endpoint=e.replay_endpoint,
                snapshot_endpoint=f"ipc://{base}/nobody.snap",
            )
            time.sleep(0.5)
            assert lst.worker_info(slot)["health"] == "resyncing"
            assert lst.stats["snapshot_requests"] >= 3
            assert lst.metrics()["bootstrapping"] == 1
    finally:
        e.close()


def test_a_replica_warmed_from_a_peer_answers_the_same(base: str) -> None:
    engines = [Engine(base, f"e{i}", 10 + i) for i in range(3)]
    proxy = FaultProxy(base, 3)
    try:
        for x in engines:
            attach(proxy, x)
        time.sleep(0.1)
        with ClusterListener(ClusterIndex(BS), replay_timeout=0.3) as one:
            slots = {x.name: add(one, proxy, x) for x in engines}
            for _ in range(30):
                for x in engines:
                    x.step()
            converge(one, slots, engines, 5.0)
            peer = index_snapshot(one.index)
            with ClusterListener(ClusterIndex(BS), replay_timeout=0.3) as two:
                slots2 = {}
                for x in engines:
                    ep, rep = proxy.endpoints(x.name)
                    slots2[x.name] = two.add_worker(
                        x.name, ep, replay_endpoint=rep, resume=peer[(x.name, 0)]
                    )
                converge(two, slots2, engines, 0.5)
                for _ in range(30):
                    for x in engines:
                        x.step()
                converge(one, slots, engines, 5.0)
                converge(two, slots2, engines, 5.0)
                prompt = np.arange(4 * BS, dtype=np.int64)
                assert one.index.overlaps(prompt).tolist() == two.index.overlaps(prompt).tolist()
                assert one.index.statuses() == two.index.statuses()
    finally:
        for x in engines:
            x.close()
        proxy.close()


def test_bad_resume_is_refused_with_nothing_registered() -> None:
    with ClusterListener(ClusterIndex(BS)) as lst:
        for bad in ([1, 2], ([1], -1), ([1], 2**63), (["x"], 0)):
            with pytest.raises((kvindex.KvIndexError, ValueError, TypeError)):
                lst.add_worker("a", "tcp://127.0.0.1:9", resume=bad)  # type: ignore[arg-type]
        assert lst.index.slots == 0


def test_the_router_can_treat_a_bootstrapping_worker_as_unknown_not_empty() -> None:
    """With ``skip_unknown``, while some worker is known, ``kv`` and ``least_loaded``
    never pick one of which nothing is known yet (resyncing, no block); when none is
    known, every worker is."""
    from kvindex.cluster import Router

    ix = ClusterIndex(BS)
    known, rebuilding = ix.add_worker("known"), ix.add_worker("rebuilding")
    prompt = np.arange(8 * BS, dtype=np.int64)
    for policy in ("kv", "least_loaded"):
        r = Router(ix, policy, skip_unknown=True)
        assert {r.route(prompt).worker for _ in range(4)} == {known, rebuilding}  # type: ignore[union-attr]
    ix.apply(known, 0, ENC.encode_events([stored([1])], 0.0))
    assert ix.statuses() == ["live", "resyncing"]
    for policy in ("kv", "least_loaded"):
        r = Router(ix, policy, skip_unknown=True)
        for _ in range(6):
            d = r.route(prompt)
            assert d is not None and d.worker == known and not d.flagged
    default = Router(ix, "least_loaded")  # by default it is eligible, its decisions flagged
    ds = [default.route(prompt) for _ in range(4)]
    assert {(d.worker, d.flagged) for d in ds if d is not None} == {
        (known, False),
        (rebuilding, True),
    }
    ix.restore_worker(rebuilding, [], 0)
    r = Router(ix, "least_loaded", skip_unknown=True)
    assert {r.route(prompt).worker for _ in range(4)} == {known, rebuilding}  # type: ignore[union-attr]
