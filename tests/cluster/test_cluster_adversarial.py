"""The cluster module's entry points under hostile arguments: ``ClusterIndex``, ``Router``,
``ClusterListener`` (over real loopback sockets) and ``simulate_cluster``.

The one rule: an int >= 2**63 (or below -2**63) as a count, sequence number, rank or slot
raises ``InvalidArgumentError``, never a bare ``OverflowError``; ``True``, a float or a
str as a count raises ``DTypeError``; a lone-surrogate name ``InvalidArgumentError``; a
bad ``Router`` option a ``KvIndexError`` subclass (``ttl=nan`` included); a call after
``close()`` ``ClosedError`` at once. Every refused call leaves the state as it was
(snapshots compared), and the listener's receive thread keeps serving afterwards.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvindex import ClosedError, DTypeError, InvalidArgumentError, KvIndexError
from kvindex.cluster import ClusterIndex, ClusterListener, Decision, Router
from kvindex.events import EventEncoder, EventPublisher
from kvindex.simulate.cluster import simulate_cluster
from kvindex.simulate.errors import SimulationError
from kvindex.simulate.workloads import chat_workload

BS = 4
HUGE = [2**63, 2**64, -(2**63) - 1, 10**400]
NOT_INTS = [True, False, 1.5, math.nan, "0", b"0", None, object(), [0]]
SURROGATES = ["\ud800", "w\udfff"]
DEADLINE_S = 10.0


def _prompt(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n).astype(np.int32)


def _index() -> ClusterIndex:
    ix = ClusterIndex(BS)
    ix.add_worker("a")
    ix.add_worker("b", 1)
    ix.store_hashes(0, ix.hashes(_prompt())[:3])
    return ix


def _snapshot(ix: ClusterIndex) -> Any:
    return (
        ix.slots,
        ix.membership,
        ix.num_blocks,
        ix.num_pairs,
        ix.unknown_worker_batches,
        ix.statuses(),
        ix.incarnations(),
        [ix.worker_info(w) for w in range(ix.slots) if ix.status(w)],
        [ix.worker_blocks(w).tolist() for w in range(ix.slots) if ix.status(w)],
    )


def _refused(ix: ClusterIndex, call: Callable[[], object], cls: type) -> None:
    before = _snapshot(ix)
    with pytest.raises(KvIndexError) as e:
        call()
    assert isinstance(e.value, cls), repr(e.value)
    assert _snapshot(ix) == before
    ix.check_invariants()


# ------------------------------------------------------------------------- ClusterIndex

INDEX_INT_PARAMS: dict[str, Callable[[ClusterIndex, Any], object]] = {
    "add_worker dp_rank": lambda ix, v: ix.add_worker("c", v),
    "remove_worker worker": lambda ix, v: ix.remove_worker(v),
    "apply worker": lambda ix, v: ix.apply(v, 0, b""),
    "apply seq": lambda ix, v: ix.apply(0, v, b""),
    "give_up worker": lambda ix, v: ix.give_up(v, 1),
    "give_up seq": lambda ix, v: ix.give_up(0, v),
    "store_hashes worker": lambda ix, v: ix.store_hashes(v, [1]),
    "remove_hashes worker": lambda ix, v: ix.remove_hashes(v, [1]),
    "status worker": lambda ix, v: ix.status(v),
    "worker_info worker": lambda ix, v: ix.worker_info(v),
    "worker_blocks worker": lambda ix, v: ix.worker_blocks(v),
    "route start": lambda ix, v: ix.route(_prompt(), np.zeros(2), start=v),
}


@pytest.mark.parametrize("param", sorted(INDEX_INT_PARAMS))
def test_index_int_parameters_follow_the_rule(param: str) -> None:
    f = INDEX_INT_PARAMS[param]
    ix = _index()
    for v in HUGE:
        if param == "route start" and 0 <= v < 2**64:
            continue  # a rotation start: any non-negative 64-bit int
        _refused(ix, lambda v=v: f(ix, v), InvalidArgumentError)
    for v in NOT_INTS:
        if v is None and param == "apply seq":
            continue  # a bare payload: no sequence number
        _refused(ix, lambda v=v: f(ix, v), DTypeError)


def test_a_sequence_number_of_eight_ff_bytes_is_a_caller_error() -> None:
    ix = _index()
    seq = int.from_bytes(b"\xff" * 8, "big")
    payload = EventEncoder().encode_events([], 0.0)
    _refused(ix, lambda: ix.apply(0, seq, payload), InvalidArgumentError)
    _refused(ix, lambda: ix.give_up(0, seq), InvalidArgumentError)
    assert ix.apply(0, 0, payload) == ("applied", -1)


@pytest.mark.parametrize("bad", SURROGATES)
def test_index_str_parameters_refuse_surrogates(bad: str) -> None:
    ix = _index()
    p = _prompt()
    for call in [
        lambda: ix.add_worker(bad),
        lambda: ix.hashes(p, cache_salt=bad),
        lambda: ix.overlaps(p, cache_salt=bad),
        lambda: ix.route(p, np.zeros(2), cache_salt=bad),
    ]:
        _refused(ix, call, InvalidArgumentError)
    for kw in ({"algo": bad}, {"seed": bad}):
        with pytest.raises(InvalidArgumentError):
            ClusterIndex(BS, **kw)


def test_index_type_errors_are_dtype_errors() -> None:
    ix = _index()
    p = _prompt()
    for call in [
        lambda: ix.add_worker(3),
        lambda: ix.add_worker(None),
        lambda: ix.apply(0, 0, "a str payload"),
        lambda: ix.apply(0, 0, None),
        lambda: ix.route(p, np.zeros(2), overlap_weight="1"),
        lambda: ix.route(p, np.zeros(2), overlap_weight=True),
        lambda: ix.route(p, ["x", "y"]),
        lambda: ix.hashes(p, cache_salt=3),
    ]:
        _refused(ix, call, DTypeError)
    for v in [True, 4.0, "4", None]:
        with pytest.raises(DTypeError):
            ClusterIndex(v)
    for v in HUGE:
        with pytest.raises(InvalidArgumentError):
            ClusterIndex(v)


@pytest.mark.parametrize("w", [math.nan, math.inf, -1.0, -math.inf])
def test_route_refuses_a_weight_that_is_not_finite_and_non_negative(w: float) -> None:
    ix = _index()
    _refused(ix, lambda: ix.route(_prompt(), np.zeros(2), overlap_weight=w), InvalidArgumentError)


# ------------------------------------------------------------------------------- Router


def _router_state(r: Router) -> Any:
    return (r.load.tolist(), r.decisions, r.open_decisions, _snapshot(r.index))


@pytest.mark.parametrize(
    ("kw", "cls"),
    [
        ({"policy": "nope"}, InvalidArgumentError),
        ({"policy": 3}, DTypeError),
        ({"policy": "\ud800"}, InvalidArgumentError),
        ({"overlap_weight": math.nan}, InvalidArgumentError),
        ({"overlap_weight": math.inf}, InvalidArgumentError),
        ({"overlap_weight": -1}, InvalidArgumentError),
        ({"overlap_weight": "1"}, DTypeError),
        ({"overlap_weight": True}, DTypeError),
        ({"overlap_weight": 10**400}, InvalidArgumentError),
        ({"ttl": math.nan}, InvalidArgumentError),
        ({"ttl": math.inf}, InvalidArgumentError),
        ({"ttl": 0}, InvalidArgumentError),
        ({"ttl": -5.0}, InvalidArgumentError),
        ({"ttl": "60"}, DTypeError),
        ({"ttl": None}, DTypeError),
        ({"seed": True}, DTypeError),
        ({"seed": 1.5}, DTypeError),
        ({"seed": "0"}, DTypeError),
        ({"clock": 3}, DTypeError),
    ],
)
def test_router_options_raise_kvindex_errors(kw: dict[str, Any], cls: type) -> None:
    ix = _index()
    before = _snapshot(ix)
    with pytest.raises(cls):
        Router(ix, **kw)
    assert _snapshot(ix) == before


def test_router_needs_a_cluster_index() -> None:
    with pytest.raises(DTypeError):
        Router(object())  # type: ignore[arg-type]


def test_router_accepts_numpy_and_huge_seeds() -> None:
    ix = _index()
    a, b = Router(ix, "random", seed=np.int64(7)), Router(ix, "random", seed=7)
    p = _prompt()
    assert [a.route(p) for _ in range(5)] == [b.route(p) for _ in range(5)]
    Router(ix, "random", seed=2**200)


@pytest.mark.parametrize("policy", ["kv", "least_loaded", "random", "round_robin", "approx"])
def test_a_refused_route_takes_no_turn_and_adds_no_load(policy: str) -> None:
    ix = _index()
    r, twin = Router(ix, policy, seed=1, clock=lambda: 0.0), Router(_index(), policy, seed=1)
    before = _router_state(r)
    for bad in [
        np.arange(8, dtype=np.float64),
        "tokens",
        np.array([2**40], dtype=np.int64) if ix.algo.startswith("radix") else None,
    ]:
        if bad is None:
            continue
        with pytest.raises(KvIndexError):
            r.route(bad)  # type: ignore[arg-type]
        assert _router_state(r) == before
    with pytest.raises(KvIndexError):
        r.route(_prompt(), cache_salt="\ud800")
    assert _router_state(r) == before
    # The refused calls left no trace: the next decisions are those of a fresh router.
    d = r.route(_prompt(seed=3))
    twin_d = twin.route(_prompt(seed=3))
    assert d is not None and twin_d is not None
    assert (d.worker, d.overlap_blocks, d.blocks, d.number) == (
        twin_d.worker,
        twin_d.overlap_blocks,
        twin_d.blocks,
        twin_d.number,
    )


@pytest.mark.parametrize("policy", ["kv", "least_loaded", "random", "round_robin", "approx"])
def test_finishing_a_decision_twice_keeps_the_other_requests_load(policy: str) -> None:
    ix = ClusterIndex(BS)
    ix.add_worker("only")
    r = Router(ix, policy, seed=0)
    a = r.route(_prompt(32, 1))
    b = r.route(_prompt(16, 2))
    assert a is not None and b is not None and a.worker == b.worker == 0
    assert r.load[0] == a.blocks + b.blocks == 12
    r.finish(a)
    assert r.load[0] == b.blocks
    with pytest.raises(InvalidArgumentError):
        r.finish(a)
    assert r.load[0] == b.blocks  # b's load is intact
    # An identical-looking decision that this router did not make is refused too.
    forged = dataclasses.replace(b, number=b.number + 100)
    with pytest.raises(InvalidArgumentError):
        r.finish(forged)
    with pytest.raises(InvalidArgumentError):
        Router(ix, policy).finish(b)
    with pytest.raises(DTypeError):
        r.finish((0, 1, 2, False))  # type: ignore[arg-type]
    assert r.load[0] == b.blocks and r.open_decisions == 1
    r.finish(b)
    assert r.load[0] == 0 and r.open_decisions == 0


def test_a_decision_of_a_worker_that_left_is_finished_once_without_load() -> None:
    ix = ClusterIndex(BS)
    ix.add_worker("w0")
    r = Router(ix)
    d = r.route(_prompt())
    assert d is not None
    ix.remove_worker(0)
    ix.add_worker("w0-again")  # same slot, new incarnation
    r.finish(d)
    assert r.load[0] == 0
    with pytest.raises(InvalidArgumentError):
        r.finish(d)


def test_decisions_are_numbered_and_compare_by_number() -> None:
    ix = _index()
    r = Router(ix, "round_robin")
    ds = [r.route(_prompt()) for _ in range(4)]
    assert [d.number for d in ds if d is not None] == [1, 2, 3, 4]
    assert isinstance(ds[0], Decision) and ds[0] != ds[2]


# ---------------------------------------------------------------------- ClusterListener


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _serves(listener: ClusterListener) -> None:
    """The receive thread still answers and applies: a fresh worker's batches arrive."""
    with EventPublisher("tcp://127.0.0.1:*") as pub:
        slot = listener.add_worker("probe", pub.endpoint)
        payload = EventEncoder().encode_events([], 0.0)

        def landed() -> bool:
            pub.publish_payload(payload)
            return bool(listener.index.worker_info(slot)["next_seq"] > 0)

        _wait_for(landed, "a batch on the probe stream")
        listener.remove_worker(slot)


LISTENER_BAD_ADDS: list[tuple[tuple[Any, ...], dict[str, Any], type]] = [
    (("\ud800", "tcp://127.0.0.1:1"), {}, InvalidArgumentError),
    ((3, "tcp://127.0.0.1:1"), {}, DTypeError),
    ((None, "tcp://127.0.0.1:1"), {}, DTypeError),
    (("w", "tcp://127.0.0.1:1"), {"dp_rank": 2**63}, InvalidArgumentError),
    (("w", "tcp://127.0.0.1:1"), {"dp_rank": -(2**63) - 1}, InvalidArgumentError),
    (("w", "tcp://127.0.0.1:1"), {"dp_rank": True}, DTypeError),
    (("w", "tcp://127.0.0.1:1"), {"dp_rank": 1.0}, DTypeError),
    (("w", "tcp://127.0.0.1:1"), {"dp_rank": "0"}, DTypeError),
    (("w", "\ud800"), {}, InvalidArgumentError),
    (("w", 5), {}, DTypeError),
    (("w", "nowhere"), {}, InvalidArgumentError),
    (("w", "tcp://127.0.0.1:1"), {"replay_endpoint": "\udc80"}, InvalidArgumentError),
    (("w", "tcp://127.0.0.1:1"), {"topic": 5}, DTypeError),
]


def test_listener_add_and_remove_refuse_bad_values_and_keep_serving() -> None:
    ix = _index()
    with ClusterListener(ix) as listener:
        for args, kw, cls in LISTENER_BAD_ADDS:
            _refused(ix, lambda args=args, kw=kw: listener.add_worker(*args, **kw), cls)
        for v in HUGE:
            _refused(ix, lambda v=v: listener.remove_worker(v), InvalidArgumentError)
        for v in [-1, 2**32]:
            _refused(ix, lambda v=v: listener.remove_worker(v), InvalidArgumentError)
        for v in NOT_INTS:
            _refused(ix, lambda v=v: listener.remove_worker(v), DTypeError)
        # A slot without a worker is a caller error, reported (not logged and dropped).
        _refused(ix, lambda: listener.remove_worker(7), InvalidArgumentError)
        _serves(listener)
        assert listener._thread.is_alive()


def test_listener_calls_after_close_raise_closed_error_at_once() -> None:
    ix = _index()
    listener = ClusterListener(ix)
    _serves(listener)
    listener.close()
    listener.close()  # idempotent
    before = _snapshot(ix)
    for call in [
        lambda: listener.add_worker("late", "tcp://127.0.0.1:1"),
        lambda: listener.remove_worker(0),
        lambda: listener.remove_worker(2**70),
    ]:
        t0 = time.monotonic()
        with pytest.raises(ClosedError):
            call()
        assert time.monotonic() - t0 < 1.0, "a call on a closed listener must not wait"
    assert _snapshot(ix) == before


# ----------------------------------------------------------------------- simulate_cluster


@pytest.mark.parametrize(
    "kw",
    [
        {"max_running": 0},
        {"max_running": -1},
        {"max_batched_tokens": 0},
        {"max_batched_tokens": -8},
        {"design": "btree"},
    ],
)
def test_cluster_simulation_refuses_limits_that_admit_nothing(kw: dict[str, Any]) -> None:
    t0 = time.monotonic()
    with pytest.raises(SimulationError):
        simulate_cluster(chat_workload(4, 0), 2, "kv", blocks=1024, **kw)
    assert time.monotonic() - t0 < 5.0


def test_cluster_simulation_refuses_an_unknown_route() -> None:
    with pytest.raises(SimulationError):
        simulate_cluster(chat_workload(4, 0), 2, "nope", blocks=1024)


def test_cluster_simulation_jumps_idle_time() -> None:
    """Arrivals 10**9 steps apart (and think times as long) finish at once: idle steps,
    in which nothing can change, are skipped, not stepped through."""
    wl = chat_workload(6, 2)
    wl.requests = [
        dataclasses.replace(r, arrival=10**9 * (r.rid + 1) if r.after < 0 else 10**9)
        for r in wl.requests
    ]
    t0 = time.monotonic()
    res = simulate_cluster(wl, 2, "kv", blocks=1024, max_running=4, check=True)
    assert time.monotonic() - t0 < 60.0
    assert res.requests == len(wl.requests)
    assert res.steps > 10**9
