"""Bad input to the subscriber, sent over a real loopback PUB socket: every bad message
is counted and skipped with a log line naming what was wrong; good batches around it, and
another subscriber's stream, are unaffected."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import kvindex
from kvindex.events import EventEncoder, EventPublisher, EventSubscriber, KVEventBatch, seq_bytes
from kvindex.events._zmq import zmq

DEADLINE_S = 10.0


def _good(seq_ts: float) -> bytes:
    return EventEncoder().encode_events([kvindex.BlockRemoved([7], medium="GPU")], seq_ts)


def _stored(block_size: int) -> bytes:
    ev = kvindex.BlockStored([1], None, list(range(block_size)), block_size, medium="GPU")
    return EventEncoder().encode_events([ev], 1.0)


def _unknown_type() -> bytes:
    # [ts, [{"type": "BlockMoved", "to": 3}, {"type": "AllBlocksCleared"}], 0]
    return (
        b"\x93\xcb" + np.float64(1.0).byteswap().tobytes() + b"\x92"
        b"\x82\xa4type\xaaBlockMoved\xa2to\x03"
        b"\x81\xa4type\xb0AllBlocksCleared"
        b"\x00"
    )


def _deep_locality() -> bytes:
    # [ts, [{"type": "BlockRemoved", "block_hashes": [], "locality": [[[...]]]}], 0]
    return (
        b"\x93\xcb" + np.float64(1.0).byteswap().tobytes() + b"\x91"
        b"\x83\xa4type\xacBlockRemoved\xacblock_hashes\x90\xa8locality"
        + b"\x91" * 10_000
        + b"\xc0\x00"
    )


def test_bad_messages_are_counted_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
    sub = EventSubscriber(endpoint, block_size=4)
    other_pub = EventPublisher("tcp://127.0.0.1:*")
    other_sub = EventSubscriber(other_pub.endpoint)
    try:
        # Connect: send good batch 0 until it arrives.
        deadline = time.monotonic() + DEADLINE_S
        while not sub.poll(0.02):
            assert time.monotonic() < deadline
            pub.send_multipart([b"", seq_bytes(0), _good(0.0)])
        while sub.poll(0.05):
            pass
        bad_payloads = [
            _good(1.0)[:7],  # truncated
            b"\xc1\xc1",  # not msgpack
            _deep_locality(),  # nested past any sane depth
            b"\x93\xcb" + b"\x00" * 8 + b"\xdd\xff\xff\xff\xff",  # a length the bytes cannot hold
            b"\x92\x01\x02",  # a batch of the wrong shape
            _stored(8),  # wrong block size
            _good(1.0) + b"\x00",  # trailing bytes
        ]
        msgs: list[list[bytes]] = [
            [b"", seq_bytes(1)],  # two frames
            [b"", seq_bytes(1), _good(1.0), b"extra"],  # four frames
            [b"", b"\x01", _good(1.0)],  # a sequence frame that is not 8 bytes
        ]
        msgs += [[b"", seq_bytes(1 + i), p] for i, p in enumerate(bad_payloads)]
        n = 1 + len(bad_payloads)
        msgs += [
            [b"", seq_bytes(n), _unknown_type()],
            [b"", seq_bytes(n + 1), _stored(4)],
            [b"", seq_bytes(n + 2), _good(99.0)],
        ]
        caplog.set_level(logging.WARNING, logger="kvindex.events")
        for m in msgs:
            pub.send_multipart(m)
        got: list[KVEventBatch] = []
        deadline = time.monotonic() + DEADLINE_S
        while (not got or got[-1].ts != 99.0) and time.monotonic() < deadline:
            got += sub.poll(0.05)
        st = sub.stats
        assert st["received"] >= len(msgs)
        assert st["bad_frames"] == 3
        assert st["bad_payloads"] == len(bad_payloads)
        assert st["skipped_events"] == 1
        assert st["gaps"] == 0 and st["restarts"] == 0  # bad payloads still spend their seq
        assert [b.seq for b in got] == [n, n + 1, n + 2]
        assert got[0].events == [kvindex.AllBlocksCleared()] and got[0].skipped_types == (
            "BlockMoved",
        )
        assert isinstance(got[1].events[0], kvindex.BlockStored)
        text = caplog.text
        for needle in [
            "message of 2 frames (expected 3: topic, seq, payload)",
            "message of 4 frames",
            "sequence frame of 1 bytes (expected 8)",
            "truncated",
            "expected an array, found reserved byte (0xc1)",
            "nesting deeper than",
            "cannot fit",
            "batch events: expected an array, found integer",
            "expected block_size 4",
            "trailing bytes",
            "skipped events of unknown types BlockMoved",
        ]:
            assert needle in text, needle
        # Another stream is unaffected.
        deadline = time.monotonic() + DEADLINE_S
        while not other_sub.poll(0.02):
            assert time.monotonic() < deadline
            other_pub.publish_events([kvindex.AllBlocksCleared()])
        assert other_sub.stats["bad_frames"] == other_sub.stats["bad_payloads"] == 0
    finally:
        sub.close()
        other_sub.close()
        other_pub.close()
        ctx.destroy(linger=0)


def test_bad_replay_answers_are_skipped() -> None:
    """A replay endpoint that answers partly garbage: counted and skipped; the batch that
    came back is delivered, the rest of the gap counted as lost."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    router = ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    router.bind("tcp://127.0.0.1:*")
    requests: list[int] = []

    def serve() -> None:  # answers one replay request from its own thread
        if not router.poll(int(DEADLINE_S * 1000)):
            return
        ident, _, start = router.recv_multipart()
        requests.append(int.from_bytes(start, "big"))
        router.send_multipart([ident, b"", b"short", b"x"])  # bad sequence frame
        router.send_multipart([ident, b"", seq_bytes(2), b"\xc1"])  # bad payload
        router.send_multipart([ident, b"", seq_bytes(3), _good(3.0)])
        router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    sub = EventSubscriber(
        pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
        replay_endpoint=router.getsockopt(zmq.LAST_ENDPOINT).decode(),
        replay_timeout=DEADLINE_S,
    )
    server = threading.Thread(target=serve)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not sub.poll(0.02):
            assert time.monotonic() < deadline
            pub.send_multipart([b"", seq_bytes(0), _good(0.0)])
        while sub.poll(0.05):
            pass
        server.start()
        pub.send_multipart([b"", seq_bytes(5), _good(5.0)])  # 1..4 missing
        got: list[KVEventBatch] = []
        deadline = time.monotonic() + DEADLINE_S
        while not any(b.seq == 5 for b in got) and time.monotonic() < deadline:
            got += sub.poll(0.05)
        server.join(DEADLINE_S)
        assert requests == [1]
        assert [b.seq for b in got] == [3, 5] and got[0].replayed
        st = sub.stats
        assert st["missed"] == 4 and st["replayed"] == 1 and st["lost"] == 3
        assert st["bad_frames"] == 1 and st["bad_payloads"] == 1
    finally:
        server.join(DEADLINE_S) if server.is_alive() else None
        sub.close()
        ctx.destroy(linger=0)
