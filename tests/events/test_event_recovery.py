"""The events module's recovery extension and its edge cases over real loopback sockets:
sequence numbers at 2**63, replay answers that come after the timeout, heartbeats,
the snapshot endpoint (its state equal to the stream's, dropped batches included),
replay answers larger than the ROUTER's high-water mark, and the stock stream left as
vLLM 0.33 sends it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex.cluster import ClusterIndex
from kvindex.events import END_SEQ, EventEncoder, EventPublisher, EventSubscriber, seq_bytes
from kvindex.events._batch import HEARTBEAT, SNAPSHOT, read_heartbeat, read_snapshot
from kvindex.events._zmq import zmq

BS = 4
ENC = EventEncoder()


def stored(hashes: list[int]) -> kvindex.BlockStored:
    return kvindex.BlockStored(hashes, None, [1] * (BS * len(hashes)), BS, None, "GPU", None)


def pay(hashes: list[int]) -> bytes:
    return ENC.encode_events([stored(hashes)], 0.0)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Raw:
    """A PUB and a ROUTER whose answers the test writes (``answer(ident, start)``)."""

    def __init__(self, answer: Callable[[Any, bytes, int], None] | None = None) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.requests: list[int] = []
        self.answer = answer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(10):
                continue
            ident, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big", signed=True)
            self.requests.append(first)
            if self.answer is not None:
                self.answer(self.router, ident, first)

    def join(self, sub: EventSubscriber) -> None:
        """Sends batch 0 until the subscriber has it (ZMQ's slow joiner)."""
        wait = time.monotonic() + 10
        got: list[kvindex.events.KVEventBatch] = []
        while not got:
            assert time.monotonic() < wait
            self.pub.send_multipart([b"", seq_bytes(0), pay([0])])
            got = sub.poll(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.ctx.destroy(linger=0)


def test_a_sequence_number_at_2_63_is_a_counted_skip_and_keeps_the_call_s_batches() -> None:
    raw = Raw()
    try:
        with EventSubscriber(raw.endpoint, replay_endpoint=raw.replay_endpoint) as sub:
            raw.join(sub)
            top = 2**63 - 1
            raw.pub.send_multipart([b"", seq_bytes(1), pay([1])])
            raw.pub.send_multipart([b"", b"\x80" + b"\x00" * 7, pay([2])])  # gap from 2**63
            raw.pub.send_multipart([b"", b"\xff" * 8, pay([3])])
            raw.pub.send_multipart([b"", seq_bytes(2), pay([4])])
            raw.pub.send_multipart([b"", seq_bytes(top), b"\xc1"])  # gap to the top
            got: list[kvindex.events.KVEventBatch] = []
            wait_for(lambda: got.extend(sub.poll(0.05)) or sub.stats["received"] >= 6, "all")
            assert [b.seq for b in got] == [1, 2]
            st = sub.stats
            assert st["bad_frames"] == 2 and st["bad_payloads"] == 1 and sub.last_seq == top
            # After 2**63-1 the only valid numbers go back: a restart, never a raise.
            raw.pub.send_multipart([b"", seq_bytes(0), pay([6])])
            wait_for(lambda: got.extend(sub.poll(0.05)) or sub.stats["restarts"] == 1, "restart")
    finally:
        raw.close()


def test_a_late_replay_answer_does_not_end_the_next_repair() -> None:
    """The first answer comes after ``replay_timeout``: its end marker must not end the
    next repair early (which would count the batches replay did supply as lost)."""
    buffer = {s: pay([s]) for s in range(20)}
    calls = []

    def answer(router: Any, ident: bytes, first: int) -> None:
        calls.append(first)
        if len(calls) == 1:
            time.sleep(0.4)  # past the subscriber's timeout
            last = 3
        else:
            last = 8
        for s in range(first, last):
            router.send_multipart([ident, b"", seq_bytes(s), buffer[s]])
        router.send_multipart([ident, b"", END_SEQ, b""])

    raw = Raw(answer)
    try:
        with EventSubscriber(
            raw.endpoint, replay_endpoint=raw.replay_endpoint, replay_timeout=0.2
        ) as sub:
            raw.join(sub)
            raw.pub.send_multipart([b"", seq_bytes(3), buffer[3]])  # gap 1..2: times out
            first = sub.poll(2.0)
            assert [b.seq for b in first if not b.replayed] == [3]
            time.sleep(0.4)  # the late answer (1, 2, end) is queued now
            raw.pub.send_multipart([b"", seq_bytes(8), buffer[8]])  # gap 4..7
            got = sub.poll(2.0)
            assert [b.seq for b in got] == [4, 5, 6, 7, 8]
            st = sub.stats
            assert st["lost"] == 2 and st["replayed"] == 4, st
    finally:
        raw.close()


def test_heartbeats_epochs_and_a_lost_last_batch() -> None:
    with EventPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", heartbeat_interval=0.05
    ) as pub:
        assert pub.replay_endpoint is not None and len(pub.epoch) == 16
        ctx = zmq.Context()
        raw = ctx.socket(zmq.SUB)
        raw.setsockopt(zmq.SUBSCRIBE, b"")
        raw.connect(pub.endpoint)
        try:
            assert raw.poll(5000)
            frames = raw.recv_multipart()
            assert frames[1] == HEARTBEAT and read_heartbeat(frames) == (pub.epoch, 0)
        finally:
            raw.close(linger=0)
            ctx.term()
        with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint) as sub:
            wait_for(lambda: not sub.poll(0.05) and sub.stats["heartbeats"] > 0, "heartbeat")
            assert sub.epoch == pub.epoch
            pub.publish_events([stored([1])], 0.0)
            got: list[kvindex.events.KVEventBatch] = []
            wait_for(lambda: got.extend(sub.poll(0.05)) or bool(got), "batch 0")
        # Batch 1 goes out while nobody listens; then the stream is quiet.
        pub.publish_events([stored([2])], 0.0)
        wait_for(lambda: pub.stats["sent"] == 2, "sent")
        with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint) as late:
            late.last_seq = 0  # as if batch 0 had been seen: batch 1 is the lost tail
            got = []
            wait_for(lambda: got.extend(late.poll(0.05)) or bool(got), "the lost tail")
            assert [(b.seq, b.replayed) for b in got] == [(1, True)]
            assert late.stats["gaps"] == 1 and late.stats["lost"] == 0


def test_the_stock_stream_is_unchanged_without_the_extension() -> None:
    with EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        ctx = zmq.Context()
        raw = ctx.socket(zmq.SUB)
        raw.setsockopt(zmq.SUBSCRIBE, b"")
        raw.connect(pub.endpoint)
        try:
            payload = pay([5])
            deadline = time.monotonic() + 10
            while not raw.poll(20):
                assert time.monotonic() < deadline
                pub.publish_payload(payload)
            frames = raw.recv_multipart()
            assert frames[0] == b"" and len(frames[1]) == 8 and frames[2] == payload
            time.sleep(0.3)  # idle: no heartbeat
            seen = []
            while raw.poll(0):
                seen.append(raw.recv_multipart())
            assert all(len(f) == 3 and f[2] == payload for f in seen)
            assert pub.stats["heartbeats"] == 0
        finally:
            raw.close(linger=0)
            ctx.term()
        with pytest.raises(kvindex.InvalidArgumentError):
            pub.snapshot()


def dealer(ctx: Any, endpoint: str, hwm: int = 1000) -> Any:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, hwm)
    d.connect(endpoint)
    return d


def test_the_snapshot_is_the_stream_s_state_dropped_batches_included() -> None:
    payloads = []
    ref = ClusterIndex(BS)
    ref.add_worker("ref")
    rng = np.random.default_rng(3)
    for seq in range(300):
        hs = [int(x) for x in rng.integers(0, 50, 3)]
        evs: list[Any] = [stored(hs)]
        if seq % 3 == 0:
            evs.append(kvindex.BlockRemoved(hs[:1], medium="GPU"))
        p = ENC.encode_events(evs, 0.0)
        payloads.append(p)
        assert ref.apply(0, seq, p)[0] == "applied"
    with EventPublisher(
        "tcp://127.0.0.1:*", snapshot_endpoint="tcp://127.0.0.1:*", max_queue_size=1
    ) as pub:
        assert pub.snapshot_endpoint is not None
        pub.publish_events([kvindex.AllBlocksCleared()], 0.0)  # block size not known yet
        for p in payloads:
            pub.publish_payload(p)
        assert pub.stats["dropped"] > 0
        hashes, resume, exact = pub.snapshot()
        want, _ = ref.snapshot_worker(0)
        assert resume == 301 and exact
        assert np.frombuffer(hashes, "<u8").tolist() == want.tolist()
        ctx = zmq.Context()
        d = dealer(ctx, pub.snapshot_endpoint)
        try:
            d.send_multipart([b"", SNAPSHOT])
            assert d.poll(5000)
            snap = read_snapshot(d.recv_multipart())
            assert snap is not None and snap.epoch == pub.epoch and snap.resume_seq == 301
            assert snap.exact and snap.hashes == hashes
            d.send_multipart([b"", b"nonsense"])
            wait_for(lambda: pub.stats["bad_replay_requests"] == 1, "bad request counted")
            assert pub.stats["snapshots"] == 1
        finally:
            d.close(linger=0)
            ctx.term()


def test_a_replay_answer_beyond_the_high_water_mark_is_not_dropped() -> None:
    """The consumer reads nothing for a while: the answer (3000 batches, past ZMQ's
    default 1000) waits at the ROUTER instead of being dropped at its high-water mark."""
    with EventPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=5000
    ) as pub:
        assert pub.replay_endpoint is not None
        for i in range(3000):
            pub.publish_payload(pay([i]))
        wait_for(lambda: pub.stats["sent"] == 3000, "sent")
        ctx = zmq.Context()
        d = dealer(ctx, pub.replay_endpoint, hwm=10)
        try:
            d.send_multipart([b"", seq_bytes(0)])
            time.sleep(0.5)
            seqs = []
            while True:
                assert d.poll(5000), f"answer stopped after {len(seqs)} batches"
                _, seq, _ = d.recv_multipart()
                if seq == END_SEQ:
                    break
                seqs.append(int.from_bytes(seq, "big"))
            assert seqs == list(range(3000))
            assert pub.stats["replayed"] == 3000 and pub.stats["replay_abandoned"] == 0
        finally:
            d.close(linger=0)
            ctx.term()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("heartbeat_interval", math.inf),
        ("heartbeat_interval", math.nan),
        ("heartbeat_interval", 0),
        ("heartbeat_interval", "1"),
        ("block_size", 0),
        ("block_size", True),
        ("snapshot_endpoint", 5),
        ("snapshot_endpoint", "nonsense://x"),
    ],
)
def test_bad_extension_options_are_refused(option: str, value: Any) -> None:
    threads = threading.active_count()
    with pytest.raises(kvindex.KvIndexError):
        EventPublisher("tcp://127.0.0.1:*", **{option: value})
    assert threading.active_count() == threads
