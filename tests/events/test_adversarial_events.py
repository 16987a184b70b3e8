"""Adversarial inputs to the KV-event publisher and subscriber: every bad option or
argument raises a ``KvIndexError`` subclass before any socket or thread exists (or,
for a call, before anything is queued), and a refused call leaves the object working.

Regression cases: a non-bytes ``publish_payload`` used to be queued and kill the
sender thread (every later batch silently lost); a negative or huge ``poll``
timeout blocked forever or overflowed; a bad ``close`` timeout marked the publisher
closed and then raised, leaving its thread running; an int ``topic`` allocated that
many zero bytes; out-of-range ints raised bare ``OverflowError``.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex.events import EventPublisher, EventSubscriber
from kvindex.exceptions import DTypeError, InvalidArgumentError, KvIndexError

_n = itertools.count()


def _ep() -> str:
    return f"inproc://adversarial-events-{next(_n)}"


def _publisher_threads() -> int:
    return sum(t.name == "kvindex-event-publisher" for t in threading.enumerate())


BAD_INTS: list[Any] = [
    None,
    True,
    1.5,
    math.nan,
    math.inf,
    -1,
    2**63,
    -(2**63) - 1,
    10**400,
    "1",
    [1],
    np.float64(2.0),
]
BAD_TEXT: list[Any] = [None, 1, b"x", ["a"], "\ud800"]


@pytest.mark.parametrize("option", ["buffer_steps", "max_queue_size", "hwm", "data_parallel_rank"])
@pytest.mark.parametrize("value", BAD_INTS, ids=repr)
def test_publisher_int_options_refused_without_a_thread(option: str, value: Any) -> None:
    before = _publisher_threads()
    with pytest.raises(KvIndexError):
        EventPublisher(_ep(), **{option: value}).close(0.5)
    assert _publisher_threads() == before


@pytest.mark.parametrize("value", [0, 2**31, 2**40], ids=repr)
def test_publisher_out_of_range_counts(value: int) -> None:
    with pytest.raises(InvalidArgumentError):
        EventPublisher(_ep(), hwm=2**31 if value == 0 else value)
    with pytest.raises(InvalidArgumentError):
        EventPublisher(_ep(), buffer_steps=0)


@pytest.mark.parametrize("topic", [5, 2**40, -1, 1.5, None, ["t"], "\ud800"], ids=repr)
def test_topic_must_be_text_or_bytes(topic: Any) -> None:
    with pytest.raises(KvIndexError):
        EventPublisher(_ep(), topic=topic)
    with pytest.raises(KvIndexError):
        EventSubscriber(_ep(), topic=topic)


@pytest.mark.parametrize("value", BAD_TEXT, ids=repr)
def test_endpoints_must_be_valid_text(value: Any) -> None:
    if value is not None:
        with pytest.raises(KvIndexError):
            EventPublisher(value)
        with pytest.raises(KvIndexError):
            EventSubscriber(value)
    if value is not None:
        with pytest.raises(KvIndexError):
            EventPublisher(_ep(), replay_endpoint=value)
        with pytest.raises(KvIndexError):
            EventSubscriber(_ep(), replay_endpoint=value)


@pytest.mark.parametrize(
    "payload", [None, True, 1.5, 2**63, "text", [b"x"], object()], ids=lambda v: type(v).__name__
)
def test_bad_payload_is_refused_and_the_sender_survives(payload: Any) -> None:
    with EventPublisher(_ep()) as pub:
        with pytest.raises(DTypeError):
            pub.publish_payload(payload)
        assert pub.next_seq == 0 and pub.stats["published"] == 0
        # The sender thread still sends what comes next.
        cache = kvindex.HashChainCache(16, 4, enable_events=True)
        cache.admit(1, np.arange(9, dtype=np.int32))
        assert pub.publish(cache, ts=1.0) == 0
        deadline = time.monotonic() + 5.0
        while pub.stats["sent"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.stats["sent"] == 1
        assert pub._thread.is_alive()


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf, 10**400, "1", None, True])
def test_bad_timestamps_queue_nothing(ts: Any) -> None:
    with EventPublisher(_ep()) as pub:
        cache = kvindex.HashChainCache(16, 4, enable_events=True)
        cache.admit(1, np.arange(9, dtype=np.int32))
        if ts is None:
            assert pub.publish(cache, ts=ts) == 0  # None means "now"
            return
        with pytest.raises(KvIndexError):
            pub.publish(cache, ts=ts)
        with pytest.raises(KvIndexError):
            pub.publish_events([], ts=ts)
        assert pub.next_seq == 0
        # The refused publish drained nothing.
        assert pub.publish(cache, ts=2.0) == 0


@pytest.mark.parametrize("timeout", [-1, -0.001, -(2**63) - 1, math.nan, "1", None, True])
def test_poll_refuses_bad_timeouts_at_once(timeout: Any) -> None:
    sub = EventSubscriber(_ep())
    try:
        t0 = time.monotonic()
        with pytest.raises(KvIndexError):
            sub.poll(timeout)
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(KvIndexError):
            sub.poll(0, max_messages=timeout if timeout is not None else -1)
        assert sub.poll(0) == []
    finally:
        sub.close()


def test_unbounded_timeouts_are_accepted() -> None:
    sub = EventSubscriber(_ep(), replay_timeout=math.inf)
    sub.close()
    sub = EventSubscriber(_ep(), replay_timeout=10**400)
    sub.close()
    pub = EventPublisher(_ep())
    pub.close(timeout=math.inf)
    assert not pub._thread.is_alive()


@pytest.mark.parametrize("timeout", [math.nan, -1, "1", None, 10**400 * -1])
def test_bad_close_timeout_leaves_the_publisher_open(timeout: Any) -> None:
    pub = EventPublisher(_ep())
    with pytest.raises(KvIndexError):
        pub.close(timeout)
    assert pub._thread.is_alive()
    assert pub.publish_payload(b"\x93\x00\x90\x00") == 0
    pub.close(2.0)
    assert not pub._thread.is_alive()


@pytest.mark.parametrize("option", ["block_size", "rcvhwm", "replay_timeout"])
@pytest.mark.parametrize("value", [True, -1, 2**63, math.nan, "1", [1]], ids=repr)
def test_subscriber_options_refused(option: str, value: Any) -> None:
    if option == "replay_timeout" and value == 2**63:
        EventSubscriber(_ep(), replay_timeout=value).close()  # an unbounded wait
        return
    with pytest.raises(KvIndexError):
        EventSubscriber(_ep(), **{option: value})
