"""Every scalar parameter of the engine-lifecycle calls, on both designs, under the one
argument rule: a ``bool``, a float, a str or ``None`` given as a count is a ``DTypeError``;
an int outside int64 (``2**63`` and beyond) an ``InvalidArgumentError``, never a bare
``OverflowError``; a flag given anything but a bool (``"no"``, ``1``) a ``DTypeError``; a
lone-surrogate salt an ``InvalidArgumentError``; token ids outside int32 are refused by
``commit_tokens``, ``commit_batch`` and ``schedule(draft_tokens=)`` as admission refuses
them. Each refused call changes nothing (a full snapshot before and after, invariants
checked) and both designs refuse it with the same class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex import DTypeError, InvalidArgumentError, KvIndexError

DESIGNS = ["hash_chain", "radix"]
HUGE = [2**63, 2**64, -(2**63) - 1, 10**400]
NOT_INTS = [True, False, 1.5, float("nan"), "3", b"3", object(), [1]]
NOT_FLAGS = ["yes", "", "no", 1, 0, 1.0, None, object()]


def _arr(xs: Any) -> np.ndarray:
    return np.asarray(list(xs), dtype=np.int64)


def _cache(kind: str) -> Any:
    c = (
        kvindex.HashChainCache(32, 4, enable_events=True)
        if kind == "hash_chain"
        else kvindex.RadixPrefixCache(32, 4, enable_events=True)
    )
    assert c.admit_chunk(1, _arr(range(10)), chunk=4) is not None  # prefilling
    assert c.admit_chunk(2, _arr(range(6))) is not None  # prefilled: one placeholder
    assert c.admit_chunk(3, _arr(range(5))) is not None
    c.commit_tokens(3, _arr([9]))  # 3 may take drafts now
    assert c.admit_chunk(4, _arr(range(3))) is not None
    c.preempt(4)
    assert c.admit_chunk(5, _arr(range(9)), external_prefix=8, delay_cache=True) is not None
    c.take_events()
    return c


def _snapshot(c: Any) -> Any:
    live = [i for i in range(1, 10) if i in c]
    return (
        c.num_free_blocks,
        c.num_requests,
        [c.request_blocks(i).tolist() for i in live],
        [c.request_state(i) for i in live],
        c.stats,
        c.resumed_stats,
        [c.lookup(_arr(range(n))) for n in (5, 9, 10)],
        c.take_events(),
    )


# name -> a call taking (cache, bad value) on a parameter that is a count
COUNT_PARAMS: dict[str, Callable[[Any, Any], object]] = {
    "admit_chunk chunk": lambda c, v: c.admit_chunk(9, _arr(range(5)), chunk=v),
    "admit_chunk lookahead": lambda c, v: c.admit_chunk(9, _arr(range(5)), lookahead=v),
    "admit_chunk external_prefix": lambda c, v: c.admit_chunk(9, _arr(range(5)), external_prefix=v),
    "admit_chunk reserved_blocks": lambda c, v: c.admit_chunk(9, _arr(range(5)), reserved_blocks=v),
    "admit_chunk watermark_blocks": lambda c, v: c.admit_chunk(
        9, _arr(range(5)), watermark_blocks=v
    ),
    "admit_chunk request_id": lambda c, v: c.admit_chunk(v, _arr(range(5))),
    "resume chunk": lambda c, v: c.resume(4, chunk=v),
    "resume lookahead": lambda c, v: c.resume(4, lookahead=v),
    "resume external_prefix": lambda c, v: c.resume(4, external_prefix=v),
    "resume reserved_blocks": lambda c, v: c.resume(4, reserved_blocks=v),
    "resume watermark_blocks": lambda c, v: c.resume(4, watermark_blocks=v),
    "resume request_id": lambda c, v: c.resume(v),
    "schedule num_new_tokens": lambda c, v: c.schedule(1, v),
    "schedule lookahead": lambda c, v: c.schedule(1, 2, lookahead=v),
    "schedule reserved_blocks": lambda c, v: c.schedule(1, 2, reserved_blocks=v),
    "schedule request_id": lambda c, v: c.schedule(v, 1),
    "schedule_batch lookahead": lambda c, v: c.schedule_batch(_arr([1]), _arr([2]), lookahead=v),
    "commit_tokens num_rejected": lambda c, v: c.commit_tokens(2, _arr([7]), v),
    "commit_tokens request_id": lambda c, v: c.commit_tokens(v, _arr([7])),
    "preempt request_id": lambda c, v: c.preempt(v),
    "finish request_id": lambda c, v: c.finish(v),
    "finish_transfer request_id": lambda c, v: c.finish_transfer(v),
    "request_state request_id": lambda c, v: c.request_state(v),
    "checkpoint request_id": lambda c, v: c.checkpoint(v),
}

FLAG_PARAMS: dict[str, Callable[[Any, Any], object]] = {
    "admit_chunk must_fit": lambda c, v: c.admit_chunk(9, _arr(range(5)), must_fit=v),
    "admit_chunk delay_cache": lambda c, v: c.admit_chunk(
        9, _arr(range(5)), external_prefix=4, delay_cache=v
    ),
    "admit_chunk skip_reading": lambda c, v: c.admit_chunk(9, _arr(range(5)), skip_reading=v),
    "admit skip_reading": lambda c, v: c.admit(9, _arr(range(5)), skip_reading=v),
    "resume must_fit": lambda c, v: c.resume(4, must_fit=v),
    "resume delay_cache": lambda c, v: c.resume(4, external_prefix=2, delay_cache=v),
}

WIDE = [2**31, -(2**31) - 1, 2**40, 2**63 - 1]
WIDE_CALLS: dict[str, Callable[[Any, int], object]] = {
    "commit_tokens": lambda c, t: c.commit_tokens(2, _arr([t])),
    "commit_tokens after drafts": lambda c, t: c.commit_tokens(3, _arr([t])),
    "commit_batch": lambda c, t: c.commit_batch(_arr([2]), _arr([t])),
    "commit_batch second": lambda c, t: c.commit_batch(_arr([3, 2]), _arr([1, t])),
    "schedule draft_tokens": lambda c, t: c.schedule(3, 2, draft_tokens=_arr([t])),
    "schedule_batch draft_tokens": lambda c, t: c.schedule_batch(
        _arr([3]), _arr([2]), draft_tokens=_arr([t]), draft_offsets=_arr([0, 1])
    ),
}


def _refused(kind: str, call: Callable[[Any], object], cls: type) -> type:
    c = _cache(kind)
    before = _snapshot(c)
    with pytest.raises(KvIndexError) as e:
        call(c)
    assert isinstance(e.value, cls), repr(e.value)
    assert _snapshot(c) == before
    c.check_invariants()
    return type(e.value)


@pytest.mark.parametrize("param", sorted(COUNT_PARAMS))
def test_counts_refuse_huge_ints_and_non_ints_on_both_designs(param: str) -> None:
    f = COUNT_PARAMS[param]
    # A request id is any int in 0..2**64 (2**63 is a well-formed id): beyond, or negative.
    huge = [2**64, -1, -(2**63) - 1, 10**400] if "request_id" in param else HUGE
    for v in huge:
        got = [_refused(k, lambda c, v=v: f(c, v), InvalidArgumentError) for k in DESIGNS]
        assert got[0] is got[1], (param, v, got)
    for v in NOT_INTS:
        got = [_refused(k, lambda c, v=v: f(c, v), DTypeError) for k in DESIGNS]
        assert got[0] is got[1], (param, v, got)


@pytest.mark.parametrize("param", sorted(FLAG_PARAMS))
def test_flags_refuse_everything_but_bools(param: str) -> None:
    f = FLAG_PARAMS[param]
    for v in NOT_FLAGS:
        for k in DESIGNS:
            _refused(k, lambda c, v=v: f(c, v), DTypeError)
    # numpy bools are bools
    for k in DESIGNS:
        f(_cache(k), np.bool_(False))


@pytest.mark.parametrize("call", sorted(WIDE_CALLS))
@pytest.mark.parametrize("tok", WIDE)
def test_wide_token_ids_are_refused_alike(call: str, tok: int) -> None:
    for k in DESIGNS:
        _refused(k, lambda c: WIDE_CALLS[call](c, tok), InvalidArgumentError)


@pytest.mark.parametrize("salt", ["\ud800", "a\udfffb"])
def test_a_surrogate_salt_is_refused_by_admit_chunk(salt: str) -> None:
    for k in DESIGNS:
        _refused(
            k, lambda c: c.admit_chunk(9, _arr(range(5)), cache_salt=salt), InvalidArgumentError
        )


def test_valid_values_still_work_after_refusals() -> None:
    for k in DESIGNS:
        c = _cache(k)
        for f in COUNT_PARAMS.values():
            with pytest.raises(KvIndexError):
                f(c, 2**64 + 5)
        assert c.admit_chunk(9, _arr(range(5)), chunk=np.int64(2), lookahead=np.int32(1))
        c.commit_tokens(2, _arr([2**31 - 1]))
        c.check_invariants()
