"""Adversarial scalar arguments across the native API: every ``str`` parameter refuses a
lone surrogate (which has no UTF-8 form) with ``InvalidArgumentError`` instead of a bare
``UnicodeEncodeError``, and every int parameter of the event classes, the encoder and
the decoder follows the rule of every other int parameter (``bool`` refused, out of
int64 range ``InvalidArgumentError``, never a bare ``OverflowError``). A refused call on
a cache changes nothing (full snapshot compared, invariants checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex import (
    BlockRemoved,
    BlockStored,
    DTypeError,
    HashChainCache,
    InvalidArgumentError,
    RadixPrefixCache,
    RadixTree,
)
from kvindex._core import EventEncoder, decode_event_batch

SURROGATES = ["\ud800", "a\udfffb", "tenant-\udc80"]
HUGE = [2**63, -(2**63) - 1, 2**64, 10**400]


def _snapshot(c: Any) -> tuple[Any, ...]:
    return (
        c.num_free_blocks,
        c.num_requests,
        c.num_cached_blocks,
        c.free_blocks().tolist(),
        {k: v for k, v in c.stats.items()},
        [c.request_blocks(r).tolist() for r in (1, 2) if r in c],
    )


def _cache(cls: type) -> Any:
    c = cls(32, 4, enable_events=True)
    c.admit(1, np.arange(13, dtype=np.int32), cache_salt="t")
    c.admit(2, np.arange(9, dtype=np.int32))
    c.free(2)
    return c


@pytest.mark.parametrize("cls", [HashChainCache, RadixPrefixCache])
@pytest.mark.parametrize("salt", SURROGATES)
def test_cache_salt_with_a_surrogate_changes_nothing(cls: type, salt: str) -> None:
    c = _cache(cls)
    before = _snapshot(c)
    events_before = None
    with pytest.raises(InvalidArgumentError):
        c.admit(7, np.arange(9, dtype=np.int32), cache_salt=salt)
    with pytest.raises(InvalidArgumentError):
        c.lookup(np.arange(9, dtype=np.int32), cache_salt=salt)
    assert _snapshot(c) == before
    assert 7 not in c
    c.check_invariants()
    assert events_before is None
    # The same prompt with a valid salt is still admitted afterwards.
    assert c.admit(7, np.arange(9, dtype=np.int32), cache_salt="ok") is not None
    c.check_invariants()


@pytest.mark.parametrize("bad", SURROGATES)
def test_every_str_parameter_refuses_surrogates(bad: str) -> None:
    toks = np.arange(8, dtype=np.int32)
    calls: list[Callable[[], object]] = [
        lambda: kvindex.block_hashes(toks, 4, algo=bad),
        lambda: kvindex.block_hashes(toks, 4, seed=bad),
        lambda: kvindex.block_hashes(toks, 4, cache_salt=bad),
        lambda: kvindex.none_hash(algo=bad),
        lambda: kvindex.none_hash(seed=bad),
        lambda: HashChainCache(8, 4, algo=bad),
        lambda: HashChainCache(8, 4, seed=bad),
        lambda: RadixPrefixCache(8, 4, policy=bad),
        lambda: RadixTree(4, policy=bad),
        lambda: EventEncoder(medium=bad),
        lambda: EventEncoder(kv_cache_spec_kind=bad),
        lambda: BlockStored([1], None, [1, 2], 2, medium=bad),
        lambda: BlockStored([1], None, [1, 2], 2, lora_name=bad),
        lambda: BlockStored([1], None, [1, 2], 2, kv_cache_spec_kind=bad),
        lambda: BlockStored([1], None, [1, 2], 2, extra_keys=[(bad,)]),
        lambda: BlockStored([1], None, [1, 2], 2, locality={"k": bad}),
        lambda: BlockStored([1], None, [1, 2], 2, session_id=bad),
        lambda: BlockRemoved([1], medium=bad),
        lambda: BlockRemoved([1], ownership=[bad]),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            call()


@pytest.mark.parametrize("bad", SURROGATES)
def test_radix_tree_namespace_with_a_surrogate_changes_nothing(bad: str) -> None:
    t = RadixTree(4, enable_events=True)
    t.insert(np.arange(8, dtype=np.int32), np.arange(8, dtype=np.int32), "ns")
    before = (t.total_size, t.num_nodes, t.clock, t.dump())
    with pytest.raises(InvalidArgumentError):
        t.match_prefix(np.arange(8, dtype=np.int32), bad)
    with pytest.raises(InvalidArgumentError):
        t.probe(np.arange(8, dtype=np.int32), bad)
    with pytest.raises(InvalidArgumentError):
        t.insert(np.arange(4, dtype=np.int32), np.arange(100, 104, dtype=np.int32), bad)
    assert (t.total_size, t.num_nodes, t.clock, t.dump()) == before
    t.check_invariants()


def test_str_parameters_refuse_non_str() -> None:
    for call in (
        lambda: HashChainCache(8, 4, algo=1),  # type: ignore[arg-type]
        lambda: RadixTree(4, policy=b"lru"),  # type: ignore[arg-type]
        lambda: kvindex.none_hash(seed=1),  # type: ignore[arg-type]
        lambda: EventEncoder(medium=1),  # type: ignore[arg-type]
    ):
        with pytest.raises(DTypeError):
            call()


def test_str_defaults_and_none_still_work() -> None:
    assert HashChainCache(8, 4).algo == "xxh3_128"
    assert RadixTree(4).policy == "lru"
    assert kvindex.none_hash() == kvindex.none_hash(algo="xxh3_128", seed=None)
    assert EventEncoder(medium=None).medium is None
    assert EventEncoder().medium == "GPU"


def _stored(**kw: Any) -> BlockStored:
    base: dict[str, Any] = dict(
        block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2
    )
    base.update(kw)
    return BlockStored(**base)


@pytest.mark.parametrize("value", HUGE, ids=repr)
@pytest.mark.parametrize(
    "field", ["block_size", "lora_id", "group_idx", "kv_cache_spec_sliding_window"]
)
def test_event_int_fields_out_of_range(field: str, value: int) -> None:
    with pytest.raises(InvalidArgumentError):
        _stored(**{field: value})


@pytest.mark.parametrize("value", HUGE, ids=repr)
def test_event_int_lists_and_encoder_ints_out_of_range(value: int) -> None:
    with pytest.raises(InvalidArgumentError):
        _stored(token_ids=[1, value])
    with pytest.raises(InvalidArgumentError):
        _stored(lookahead_token_ids=[value])
    with pytest.raises(InvalidArgumentError):
        BlockRemoved([1], group_idx=value)
    with pytest.raises(InvalidArgumentError):
        EventEncoder(data_parallel_rank=value)
    with pytest.raises(InvalidArgumentError):
        EventEncoder(group_idx=value)
    payload = EventEncoder().encode_events([], 1.0)
    with pytest.raises(InvalidArgumentError):
        decode_event_batch(payload, block_size=value)


def test_event_ints_refuse_bool_and_accept_index_objects() -> None:
    for kw in (
        {"block_size": True},
        {"lora_id": False},
        {"token_ids": [1, True]},
        {"lookahead_token_ids": [True]},
        {"token_ids": "12"},
        {"token_ids": b"12"},
    ):
        with pytest.raises(DTypeError):
            _stored(**kw)
    with pytest.raises(DTypeError):
        EventEncoder(data_parallel_rank=True)
    e = _stored(block_size=np.int64(2), token_ids=np.array([1, 2]), lora_id=np.int32(3))
    assert (e.block_size, e.token_ids, e.lora_id) == (2, [1, 2], 3)
    assert _stored(token_ids=(1, 2)) == _stored(token_ids=[1, 2])


def test_timestamps_too_large_for_a_float() -> None:
    enc = EventEncoder()
    c = HashChainCache(8, 4, enable_events=True)
    c.admit(1, np.arange(5, dtype=np.int32))
    for ts in (10**400, -(10**400)):
        with pytest.raises(InvalidArgumentError):
            enc.encode_events([], ts)
        with pytest.raises(InvalidArgumentError):
            enc.encode(c, ts)
    with pytest.raises(DTypeError):
        enc.encode_events([], True)
    # The refused encode drained nothing.
    payload = enc.encode(c, 2)
    assert payload is not None
    ts, events, _, _ = decode_event_batch(payload)
    assert ts == 2.0 and len(events) == 1
