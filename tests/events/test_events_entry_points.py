"""The event module's entry points under hostile arguments, over real loopback sockets:
``EventEncoder``, the event classes, ``decode_event_batch``, ``EventPublisher`` and
``EventSubscriber``.

The one rule: a count, rank or index given ``True``, a float or a str raises
``DTypeError``, an int outside its range ``InvalidArgumentError`` (never a bare
``OverflowError``); a flag given anything but a bool ``DTypeError``; an object that is
not an event ``DTypeError``; a lone surrogate ``InvalidArgumentError``; a call after
``close()`` ``ClosedError``. A refused call changes nothing: the cache keeps its events,
no sequence number is spent, nothing is bound, and the stream keeps flowing afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex import ClosedError, DTypeError, InvalidArgumentError, KvIndexError
from kvindex.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventEncoder,
    EventPublisher,
    EventSubscriber,
    decode_event_batch,
)

HUGE = [2**63, 2**64, -(2**63) - 1, 10**400]
NOT_INTS = [True, 1.5, math.nan, "0", b"0", object(), [0]]
NOT_FLAGS = ["yes", "", "no", 1, 0, 1.0, object()]
SURROGATES = ["\ud800", "GPU\udfff"]
DEADLINE_S = 10.0


def _cache() -> Any:
    c = kvindex.HashChainCache(16, 4, enable_events=True)
    c.admit(1, np.arange(9, dtype=np.int32))
    return c


def _pending_events(c: Any) -> list[Any]:
    """The cache's buffered events, put back: a clone's drain leaves ``c`` untouched."""
    return list(c.take_events())


# ------------------------------------------------------------------------- EventEncoder


@pytest.mark.parametrize("name", ["data_parallel_rank", "group_idx"])
def test_encoder_int_options(name: str) -> None:
    for v in HUGE:
        with pytest.raises(InvalidArgumentError):
            EventEncoder(**{name: v})
    for v in NOT_INTS:
        with pytest.raises(DTypeError):
            EventEncoder(**{name: v})
    assert getattr(EventEncoder(**{name: None}), name) is None


@pytest.mark.parametrize("name", ["medium", "kv_cache_spec_kind"])
def test_encoder_str_options(name: str) -> None:
    for v in SURROGATES:
        with pytest.raises(InvalidArgumentError):
            EventEncoder(**{name: v})
    for v in [3, b"GPU", True]:
        with pytest.raises(DTypeError):
            EventEncoder(**{name: v})


def test_encoder_flags() -> None:
    for v in NOT_FLAGS:
        with pytest.raises(DTypeError):
            EventEncoder(array_tagged=v)
        c = _cache()
        with pytest.raises(DTypeError):
            EventEncoder().encode(c, 0.0, skip_empty=v)
        assert len(_pending_events(c)) > 0, "a refused encode drains nothing"
    assert EventEncoder(array_tagged=np.bool_(True)).array_tagged


def test_encode_refuses_what_is_not_a_cache_or_an_event() -> None:
    enc = EventEncoder()
    for bad in [3, None, "cache", object(), EventEncoder()]:
        with pytest.raises(DTypeError):
            enc.encode(bad, 0.0)
    for events in [3, None, [3], [object()], [BlockRemoved([1]), "x"], [{"type": "x"}]]:
        with pytest.raises(DTypeError):
            enc.encode_events(events, 0.0)  # type: ignore[arg-type]
    c = _cache()
    for ts in [True, "0", None, object()]:
        with pytest.raises(DTypeError):
            enc.encode(c, ts)
    with pytest.raises(InvalidArgumentError):
        enc.encode(c, 10**400)
    assert len(_pending_events(c)) > 0


def test_event_objects_refuse_bad_fields() -> None:
    for h in [True, 1.5, "1", None, object()]:
        with pytest.raises(DTypeError):
            BlockStored([h], None, [1, 2], 2)
        with pytest.raises(DTypeError):
            BlockRemoved([h])
        if h is not None:  # no parent is None
            with pytest.raises(DTypeError):
                BlockStored([1], h, [1, 2], 2)
    for h in [2**64, -(2**63) - 1]:
        with pytest.raises(InvalidArgumentError):
            BlockStored([h], None, [1, 2], 2)
    for hashes in [3, None, object()]:
        with pytest.raises(DTypeError):
            BlockRemoved(hashes)  # type: ignore[arg-type]
    for v in HUGE:
        with pytest.raises(InvalidArgumentError):
            BlockStored([1], None, [1, 2], v)
        with pytest.raises(InvalidArgumentError):
            BlockStored([1], None, [v], 2)
        with pytest.raises(InvalidArgumentError):
            BlockRemoved([1], group_idx=v)
    for v in NOT_INTS:
        with pytest.raises(DTypeError):
            BlockStored([1], None, [1, 2], v)
        with pytest.raises(DTypeError):
            BlockStored([1], None, [1, 2], 2, lora_id=v)
    for s in SURROGATES:
        with pytest.raises(InvalidArgumentError):
            BlockStored([1], None, [1, 2], 2, medium=s)
        with pytest.raises(InvalidArgumentError):
            BlockStored([1], None, [1, 2], 2, locality={"zone": s})
    with pytest.raises(DTypeError):
        BlockStored([1], None, [1, 2], 2, locality={"zone": object()})


def test_decode_refuses_bad_arguments() -> None:
    good = EventEncoder().encode_events([AllBlocksCleared()], 0.0)
    for payload in ["text", None, 3, bytearray(good)]:
        with pytest.raises(DTypeError):
            decode_event_batch(payload)  # type: ignore[arg-type]
    for v in HUGE:
        with pytest.raises(InvalidArgumentError):
            decode_event_batch(good, block_size=v)
    for v in NOT_INTS:
        with pytest.raises(DTypeError):
            decode_event_batch(good, block_size=v)
    for bad in [b"", b"\x93", b"\x91" * 100_000 + b"\xc0", b"\xff" * 64]:
        with pytest.raises(InvalidArgumentError):
            decode_event_batch(bad)
    assert decode_event_batch(good)[0] == 0.0


# ----------------------------------------------------------------------- EventPublisher


PUBLISHER_BAD: list[tuple[dict[str, Any], type]] = [
    *[({"buffer_steps": v}, InvalidArgumentError) for v in [0, 2**63, 2**64]],
    *[({"buffer_steps": v}, DTypeError) for v in [True, 1.5, "8"]],
    *[({"max_queue_size": v}, InvalidArgumentError) for v in [0, 2**63]],
    *[({"hwm": v}, InvalidArgumentError) for v in [-1, 2**31, 2**63]],
    *[({"hwm": v}, DTypeError) for v in [True, 10.0]],
    *[({"data_parallel_rank": v}, InvalidArgumentError) for v in [-1, 2**63]],
    *[({"data_parallel_rank": v}, DTypeError) for v in [True, 0.0]],
    *[({"group_idx": v}, InvalidArgumentError) for v in [2**63]],
    *[({"array_tagged": v}, DTypeError) for v in ["no", 1]],
    *[({"bind": v}, DTypeError) for v in ["no", 1]],
    *[({"medium": v}, InvalidArgumentError) for v in SURROGATES],
    *[({"topic": v}, InvalidArgumentError) for v in SURROGATES],
    ({"topic": 3}, DTypeError),
    ({"replay_endpoint": "\ud800"}, InvalidArgumentError),
    ({"replay_endpoint": "nowhere"}, InvalidArgumentError),
]


@pytest.mark.parametrize(("kw", "cls"), PUBLISHER_BAD)
def test_publisher_options_are_refused_before_anything_is_bound(
    kw: dict[str, Any], cls: type
) -> None:
    endpoint = "inproc://kvindex-adversarial-pub"
    with pytest.raises(cls):
        EventPublisher(endpoint, **kw)
    # Nothing was left bound: the same endpoint binds now.
    EventPublisher(endpoint).close()


@pytest.mark.parametrize("endpoint", ["\ud800", 5, None, "nowhere", "tcp://"])
def test_publisher_endpoint(endpoint: Any) -> None:
    with pytest.raises(KvIndexError):
        EventPublisher(endpoint)


def _flowing(pub: EventPublisher, sub: EventSubscriber) -> None:
    """Publishes until the subscriber receives (ZMQ's slow joiner), bounded."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        pub.publish_events([AllBlocksCleared()])
        if sub.poll(0.02):
            return
        assert time.monotonic() < deadline, "the stream never reached the subscriber"


def test_publisher_calls_refuse_bad_values_and_change_nothing() -> None:
    with EventPublisher("tcp://127.0.0.1:*") as pub, EventSubscriber(pub.endpoint) as sub:
        _flowing(pub, sub)
        c = _cache()
        before = (pub.next_seq, pub.stats["published"])
        for ts in [math.nan, math.inf, 10**400, True, "0"]:
            with pytest.raises(KvIndexError):
                pub.publish(c, ts=ts)
            with pytest.raises(KvIndexError):
                pub.publish_events([AllBlocksCleared()], ts=ts)
        for payload in ["x", None, 3, [b"x"]]:
            with pytest.raises(DTypeError):
                pub.publish_payload(payload)  # type: ignore[arg-type]
        for events in [[3], 3, [object()]]:
            with pytest.raises(DTypeError):
                pub.publish_events(events)  # type: ignore[arg-type]
        with pytest.raises(DTypeError):
            pub.publish(3)  # type: ignore[arg-type]
        for timeout in [math.nan, -1, "1", True]:
            with pytest.raises(KvIndexError):
                pub.close(timeout)  # type: ignore[arg-type]
        assert (pub.next_seq, pub.stats["published"]) == before
        # The cache kept its events; the stream still flows.
        seq = pub.publish(c, ts=1.0)
        assert seq == before[0]
        _flowing(pub, sub)


def test_publisher_after_close_raises_closed_error_and_keeps_the_events() -> None:
    pub = EventPublisher("tcp://127.0.0.1:*")
    pub.close()
    pub.close()
    c = _cache()
    n = pub.next_seq
    with pytest.raises(ClosedError):
        pub.publish(c)
    with pytest.raises(ClosedError):
        pub.publish_events([AllBlocksCleared()])
    with pytest.raises(ClosedError):
        pub.publish_payload(b"x")
    assert pub.next_seq == n
    assert len(_pending_events(c)) > 0, "publish after close drains nothing"


# ---------------------------------------------------------------------- EventSubscriber


SUBSCRIBER_BAD: list[tuple[dict[str, Any], type]] = [
    *[({"block_size": v}, InvalidArgumentError) for v in [0, 2**63, 2**64]],
    *[({"block_size": v}, DTypeError) for v in [True, 4.0, "4"]],
    *[({"replay_timeout": v}, InvalidArgumentError) for v in [math.nan, -1]],
    *[({"replay_timeout": v}, DTypeError) for v in ["1", True, None]],
    *[({"rcvhwm": v}, InvalidArgumentError) for v in [-1, 2**31, 2**63]],
    *[({"rcvhwm": v}, DTypeError) for v in [True, 1.0]],
    *[({"topic": v}, InvalidArgumentError) for v in SURROGATES],
    ({"replay_endpoint": "\ud800"}, InvalidArgumentError),
    ({"replay_endpoint": "nowhere"}, InvalidArgumentError),
]


@pytest.mark.parametrize(("kw", "cls"), SUBSCRIBER_BAD)
def test_subscriber_options(kw: dict[str, Any], cls: type) -> None:
    with pytest.raises(cls):
        EventSubscriber("tcp://127.0.0.1:1", **kw)


def test_subscriber_calls_refuse_bad_values_and_keep_receiving() -> None:
    with EventPublisher("tcp://127.0.0.1:*") as pub, EventSubscriber(pub.endpoint) as sub:
        _flowing(pub, sub)
        polls: list[Callable[[], object]] = [
            *[lambda v=v: sub.poll(v) for v in [math.nan, -1.0, "1", True, None]],
            *[lambda v=v: sub.poll(0, v) for v in [-1, 2**63, True, 1.5]],
        ]
        stats = sub.stats
        for call in polls:
            with pytest.raises(KvIndexError):
                call()
        assert sub.stats == stats
        _flowing(pub, sub)


def test_subscriber_after_close_raises_closed_error() -> None:
    sub = EventSubscriber("tcp://127.0.0.1:1")
    sub.close()
    sub.close()
    with pytest.raises(ClosedError):
        sub.poll()
    with pytest.raises(ClosedError):
        sub.poll(0.5, 10)


# ---------------------------------------------------------------------- frame helpers


def test_seq_bytes_and_offset_endpoint_follow_the_rule() -> None:
    from kvindex.events import offset_endpoint, seq_bytes

    assert seq_bytes(2**63 - 1) == b"\x7f" + b"\xff" * 7
    assert seq_bytes(-1) == b"\xff" * 8
    for v in [2**63, 2**64, -(2**63) - 1]:
        with pytest.raises(InvalidArgumentError):
            seq_bytes(v)
    for v in [True, 1.0, "1", None]:
        with pytest.raises(DTypeError):
            seq_bytes(v)  # type: ignore[arg-type]
    for r in [-1, 2**31, 2**63]:
        with pytest.raises(InvalidArgumentError):
            offset_endpoint("tcp://*:5557", r)
    for r in [True, 1.0, "1", None]:
        with pytest.raises(DTypeError):
            offset_endpoint("tcp://*:5557", r)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        offset_endpoint("ipc://\ud800", 1)
    assert offset_endpoint("tcp://*:5557", np.int64(2)) == "tcp://*:5559"
