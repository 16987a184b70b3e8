"""Publisher and subscriber over real loopback sockets (tcp://127.0.0.1 on free ports, and
ipc:// in a temporary directory): ordered delivery, sequence numbers, replay, drops under a
tiny high-water mark, a full queue, a publisher restart, and a bounded close.

Every wait is bounded by a deadline; no test depends on a fixed port.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kvindex
from kvindex.events import (
    END_SEQ,
    EventEncoder,
    EventPublisher,
    EventSubscriber,
    KVEventBatch,
    decode_batch,
    seq_bytes,
)
from kvindex.events._zmq import zmq

DEADLINE_S = 10.0


@pytest.fixture(params=["tcp", "ipc"])
def endpoints(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "tcp":
        yield "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
    else:
        yield f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"


def warm_up(pub: EventPublisher, sub: EventSubscriber) -> None:
    """Publishes marker batches until the subscriber gets one (ZMQ's slow joiner), then
    drains what is still in flight."""
    deadline = time.monotonic() + DEADLINE_S
    while not sub.poll(0.02):
        assert time.monotonic() < deadline, "subscriber never connected"
        pub.publish_events([kvindex.AllBlocksCleared()])
    wait_sent(pub)
    while sub.poll(0.05):
        pass


def wait_sent(pub: EventPublisher) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while pub.stats["sent"] + pub.stats["send_errors"] < pub.stats["published"]:
        assert time.monotonic() < deadline, pub.stats
        time.sleep(0.005)


def collect(sub: EventSubscriber, n: int) -> list[KVEventBatch]:
    out: list[KVEventBatch] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < n and time.monotonic() < deadline:
        out += sub.poll(0.05)
    return out


def step_cache() -> tuple[kvindex.HashChainCache, Iterator[int]]:
    cache = kvindex.HashChainCache(256, 4, algo="vllm_sha256_cbor", enable_events=True)
    ids = iter(range(1, 1_000_000))
    return cache, ids


def test_ordered_delivery_and_sequence_numbers(endpoints: tuple[str, str]) -> None:
    ep, rep = endpoints
    with (
        EventPublisher(ep, replay_endpoint=rep, topic="kv@10.0.0.1:8000@m") as pub,
        EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, block_size=4) as sub,
    ):
        warm_up(pub, sub)
        base = pub.next_seq
        cache, ids = step_cache()
        sent = []
        for step in range(50):
            rid = next(ids)
            cache.admit(rid, np.arange(step, step + 9, dtype=np.int64))
            cache.free(rid)
            seq = pub.publish(cache, ts=1000.0 + step)
            assert seq == base + step
            sent.append(step)
        got = collect(sub, 50)
        assert [b.seq for b in got] == list(range(base, base + 50))
        assert [b.ts for b in got] == [1000.0 + s for s in sent]
        assert all(b.topic == b"kv@10.0.0.1:8000@m" and not b.replayed for b in got)
        assert all(b.data_parallel_rank == 0 for b in got)
        assert all(isinstance(b.events[0], kvindex.BlockStored) for b in got)
        assert sub.stats["gaps"] == 0 and sub.stats["restarts"] == 0
        assert pub.publish(cache) is None  # nothing buffered: nothing sent


def test_replay_of_a_range_and_the_end_marker(endpoints: tuple[str, str]) -> None:
    ep, rep = endpoints
    with EventPublisher(ep, replay_endpoint=rep, buffer_steps=6) as pub:
        enc = EventEncoder()
        payloads = [
            enc.encode_events([kvindex.BlockRemoved([i], medium="GPU")], float(i))
            for i in range(10)
        ]
        for p in payloads:
            pub.publish_payload(p)
        wait_sent(pub)
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            assert pub.replay_endpoint is not None
            dealer.connect(pub.replay_endpoint)
            dealer.send_multipart([b"", seq_bytes(7)])
            frames = []
            while True:
                assert dealer.poll(int(DEADLINE_S * 1000)), "no replay answer"
                f = dealer.recv_multipart()
                frames.append(f)
                if f[1] == END_SEQ:
                    break
            assert frames[-1] == [b"", END_SEQ, b""]
            assert [f[1] for f in frames[:-1]] == [seq_bytes(s) for s in (7, 8, 9)]
            assert [f[2] for f in frames[:-1]] == payloads[7:]
            # Only the last buffer_steps batches are kept.
            dealer.send_multipart([b"", seq_bytes(0)])
            seqs = []
            while True:
                assert dealer.poll(int(DEADLINE_S * 1000))
                f = dealer.recv_multipart()
                if f[1] == END_SEQ:
                    break
                seqs.append(int.from_bytes(f[1], "big"))
            assert seqs == [4, 5, 6, 7, 8, 9]
            # A malformed request is counted and ignored; the socket keeps serving.
            dealer.send_multipart([b"", b"xy"])
            dealer.send_multipart([b"", seq_bytes(9)])
            assert dealer.poll(int(DEADLINE_S * 1000))
            assert dealer.recv_multipart()[1] == seq_bytes(9)
        finally:
            ctx.destroy(linger=0)
        assert pub.stats["replay_requests"] == 3 and pub.stats["bad_replay_requests"] == 1


def _big_payload() -> bytes:
    n = 16
    ev = kvindex.BlockStored(list(range(n)), None, list(range(40_000, 40_000 + n * 2048)), 2048)
    return EventEncoder().encode_events([ev], 1.0)


@pytest.mark.parametrize("with_replay", [False, True], ids=["no-replay", "replay"])
def test_tiny_hwm_drops_show_as_gaps(endpoints: tuple[str, str], with_replay: bool) -> None:
    ep, rep = endpoints
    n = 150
    with (
        EventPublisher(ep, replay_endpoint=rep if with_replay else None, hwm=1) as pub,
        EventSubscriber(
            pub.endpoint, replay_endpoint=pub.replay_endpoint, rcvhwm=1, replay_timeout=5.0
        ) as sub,
    ):
        warm_up(pub, sub)
        start = sub.last_seq
        assert start is not None and start == pub.next_seq - 1
        payload = _big_payload()
        for _ in range(n):
            pub.publish_payload(payload)
        wait_sent(pub)
        assert pub.stats["dropped"] == 0  # the queue kept up; the socket dropped
        # A gap shows only when a later batch arrives: send small markers until one does.
        marker = EventEncoder().encode_events([kvindex.AllBlocksCleared()], 2.0)
        got: list[KVEventBatch] = []
        deadline = time.monotonic() + DEADLINE_S
        while not got or got[-1].seq <= start + n:
            assert time.monotonic() < deadline, sub.stats
            pub.publish_payload(marker)
            got += sub.poll(0.1)
        st = sub.stats
        assert st["gaps"] > 0 and st["missed"] > 0
        seqs = [b.seq for b in got]
        if with_replay:
            # Every missed batch came back through replay, in order.
            assert seqs == list(range(start + 1, seqs[-1] + 1))
            assert st["replayed"] == st["missed"] and st["lost"] == 0
            assert any(b.replayed for b in got)
        else:
            assert seqs == sorted(set(seqs)) and len(seqs) < seqs[-1] - start
            assert st["lost"] == st["missed"] == seqs[-1] - start - len(seqs)


def test_full_queue_drops_and_counts() -> None:
    payload = EventEncoder().encode_events([kvindex.AllBlocksCleared()], 0.0)
    pub = EventPublisher("tcp://127.0.0.1:*", max_queue_size=1)
    try:
        seqs = [pub.publish_payload(payload) for _ in range(3000)]
        assert seqs == list(range(3000))
        st = pub.stats
        assert st["dropped"] > 0 and st["published"] + st["dropped"] == 3000
    finally:
        pub.close(timeout=2.0)
    assert pub.stats["sent"] == pub.stats["published"]


def free_port_below_ephemeral_range() -> int:
    """A free TCP port below the kernel's ephemeral range. A subscriber reconnecting to a
    vanished publisher on an ephemeral port can be given that very port as its source and
    connect to itself (TCP simultaneous open), which blocks the restarted publisher;
    deployments use fixed low ports (5557) and never meet this."""
    low = 32768
    with contextlib.suppress(OSError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random(os.getpid())
    for _ in range(200):
        port = rng.randrange(max(low - 12_000, 1024), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port found")


def test_publisher_restart_is_detected(endpoints: tuple[str, str]) -> None:
    ep, _ = endpoints
    if ep.startswith("tcp://"):
        ep = f"tcp://127.0.0.1:{free_port_below_ephemeral_range()}"
    pub = EventPublisher(ep, bind=True)
    sub = EventSubscriber(pub.endpoint)
    try:
        warm_up(pub, sub)
        for _ in range(20):
            pub.publish_events([kvindex.AllBlocksCleared()])
        assert len(collect(sub, 20)) == 20
        last = sub.last_seq
        assert last is not None and last >= 20
        endpoint = pub.endpoint
        pub.close()
        pub = EventPublisher(endpoint, bind=True)  # same address, sequence from 0 again
        warm_up(pub, sub)
        assert sub.stats["restarts"] == 1
        assert sub.last_seq is not None and sub.last_seq < last
    finally:
        pub.close()
        sub.close()


def test_close_flushes_within_its_bound() -> None:
    with EventSubscriber("tcp://127.0.0.1:1", block_size=4):
        pass  # a subscriber with nothing to talk to closes at once
    pub = EventPublisher("tcp://127.0.0.1:*")
    payload = EventEncoder().encode_events([kvindex.BlockRemoved([1])], 0.0)
    for _ in range(5000):
        pub.publish_payload(payload)
    t0 = time.monotonic()
    pub.close(timeout=3.0)
    assert time.monotonic() - t0 < 4.5
    assert pub.stats["sent"] == 5000 and pub.stats["queued"] == 0
    pub.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish_payload(payload)


def test_data_parallel_rank_in_batches_and_ports() -> None:
    probe = EventPublisher("tcp://127.0.0.1:*")
    port = int(probe.endpoint.rsplit(":", 1)[1])
    probe.close()
    pub = EventPublisher(f"tcp://127.0.0.1:{port - 2}", data_parallel_rank=2)
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"
        payload = pub.encoder.encode_events([], 1.0)
        assert decode_batch(payload).data_parallel_rank == 2
    finally:
        pub.close()
