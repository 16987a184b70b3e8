"""ClusterListener over real loopback ZMQ sockets (no mocks): three engines end to end,
and injected faults — dropped batches repaired through replay to the identical state, a
publisher restart, a worker leaving and rejoining, duplicates, bad frames and malformed
payloads (counted, never raised, other workers untouched), an unrepairable gap.

Every wait is bounded by a deadline; ports are picked by the OS.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import kvindex
from kvindex.cluster import ClusterIndex, ClusterListener
from kvindex.events import END_SEQ, EventEncoder, EventPublisher, seq_bytes
from kvindex.events._zmq import zmq

BS = 4
DEADLINE_S = 10.0


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class RawPublisher:
    """A PUB + ROUTER pair speaking vLLM's protocol, whose sends the test controls: a
    batch can be buffered for replay without being sent, or kept out of the buffer;
    replay answers wait while ``gate`` is clear."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = str(self.pub.getsockopt_string(zmq.LAST_ENDPOINT))
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.replay_endpoint = str(self.router.getsockopt_string(zmq.LAST_ENDPOINT))
        self.buffer: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def send(self, seq: int, payload: bytes, *, drop: bool = False, buffer: bool = True) -> None:
        with self.lock:
            if buffer:
                self.buffer[seq] = payload
            if not drop:
                self.pub.send_multipart([b"", seq_bytes(seq), payload])

    def send_frames(self, frames: list[bytes]) -> None:
        with self.lock:
            self.pub.send_multipart(frames)

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(10):
                continue
            ident, _, start = self.router.recv_multipart()
            while not (self.gate.wait(0.01) or self.stop.is_set()):
                pass
            first = int.from_bytes(start, "big", signed=True)
            with self.lock:
                for seq in sorted(self.buffer):
                    if seq >= first:
                        self.router.send_multipart([ident, b"", seq_bytes(seq), self.buffer[seq]])
                self.router.send_multipart([ident, b"", END_SEQ, b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2.0)
        self.ctx.destroy(linger=0)


@pytest.fixture
def listener() -> Iterator[ClusterListener]:
    with ClusterListener(ClusterIndex(BS), replay_timeout=2.0) as lst:
        yield lst


def stored(hashes: list[int]) -> kvindex.BlockStored:
    return kvindex.BlockStored(hashes, None, [1] * (BS * len(hashes)), BS, None, "GPU", None)


def removed(hashes: list[int]) -> kvindex.BlockRemoved:
    return kvindex.BlockRemoved(hashes, medium="GPU")


ENC = EventEncoder()


def pay(*events: kvindex.BlockStored | kvindex.BlockRemoved | kvindex.AllBlocksCleared) -> bytes:
    return ENC.encode_events(list(events), 0.0)


def random_payloads(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        evs: list[kvindex.BlockStored | kvindex.BlockRemoved | kvindex.AllBlocksCleared] = []
        for _ in range(rng.randrange(1, 4)):
            hs = [rng.randrange(40) for _ in range(rng.randrange(1, 5))]
            evs.append(stored(hs) if rng.random() < 0.65 else removed(hs))
        out.append(pay(*evs))
    return out


def reference(payloads: list[bytes]) -> list[int]:
    ix = ClusterIndex(BS)
    w = ix.add_worker("ref")
    for seq, p in enumerate(payloads):
        assert ix.apply(w, seq, p)[0] == "applied"
    blocks: list[int] = ix.worker_blocks(w).tolist()
    return blocks


def connect(lst: ClusterListener, raw: RawPublisher, name: str, first: bytes) -> int:
    """Adds the worker and re-sends batch 0 until it is applied (ZMQ's slow joiner;
    the repeats are duplicates and ignored)."""
    slot = lst.add_worker(name, raw.endpoint, replay_endpoint=raw.replay_endpoint)
    deadline = time.monotonic() + DEADLINE_S
    while lst.index.worker_info(slot)["next_seq"] == 0:
        assert time.monotonic() < deadline, "never connected"
        raw.send(0, first)
        time.sleep(0.01)
    return slot


def test_dropped_batches_are_replayed_to_the_identical_state(listener: ClusterListener) -> None:
    raw, other = RawPublisher(), RawPublisher()
    try:
        payloads = random_payloads(1, 60)
        slot = connect(listener, raw, "a", payloads[0])
        o = connect(listener, other, "b", pay(stored([1000, 1001])))
        for seq in range(1, 60):
            raw.send(seq, payloads[seq], drop=seq % 7 in (2, 3) and seq < 55)
        wait_for(lambda: listener.index.worker_info(slot)["next_seq"] == 60, "all batches")
        assert listener.index.worker_blocks(slot).tolist() == reference(payloads)
        assert listener.index.status(slot) == "live"
        assert listener.stats["gaps"] >= 8 and listener.stats["repaired"] >= 16
        assert listener.stats["given_up"] == 0
        assert listener.index.worker_blocks(o).tolist() == [1000, 1001]
        listener.index.check_invariants()
    finally:
        raw.close()
        other.close()


def test_restart_leave_rejoin_and_duplicates(listener: ClusterListener) -> None:
    raw = RawPublisher()
    try:
        payloads = random_payloads(2, 20)
        slot = connect(listener, raw, "a", payloads[0])
        for seq in range(1, 20):
            raw.send(seq, payloads[seq])
            raw.send(seq, payloads[seq], buffer=False)  # every batch twice
        wait_for(lambda: listener.index.worker_info(slot)["next_seq"] == 20, "all batches")
        wait_for(lambda: listener.stats["duplicates"] >= 19, "duplicates")
        assert listener.index.worker_blocks(slot).tolist() == reference(payloads)
        # Leave and rejoin: the new subscription sees batch 20 first, replays 0..19.
        listener.remove_worker(slot)
        assert listener.index.status(slot) == ""
        slot = listener.add_worker("a", raw.endpoint, replay_endpoint=raw.replay_endpoint)
        payloads.append(pay(stored([77])))
        deadline = time.monotonic() + DEADLINE_S
        while listener.index.worker_info(slot)["next_seq"] < 21:
            assert time.monotonic() < deadline
            raw.send(20, payloads[20])
            time.sleep(0.01)
        assert listener.index.worker_blocks(slot).tolist() == reference(payloads)
        # Restart: the publisher starts again from 0 with a new buffer.
        with raw.lock:
            raw.buffer.clear()
        fresh = random_payloads(3, 5)
        for seq, p in enumerate(fresh):
            raw.send(seq, p)
        wait_for(lambda: listener.index.worker_info(slot)["next_seq"] == 5, "restarted stream")
        assert listener.index.worker_blocks(slot).tolist() == reference(fresh)
        assert listener.stats["restarts"] == 1
        assert listener.index.status(slot) == "live"
    finally:
        raw.close()


def test_bad_input_is_counted_and_other_workers_untouched(listener: ClusterListener) -> None:
    raw, other = RawPublisher(), RawPublisher()
    try:
        a = connect(listener, raw, "a", pay(stored([1, 2])))
        b = connect(listener, other, "b", pay(stored([5])))
        raw.send_frames([b"", b"\x00\x01"])  # two frames
        raw.send_frames([b"", b"\x00" * 7, pay(stored([3]))])  # short sequence frame
        raw.send(1, b"\x93\xcb\x00not msgpack")
        raw.send(2, pay(stored([9]))[:-1] + b"\xc1")
        raw.send(3, pay(stored([4])))
        wait_for(lambda: listener.index.worker_info(a)["next_seq"] == 4, "bad batches")
        wait_for(lambda: listener.stats["bad_frames"] >= 2, "bad frames")
        assert listener.stats["malformed"] == 2
        assert listener.index.status(a) == "degraded"
        assert listener.index.worker_blocks(a).tolist() == [1, 2, 4]
        assert listener.index.worker_blocks(b).tolist() == [5]
        assert listener.index.status(b) == "live"
        # An unrepairable gap (the publisher's buffer no longer has it): degraded.
        other.send(5, pay(stored([6])))
        wait_for(lambda: listener.index.worker_info(b)["next_seq"] == 6, "gap given up")
        assert listener.index.status(b) == "degraded"
        assert listener.index.worker_info(b)["lost"] == 4
        assert listener.stats["given_up"] == 4
        listener.index.check_invariants()
    finally:
        raw.close()
        other.close()


def cache_hashes(cache: kvindex.HashChainCache) -> list[int]:
    out = set()
    for blk in range(1, cache.num_blocks):
        h = cache.block_hash(blk)
        if h is not None:
            out.add(int.from_bytes(h[-8:], "big"))
    return sorted(out)


def test_three_engines_end_to_end(listener: ClusterListener) -> None:
    rng = random.Random(11)
    caches = [kvindex.HashChainCache(32, BS, enable_events=True) for _ in range(3)]
    pubs = [
        EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=f"kv@e{i}")
        for i in range(3)
    ]
    try:
        slots = []
        for i, pub in enumerate(pubs):
            assert pub.replay_endpoint is not None
            slots.append(
                listener.add_worker(
                    f"e{i}", pub.endpoint, replay_endpoint=pub.replay_endpoint, topic=f"kv@e{i}"
                )
            )
        for i, pub in enumerate(pubs):  # slow joiner: publish until something lands
            deadline = time.monotonic() + DEADLINE_S
            while listener.index.worker_info(slots[i])["next_seq"] == 0:
                assert time.monotonic() < deadline
                pub.publish_events([kvindex.AllBlocksCleared()])
                time.sleep(0.01)
        router_ix = listener.index
        prefixes = [[rng.randrange(50) for _ in range(16)] for _ in range(3)]
        running: list[list[int]] = [[], [], []]
        rid = 0
        for step in range(120):
            toks = np.array(
                rng.choice(prefixes)[: rng.randrange(4, 17)]
                + [rng.randrange(50) for _ in range(5)],
                dtype=np.int64,
            )
            ov = router_ix.overlaps(toks)  # queried while the listener thread applies
            assert ov.shape == (3,)
            w = rng.randrange(3)
            rid += 1
            if caches[w].admit(rid, toks) is not None:
                running[w].append(rid)
            for i in range(3):
                if running[i] and rng.random() < 0.4:
                    caches[i].free(running[i].pop(0))
                pubs[i].publish(caches[i], ts=float(step))
        for i, pub in enumerate(pubs):
            slot, want = slots[i], pub.next_seq

            def caught_up(slot: int = slot, want: int = want) -> bool:
                return bool(listener.index.worker_info(slot)["next_seq"] == want)

            wait_for(caught_up, f"engine {i} caught up")
            assert listener.index.worker_blocks(slots[i]).tolist() == cache_hashes(caches[i])
            assert listener.index.status(slots[i]) == "live"
        listener.index.check_invariants()
        assert listener.stats["malformed"] == 0 and listener.stats["given_up"] == 0
    finally:
        for pub in pubs:
            pub.close()


def publish_until_joined(lst: ClusterListener, slot: int, pub: EventPublisher) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while lst.index.worker_info(slot)["next_seq"] == 0:
        assert time.monotonic() < deadline, "never connected"
        pub.publish_events([kvindex.AllBlocksCleared()])
        time.sleep(0.01)


@pytest.mark.parametrize("replay_answers", [True, False])
def test_a_repair_does_not_hold_up_other_streams(replay_answers: bool) -> None:
    """A dropped batch on stream a: its repair waits on a replay that answers late (or
    never), while stream b (a real EventPublisher fed by a real cache) keeps flowing and
    its batches are applied during the repair. Then a's held batches are applied in
    order: the identical state when replay answers, degraded (one batch lost) when not."""
    timeout = 8.0 if replay_answers else 0.5
    raw = RawPublisher()
    pub = EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    cache = kvindex.HashChainCache(64, BS, enable_events=True)
    try:
        with ClusterListener(ClusterIndex(BS), replay_timeout=timeout) as lst:
            payloads = random_payloads(5, 6)
            a = connect(lst, raw, "a", payloads[0])
            assert pub.replay_endpoint is not None
            b = lst.add_worker("b", pub.endpoint, replay_endpoint=pub.replay_endpoint)
            publish_until_joined(lst, b, pub)
            wait_for(lambda: lst.repairing == 0, "b's start (ZMQ's slow joiner)")
            before = lst.stats
            raw.gate.clear()
            t0 = time.monotonic()
            raw.send(1, payloads[1], drop=True)
            for seq in range(2, 6):
                raw.send(seq, payloads[seq])
            wait_for(lambda: lst.repairing == 1, "a's repair to start")
            rng = random.Random(3)
            for rid in range(1, 25):
                toks = np.array([rng.randrange(30) for _ in range(3 * BS)], dtype=np.int64)
                if cache.admit(rid, toks) is not None and rid % 3:
                    cache.free(rid)
                pub.publish(cache, ts=float(rid))
            want = pub.next_seq
            wait_for(lambda: lst.index.worker_info(b)["next_seq"] == want, "b during a's repair")
            if not replay_answers:
                assert time.monotonic() - t0 < timeout, "b waited for a's repair"
            assert lst.repairing == 1 and lst.index.worker_info(a)["next_seq"] == 1
            assert lst.index.worker_blocks(b).tolist() == cache_hashes(cache)
            assert lst.stats["held"] - before["held"] >= 4
            if replay_answers:
                raw.gate.set()
            wait_for(lambda: lst.index.worker_info(a)["next_seq"] == 6, "a's held batches")
            assert lst.repairing == 0
            if replay_answers:
                assert lst.index.worker_blocks(a).tolist() == reference(payloads)
                assert lst.index.status(a) == "live"
                assert lst.stats["repaired"] - before["repaired"] == 1
                assert lst.stats["given_up"] == 0
            else:
                assert lst.index.status(a) == "degraded"
                assert lst.stats["given_up"] - before["given_up"] == 1
                assert lst.index.worker_info(a)["lost"] == 1
            assert lst.index.status(b) == "live"
            lst.index.check_invariants()
    finally:
        raw.gate.set()
        raw.close()
        pub.close()


def test_a_repair_holds_at_most_max_held_batches() -> None:
    """A replay that never answers, with a long timeout: once more than ``max_held``
    batches wait behind the repair it ends, the missing batch is given up (degraded) and
    the held ones are applied in order, long before the timeout; memory stays bounded."""
    raw = RawPublisher()
    try:
        with ClusterListener(ClusterIndex(BS), replay_timeout=60.0, max_held=3) as lst:
            payloads = random_payloads(7, 6)
            a = connect(lst, raw, "a", payloads[0])
            raw.gate.clear()  # the replay socket stays silent
            t0 = time.monotonic()
            raw.send(1, payloads[1], drop=True)
            for seq in range(2, 5):  # the gap's end and two more: three held
                raw.send(seq, payloads[seq])
            wait_for(lambda: lst.stats["held"] >= 3, "three held batches")
            assert lst.repairing == 1 and lst.index.worker_info(a)["next_seq"] == 1
            raw.send(5, payloads[5])  # the fourth: over max_held
            wait_for(lambda: lst.index.worker_info(a)["next_seq"] == 6, "the held batches")
            assert time.monotonic() - t0 < 30.0
            assert lst.repairing == 0
            assert lst.index.status(a) == "degraded"
            assert lst.index.worker_info(a)["lost"] == 1
            assert lst.stats["given_up"] == 1
            lst.index.check_invariants()
        with pytest.raises(kvindex.InvalidArgumentError, match="max_held"):
            ClusterListener(ClusterIndex(BS), max_held=0)
        with pytest.raises(kvindex.DTypeError, match="max_held"):
            ClusterListener(ClusterIndex(BS), max_held=True)
    finally:
        raw.gate.set()
        raw.close()


@pytest.mark.parametrize(
    "bad",
    ["nonsense", "tcp://", "tcp://127.0.0.1", "bogus://x:1", "tcp://127.0.0.1:notaport"],
)
def test_malformed_endpoints_are_invalid_argument_errors(bad: str) -> None:
    """EventPublisher, EventSubscriber and ClusterListener.add_worker: a malformed ZMQ
    endpoint raises InvalidArgumentError (a ValueError) naming it; nothing is left
    behind (the listener registers no worker and keeps working)."""
    from kvindex.events import EventSubscriber

    with pytest.raises(kvindex.InvalidArgumentError, match="endpoint") as err:
        EventPublisher(bad)
    assert isinstance(err.value, ValueError) and repr(bad) in str(err.value)
    with pytest.raises(kvindex.InvalidArgumentError, match="replay_endpoint"):
        EventPublisher("tcp://127.0.0.1:*", replay_endpoint=bad)
    with pytest.raises(kvindex.InvalidArgumentError, match="endpoint"):
        EventSubscriber(bad)
    with pytest.raises(kvindex.InvalidArgumentError, match="replay_endpoint"):
        EventSubscriber("tcp://127.0.0.1:5", replay_endpoint=bad)
    raw = RawPublisher()
    try:
        with ClusterListener(ClusterIndex(BS)) as lst:
            with pytest.raises(kvindex.InvalidArgumentError, match="endpoint"):
                lst.add_worker("a", bad)
            with pytest.raises(kvindex.InvalidArgumentError, match="replay_endpoint"):
                lst.add_worker("a", raw.endpoint, replay_endpoint=bad)
            assert lst.index.slots == 0 and lst.index.membership == 0
            slot = connect(lst, raw, "a", pay(stored([1])))
            assert slot == 0 and lst.index.worker_blocks(slot).tolist() == [1]
    finally:
        raw.close()


def test_joining_mid_stream_is_not_a_gap(caplog: pytest.LogCaptureFixture) -> None:
    """A subscriber that joins after batches went out (mid-stream, or ZMQ's slow joiner
    dropping the first batches) fetches the start through replay, asked for as soon as
    it is added (a late join when a live batch came first): the identical state, no gap
    warning."""
    raw = RawPublisher()
    payloads = random_payloads(9, 4)
    try:
        with ClusterListener(ClusterIndex(BS), replay_timeout=2.0) as lst:
            for seq in range(3):
                raw.send(seq, payloads[seq], drop=True)  # before anyone listened
            slot = lst.add_worker("a", raw.endpoint, replay_endpoint=raw.replay_endpoint)
            with caplog.at_level("INFO", logger="kvindex.cluster"):
                deadline = time.monotonic() + DEADLINE_S
                while lst.index.worker_info(slot)["next_seq"] < 4:
                    assert time.monotonic() < deadline, "never joined"
                    raw.send(3, payloads[3])
                    time.sleep(0.01)
                wait_for(lambda: lst.repairing == 0, "the join's replay")
            assert lst.index.worker_blocks(slot).tolist() == reference(payloads)
            assert lst.index.status(slot) == "live"
            st = lst.stats
            assert st["late_joins"] <= 1 and st["gaps"] == 0 and st["repaired"] in (3, 4)
            assert not [r for r in caplog.records if r.levelname == "WARNING"]
            joined = any("joined at batch 3" in r.getMessage() for r in caplog.records)
            assert joined == (st["late_joins"] == 1)
    finally:
        raw.close()
