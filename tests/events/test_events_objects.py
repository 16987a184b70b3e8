"""KV event objects: vLLM's field names, repr, ``to_dict``, pickling, equality, and the
events both cache designs put on the wire."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import kvindex
from kvindex.events import EventEncoder, decode_batch, decode_event_batch, offset_endpoint

STORED_FIELDS = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
]


def _hash_chain_events() -> list[
    kvindex.BlockStored | kvindex.BlockRemoved | kvindex.AllBlocksCleared
]:
    c = kvindex.HashChainCache(4, 2, algo="vllm_sha256_cbor", enable_events=True)
    c.admit(1, np.arange(5, dtype=np.int64), cache_salt="tenant", lora=("sql", "/p"))
    c.free(1)
    c.admit(2, np.arange(100, 106, dtype=np.int64))  # evicts the first request's blocks
    return c.take_events()


def test_cache_events_carry_vllm_fields() -> None:
    ev = _hash_chain_events()
    stored = ev[0]
    assert isinstance(stored, kvindex.BlockStored)
    assert list(stored.to_dict()) == ["type", *STORED_FIELDS]
    assert stored.medium == "GPU" and stored.group_idx == 0 and stored.lora_id is None
    assert stored.kv_cache_spec_kind == "full_attention"
    assert stored.lora_name == "sql"
    assert stored.extra_keys == [("sql", "tenant"), ("sql",)]
    assert stored.token_ids == [0, 1, 2, 3] and stored.block_size == 2
    removed = [e for e in ev if isinstance(e, kvindex.BlockRemoved)]
    assert removed and all(e.medium == "GPU" and e.group_idx == 0 for e in removed)
    assert {h for e in removed for h in e.block_hashes} <= set(stored.block_hashes)


def test_repr_names_every_attribute() -> None:
    for e in _hash_chain_events():
        r = repr(e)
        d = e.to_dict()
        assert r.startswith(d["type"] + "(")
        for k, v in d.items():
            if k != "type":
                assert f"{k}={v!r}" in r
                assert getattr(e, k) == v
    assert repr(kvindex.AllBlocksCleared()) == "AllBlocksCleared()"
    assert "num_tokens" not in repr(_hash_chain_events()[0])


def test_pickle_and_equality() -> None:
    odd = kvindex.BlockStored(
        [1, 2**64 - 1],
        -1,
        [3, -4],
        1,
        lora_id=7,
        extra_keys=[None, ("img", -3)],
        kv_cache_spec_sliding_window=128,
        locality={"rack": 3},
        session_id=b"s",
        lookahead_token_ids=[9],
    )
    assert odd.parent_block_hash == 2**64 - 1  # a signed hash keeps its 64-bit pattern
    for e in [*_hash_chain_events(), odd, kvindex.AllBlocksCleared()]:
        back = pickle.loads(pickle.dumps(e))
        assert back == e and type(back) is type(e)
        assert back.to_dict() == e.to_dict()
    assert odd != kvindex.BlockStored([1, 2**64 - 1], None, [3, -4], 1)
    assert odd != "BlockStored"
    assert odd.locality == {"rack": 3} and odd.session_id == b"s"
    # The generic encoder carries every optional field through the wire.
    back = decode_batch(EventEncoder().encode_events([odd], 0.5)).events
    assert back == [odd]


def test_constructor_rejects_bad_values() -> None:
    with pytest.raises(kvindex.InvalidArgumentError):
        kvindex.BlockRemoved([2**64])
    with pytest.raises(TypeError):
        kvindex.BlockStored([1], None, [1], 1, locality=object())
    with pytest.raises(TypeError):
        EventEncoder().encode_events([object()], 0.0)
    with pytest.raises(TypeError):
        EventEncoder().encode(object(), 0.0)  # type: ignore[arg-type]


def test_encode_drains_once_and_skips_empty_steps() -> None:
    c = kvindex.HashChainCache(8, 4, algo="vllm_sha256", enable_events=True)
    enc = EventEncoder(data_parallel_rank=3)
    assert enc.encode(c, 1.0) is None
    c.admit(1, np.arange(9, dtype=np.int64))
    payload = enc.encode(c, 1.0)
    assert payload is not None
    b = decode_batch(payload, block_size=4)
    assert b.data_parallel_rank == 3 and len(b.events) == 1
    assert enc.encode(c, 2.0) is None
    assert c.take_events() == []
    empty = enc.encode(c, 2.0, skip_empty=False)
    assert empty is not None and decode_batch(empty).events == []


def test_radix_events_are_page_granular_and_chained() -> None:
    c = kvindex.RadixPrefixCache(64, 4, enable_events=True)
    enc = EventEncoder()
    shared = np.arange(16, dtype=np.int64)
    c.admit(1, np.concatenate([shared, np.arange(100, 108)]))
    c.admit(2, np.concatenate([shared, np.arange(200, 212)]))
    for rid in (1, 2):
        c.checkpoint(rid)
    payload = enc.encode(c, 5.0)
    assert payload is not None
    events = decode_batch(payload, block_size=4).events
    stored = [e for e in events if isinstance(e, kvindex.BlockStored)]
    assert stored
    by_last = {}
    for e in stored:
        assert e.block_size == 4 and len(e.token_ids) == 4 * len(e.block_hashes)
        assert e.medium == "GPU" and e.group_idx == 0
        by_last[e.block_hashes[-1]] = e
    for e in stored:
        # Every run hangs off the root or off the last page of an earlier run.
        assert e.parent_block_hash is None or e.parent_block_hash in {
            h for s in stored for h in s.block_hashes
        }
    # The two requests' runs share the first 16 tokens' pages (one chain).
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == len(set(hashes))
    tree = kvindex.RadixCache(2, enable_events=True)
    tree.insert(np.arange(6, dtype=np.int64), np.arange(6, dtype=np.int32))
    tree.evict(6)
    payload = enc.encode(tree, 6.0)
    assert payload is not None
    kinds = [type(e).__name__ for e in decode_batch(payload, block_size=2).events]
    assert kinds == ["BlockStored", "BlockRemoved"]


def test_decode_rejects_every_truncation() -> None:
    c = kvindex.HashChainCache(8, 4, algo="vllm_sha256", enable_events=True)
    c.admit(1, np.arange(9, dtype=np.int64), lora=("a-lora", "/x"))
    payload = EventEncoder().encode(c, 1.0)
    assert payload is not None
    for n in range(len(payload)):
        with pytest.raises(kvindex.InvalidArgumentError, match="malformed KV event batch"):
            decode_event_batch(payload[:n])
    with pytest.raises(kvindex.InvalidArgumentError, match="expected block_size 16"):
        decode_event_batch(payload, block_size=16)


def test_endpoints_offset_by_data_parallel_rank() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert offset_endpoint("tcp://127.0.0.1:*", 3) == "tcp://127.0.0.1:*"


def test_import_kvindex_does_not_import_zmq() -> None:
    code = "import sys, kvindex; assert 'zmq' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_bench_events_runs_small() -> None:
    """The benchmark's two measurements run end to end (tiny sizes, figures unchecked)."""
    import bench_events

    enc = bench_events.encoding(2)
    assert enc["hashes_per_call"] == 512 * 16 and enc["rust_hashes_per_s"] > 0
    step = bench_events.step_overhead(2, 20)
    assert step["events"] > 0 and step["publisher"]["sent"] == 20


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_a_router_replaying_the_stream_stays_consistent(design: str) -> None:
    """What a KV-aware router does with the stream, for both designs: every stored run
    hangs off a hash it holds (or the root), every removed hash is one it holds, and once
    the cache is emptied nothing is left. Events go through the wire (encode, decode)."""
    rng = np.random.default_rng(7)
    cache: kvindex.HashChainCache | kvindex.RadixPrefixCache
    if design == "hash_chain":
        cache = kvindex.HashChainCache(48, 4, algo="vllm_sha256_cbor", enable_events=True)
    else:
        cache = kvindex.RadixPrefixCache(48, 4, enable_events=True)
    enc = EventEncoder()
    held: dict[int, int] = {}  # hash -> copies the router believes are cached
    stores = removes = 0

    def drain() -> None:
        nonlocal stores, removes
        payload = enc.encode(cache, 0.0)
        if payload is None:
            return
        for e in decode_batch(payload, block_size=4).events:
            if isinstance(e, kvindex.BlockStored):
                assert e.parent_block_hash is None or held.get(e.parent_block_hash, 0) > 0
                for h in e.block_hashes:
                    held[h] = held.get(h, 0) + 1
                stores += 1
            elif isinstance(e, kvindex.BlockRemoved):
                for h in e.block_hashes:
                    assert held.get(h, 0) > 0, "removed a hash the router does not hold"
                    held[h] -= 1
                removes += 1
            else:
                held.clear()

    prefixes = [rng.integers(0, 1000, 12, dtype=np.int64) for _ in range(4)]
    running: list[int] = []
    for rid in range(400):
        prompt = np.concatenate([prefixes[rng.integers(4)], rng.integers(0, 1000, 9)])
        if cache.admit(rid, prompt) is not None:
            running.append(rid)
        if len(running) > 3 or (running and rng.random() < 0.3):
            cache.free(running.pop(int(rng.integers(len(running)))))
        drain()
    for rid in running:
        cache.free(rid)
    if isinstance(cache, kvindex.HashChainCache):
        cache.evict_blocks(np.arange(1, 48, dtype=np.int64))
    else:
        cache.evict(10**9)
    drain()
    assert stores > 50 and removes > 50
    assert not any(held.values()), "hashes left after the cache was emptied"
