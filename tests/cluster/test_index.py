"""ClusterIndex fed by real caches' event batches: after every applied batch, each
worker's blocks and every prompt's overlaps equal a brute-force oracle built from the
worker's own cache state (its blocks' hashes). Plus stream faults at the API level."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex.cluster import ClusterIndex
from kvindex.events import EventEncoder

BS = 4


def low64(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


def cache_hashes(cache: kvindex.HashChainCache) -> set[int]:
    """The oracle: every block of the cache that has a hash right now."""
    out = set()
    for b in range(1, cache.num_blocks):
        h = cache.block_hash(b)
        if h is not None:
            out.add(low64(h))
    return out


def leading(held: set[int], hashes: list[int]) -> int:
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def traffic(
    rng: random.Random,
    caches: list[Any],
    ix: ClusterIndex,
    enc: EventEncoder,
    *,
    steps: int,
    p_free: float,
    p_reset: float,
    prompt: Callable[[], tuple[np.ndarray, dict[str, Any]]],
) -> Iterator[list[tuple[np.ndarray, dict[str, Any]]]]:
    """Random traffic on the caches, whose workers are slots 0.. of ``ix``: each step
    frees a running request of a random worker or admits ``prompt()`` (tokens, admit
    keywords) there, sometimes resets an idle cache, then applies that cache's events to
    the index as one batch. Yields the prompts admitted so far after each applied batch
    (the index then checked)."""
    running: list[list[int]] = [[] for _ in caches]
    seqs = [0] * len(caches)
    prompts: list[tuple[np.ndarray, dict[str, Any]]] = []
    rid = 0
    for _ in range(steps):
        w = rng.randrange(len(caches))
        cache = caches[w]
        if running[w] and rng.random() < p_free:
            cache.free(running[w].pop(rng.randrange(len(running[w]))))
        else:
            toks, kw = prompt()
            rid += 1
            if cache.admit(rid, toks, **kw) is not None:
                running[w].append(rid)
                prompts.append((toks, kw))
        if rng.random() < p_reset and not running[w]:
            cache.reset()
        payload = enc.encode(cache, 1.0)
        if payload is None:
            continue
        assert ix.apply(w, seqs[w], payload) == ("applied", -1)
        seqs[w] += 1
        ix.check_invariants()
        yield prompts


@pytest.mark.parametrize("array_tagged", [False, True])
@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256_cbor"])
def test_index_matches_each_caches_own_state(algo: str, array_tagged: bool) -> None:
    rng = random.Random(7)
    n_workers = 3
    caches = [
        kvindex.HashChainCache(24, BS, algo=algo, enable_events=True) for _ in range(n_workers)
    ]
    enc = EventEncoder(array_tagged=array_tagged)
    ix = ClusterIndex(BS, algo=algo)
    slots = [ix.add_worker(f"engine{i}", 0) for i in range(n_workers)]
    prefixes = [list(rng.randrange(100) for _ in range(12)) for _ in range(4)]

    def prompt() -> tuple[np.ndarray, dict[str, Any]]:
        toks = rng.choice(prefixes)[: rng.randrange(4, 13)]
        toks += [rng.randrange(100) for _ in range(rng.randrange(0, 9))]
        return np.array(toks, dtype=np.int64), {}

    for prompts in traffic(
        rng, caches, ix, enc, steps=150, p_free=0.45, p_reset=0.03, prompt=prompt
    ):
        oracle = [cache_hashes(c) for c in caches]
        for i in range(n_workers):
            assert set(ix.worker_blocks(slots[i]).tolist()) == oracle[i]
        for toks, _ in prompts[-5:]:
            hashes = [low64(bytes(h)) for h in kvindex.block_hashes(toks, BS, algo=algo)]
            assert ix.hashes(toks).tolist() == hashes
            want = [leading(oracle[i], hashes) for i in range(n_workers)]
            assert ix.overlaps(toks).tolist() == want
            assert ix.overlaps_for_hashes(np.array(hashes, dtype=np.uint64)).tolist() == want
    assert all(s == "live" for s in ix.statuses())
    assert ix.num_pairs == sum(len(cache_hashes(c)) for c in caches)


def stored(hashes: list[int]) -> kvindex.BlockStored:
    return kvindex.BlockStored(hashes, None, [1] * (BS * len(hashes)), BS, None, "GPU", None)


def pay(*events: kvindex.BlockStored | kvindex.BlockRemoved | kvindex.AllBlocksCleared) -> bytes:
    return EventEncoder().encode_events(list(events), 0.0)


def test_stream_faults_at_the_api() -> None:
    ix = ClusterIndex(BS)
    a, b = ix.add_worker("a"), ix.add_worker("b")
    assert ix.statuses() == ["resyncing", "resyncing"]
    p0, p1, p2 = pay(stored([1, 2])), pay(stored([3])), pay(kvindex.BlockRemoved([2], medium="GPU"))
    assert ix.apply(a, 0, p0) == ("applied", -1)
    assert ix.apply(b, 0, p0) == ("applied", -1)
    assert ix.apply(a, 2, p2) == ("gap", 1)  # not applied
    assert ix.apply(a, 1, p1) == ("applied", -1)
    assert ix.apply(a, 2, p2) == ("applied", -1)
    assert ix.apply(a, 1, p1) == ("duplicate", -1)
    assert ix.overlaps_for_hashes(np.array([1, 2], dtype=np.uint64)).tolist() == [1, 2]
    # Restart: a new stream from 0 drops a's blocks.
    assert ix.apply(a, 0, pay(stored([7]))) == ("restarted", -1)
    assert ix.worker_blocks(a).tolist() == [7]
    # Malformed: counted, degraded, b untouched; never raises.
    for bad in [b"", b"\x00", b"\x93\xcb\x00", p0[:-3], pay(stored([1]))[:-1] + b"\xc1"]:
        outcome, _ = ix.apply(a, None, bad)
        assert outcome.startswith("malformed: ")
    assert ix.status(a) == "degraded" and ix.status(b) == "live"
    assert ix.worker_blocks(b).tolist() == [1, 2]
    assert ix.worker_info(a)["malformed"] == 5
    # Unknown workers: counted, never raised.
    assert ix.apply(9, 0, p0) == ("unknown_worker", -1)
    assert ix.apply(-1, 0, p0) == ("unknown_worker", -1)
    assert ix.unknown_worker_batches == 1
    # Given-up gap: degraded until the worker clears its cache.
    assert ix.apply(b, 5, p1)[0] == "gap"
    ix.give_up(b, 5)
    assert ix.apply(b, 5, p1) == ("applied", -1)
    assert ix.status(b) == "degraded" and ix.worker_info(b)["lost"] == 4
    assert ix.apply(b, 6, pay(kvindex.AllBlocksCleared())) == ("applied", -1)
    assert ix.status(b) == "live" and ix.worker_blocks(b).tolist() == []
    # Leave and rejoin.
    ix.remove_worker(a)
    assert ix.status(a) == ""
    assert ix.add_worker("a") == a
    assert ix.worker_blocks(a).tolist() == []
    ix.check_invariants()
    with pytest.raises(kvindex.InvalidArgumentError):
        ix.remove_worker(7)
    with pytest.raises(TypeError):
        ix.overlaps_for_hashes(np.array([1], dtype=np.int64))


def test_wrong_block_size_is_malformed() -> None:
    ix = ClusterIndex(8)
    w = ix.add_worker("w")
    outcome, _ = ix.apply(w, 0, pay(stored([1])))
    assert outcome.startswith("malformed: ") and "block_size" in outcome
    assert ix.num_blocks == 0


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256", "vllm_xxhash_cbor"])
def test_queries_hash_with_the_workers_algo_seed_and_extra_keys(algo: str) -> None:
    toks = np.arange(40, dtype=np.int32)
    salt, lora, mm = "tenant-7", ("ad", "/p"), [("img", 5, 6)]
    ix = ClusterIndex(BS, algo=algo, seed="root")
    raw = kvindex.block_hashes(
        toks, BS, algo=algo, seed="root", cache_salt=salt, lora=lora, mm_items=mm
    )
    want = [low64(bytes(h)) for h in raw]
    got = ix.hashes(toks, cache_salt=salt, lora=lora, mm_items=mm)
    assert got.tolist() == want and len(want) == 10
    w = ix.add_worker("w")
    ix.store_hashes(w, got[:6])
    assert ix.overlaps(toks, cache_salt=salt, lora=lora, mm_items=mm).tolist() == [6]
    assert ix.overlaps(toks).tolist() == [0]  # no keys: another chain
    assert ix.seed == "root" and ix.algo == algo


def test_caller_errors_raise_kvindex_errors() -> None:
    ix = ClusterIndex(BS)
    w = ix.add_worker("w")
    with pytest.raises(kvindex.InvalidArgumentError):
        ix.apply(w, -1, pay(stored([1])))
    with pytest.raises(kvindex.InvalidArgumentError):
        ix.give_up(w, -5)
    with pytest.raises(kvindex.InvalidArgumentError):
        ClusterIndex(0)
    with pytest.raises(kvindex.InvalidArgumentError):
        ClusterIndex(4, algo="md5")
    with pytest.raises(kvindex.InvalidArgumentError):
        ix.route(np.arange(8, dtype=np.int32), np.zeros(3))
    assert ix.num_blocks == 0 and ix.statuses() == ["resyncing"]


def test_a_batch_for_another_dp_rank_is_rejected() -> None:
    ix = ClusterIndex(BS)
    w = ix.add_worker("w", dp_rank=2)
    bad = EventEncoder(data_parallel_rank=0).encode_events([stored([1])], 0.0)
    outcome, _ = ix.apply(w, 0, bad)
    assert outcome.startswith("malformed: ") and "data-parallel rank 0" in outcome
    good = EventEncoder(data_parallel_rank=2).encode_events([stored([1])], 0.0)
    assert ix.apply(w, 1, good) == ("applied", -1)
    assert ix.worker_blocks(w).tolist() == [1]


@pytest.mark.parametrize("namespaced", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_engines_events_give_the_caches_own_lookup(page_size: int, namespaced: bool) -> None:
    """RadixPrefixCache workers: after every applied batch (evictions and resets
    included) each worker's blocks in the index are exactly its cache's own
    ``cached_page_hashes``, and with ``algo="radix_xxh3_64"`` the index hashes a prompt as
    the tree's events do, so each worker's overlap (in tokens) equals what that cache's
    own ``lookup`` hits."""
    rng = random.Random(11 + page_size)
    n_workers = 3
    pages = 40 if page_size == 16 else 300
    caches = [
        kvindex.RadixPrefixCache(pages, page_size, enable_events=True) for _ in range(n_workers)
    ]
    enc = EventEncoder()
    ix = ClusterIndex(page_size, algo="radix_xxh3_64")
    assert ix.algo == "radix_xxh3_64"
    slots = [ix.add_worker(f"engine{i}", 0) for i in range(n_workers)]
    prefixes = [[rng.randrange(50) for _ in range(96)] for _ in range(3)]
    salts = ["tenant-a", "tenant-b"] if namespaced else [None]

    def prompt() -> tuple[np.ndarray, dict[str, Any]]:
        toks = rng.choice(prefixes)[: rng.randrange(8, 97)]
        toks += [rng.randrange(50) for _ in range(rng.randrange(0, 40))]
        return np.array(toks, dtype=np.int32), {"cache_salt": rng.choice(salts)}

    prompts: list[tuple[np.ndarray, dict[str, Any]]] = []
    for prompts in traffic(
        rng, caches, ix, enc, steps=160, p_free=0.5, p_reset=0.02, prompt=prompt
    ):
        for slot, c in zip(slots, caches, strict=True):
            assert np.array_equal(ix.worker_blocks(slot), c.cached_page_hashes())
        for toks, kw in prompts[-6:]:
            salt = kw["cache_salt"]
            # k full blocks of the prompt; lookup of k * page_size + 1 tokens counts them
            k = (len(toks) - 1) // page_size
            got = ix.overlaps(toks[: k * page_size], cache_salt=salt).tolist()
            want = [c.lookup(toks[: k * page_size + 1], cache_salt=salt) for c in caches]
            assert [g * page_size for g in got] == want
    assert any(c.stats["evictions"] for c in caches)
    assert any(len(c.cached_page_hashes()) for c in caches)
    assert max(c.lookup(t, **kw) for c in caches for t, kw in prompts) > 0
    # a namespace isolates: the same tokens under another salt are another chain
    toks, salt = prompts[-1][0], prompts[-1][1]["cache_salt"]
    other = ix.hashes(toks, cache_salt="elsewhere")
    assert not np.array_equal(ix.hashes(toks, cache_salt=salt), other)


def test_radix_query_scheme_rejects_what_the_radix_cache_rejects() -> None:
    ix = ClusterIndex(4, algo="radix_xxh3_64")
    with pytest.raises(kvindex.InvalidArgumentError, match="mm_items"):
        ix.overlaps(np.arange(8, dtype=np.int32), mm_items=[("img", 0, 4)])
    with pytest.raises(kvindex.InvalidArgumentError):
        ix.hashes(np.array([1, 2**40, 3, 4], dtype=np.int64))
    with pytest.raises(kvindex.InvalidArgumentError, match="seed"):
        ClusterIndex(4, algo="radix_xxh3_64", seed="s")
    with pytest.raises(kvindex.InvalidArgumentError, match="radix_xxh3_64"):
        ClusterIndex(4, algo="nope")
    assert len(ix.hashes(np.arange(10, dtype=np.int32))) == 2
