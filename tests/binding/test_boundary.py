"""Bad input and safety of the hash-chain cache and the hashing entry points.

Every caller error raises exactly the documented ``KvIndexError`` subclass (also
catchable as the closest builtin), never ``pyo3_runtime.PanicException``, and leaves
the cache exactly as it was: free queue order, free count, stats, request tables and
hashes, every block's ref count and hash, and no KV event emitted.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvindex
from bad_arrays import BAD_ARRAYS, BASE
from kvindex import (
    BlockInUseError,
    DTypeError,
    DuplicateRequestError,
    InvalidArgumentError,
    KvIndexError,
    UnknownRequestError,
)

BS = 4
NUM_BLOCKS = 24
# request 1: 10 tokens (3 blocks); request 2 shares its first 8 tokens (hits 2 blocks);
# request 3 was admitted and freed, so hashed free blocks sit at the free queue's tail.
P1 = np.arange(100, 110, dtype=np.int64)
P2 = np.concatenate([P1[:8], np.array([7, 7, 7, 7, 7], dtype=np.int64)])
P3 = np.arange(500, 513, dtype=np.int64)
LIVE = (1, 2)


def make_cache(algo: str = "xxh3_128") -> kvindex.HashChainCache:
    c = kvindex.HashChainCache(NUM_BLOCKS, BS, algo=algo, enable_events=True)
    assert c.admit(1, P1) is not None
    assert c.admit(2, P2).num_cached_tokens == 8
    assert c.admit(3, P3) is not None
    c.free(3)
    assert c.append(1, np.array([1, 2, 3], dtype=np.int64))
    c.take_events()
    c.check_invariants()
    return c


@pytest.fixture
def cache() -> kvindex.HashChainCache:
    return make_cache()


def snapshot(c: kvindex.HashChainCache) -> dict:
    reqs = {}
    for r in (1, 2, 3, 4, 5, 99):
        if r in c:
            reqs[r] = (
                c.num_tokens(r),
                c.request_blocks(r).tolist(),
                c.request_block_hashes(r).tobytes(),
            )
    return {
        "free_queue": c.free_queue().tolist(),
        "num_free": c.num_free_blocks,
        "usage": c.usage,
        "num_requests": c.num_requests,
        "num_cached_blocks": c.num_cached_blocks,
        "stats": dict(c.stats),
        "reqs": reqs,
        "blocks": [(c.ref_count(b), c.block_hash(b)) for b in range(c.num_blocks)],
        "lookups": (c.lookup(P1), c.lookup(P2), c.lookup(P3)),
    }


def assert_raises(exc: type, builtin: type, fn, *args, **kwargs) -> BaseException:
    """fn(*args) raises exactly ``exc`` (a KvIndexError and a ``builtin``), never a panic."""
    try:
        fn(*args, **kwargs)
    except BaseException as e:
        assert type(e).__name__ != "PanicException", f"panic crossed into Python: {e}"
        assert type(e) is exc, (
            f"expected {exc.__name__}, got {type(e).__module__}.{type(e).__name__}: {e}"
        )
        assert isinstance(e, KvIndexError)
        assert isinstance(e, builtin)
        assert str(e), "error message is empty"
        return e
    pytest.fail(f"expected {exc.__name__}, nothing was raised")


def expect_unchanged(
    c: kvindex.HashChainCache, exc: type, builtin: type, fn, *args, **kwargs
) -> None:
    c.take_events()
    before = snapshot(c)
    assert_raises(exc, builtin, fn, *args, **kwargs)
    assert snapshot(c) == before
    assert c.take_events() == []
    c.check_invariants()


# ---------------------------------------------------------------------------------------
# Token arrays
# ---------------------------------------------------------------------------------------

TOKEN_ENTRY_POINTS = {
    "admit": lambda c, t: c.admit(50, t),
    "lookup": lambda c, t: c.lookup(t),
    "append": lambda c, t: c.append(1, t),
    "append_batch": lambda c, t: c.append_batch(np.array([1], dtype=np.int64), t),
    "append_batch_offsets": lambda c, t: c.append_batch(
        np.array([1, 2], dtype=np.int64), t, np.array([0, 6, 12], dtype=np.int64)
    ),
    "block_hashes": lambda c, t: kvindex.block_hashes(t, BS),
    "block_hashes_vllm": lambda c, t: kvindex.block_hashes(t, BS, algo="vllm_sha256"),
}


# block_hashes is off the hot path: it takes lists and tuples too (test_sequence_args.py).
SEQUENCE_OK = {("list", "block_hashes"), ("tuple", "block_hashes")}


@pytest.mark.parametrize(
    ("bad", "entry"),
    [
        (bad, entry)
        for bad in sorted(BAD_ARRAYS)
        for entry in sorted(TOKEN_ENTRY_POINTS)
        if (bad, entry.removesuffix("_vllm")) not in SEQUENCE_OK
    ],
)
def test_bad_token_arrays(cache, entry, bad):
    arr = BAD_ARRAYS[bad]
    copy = arr.copy() if isinstance(arr, np.ndarray) else arr
    expect_unchanged(cache, DTypeError, TypeError, TOKEN_ENTRY_POINTS[entry], cache, arr)
    if isinstance(arr, np.ndarray):
        assert np.array_equal(arr, copy)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_empty_prompt(cache, dtype):
    expect_unchanged(
        cache, InvalidArgumentError, ValueError, cache.admit, 50, np.array([], dtype=dtype)
    )
    # not an error where an empty input has a meaning
    assert cache.lookup(np.array([], dtype=dtype)) == 0
    assert kvindex.block_hashes(np.array([], dtype=dtype), BS).shape == (0, 16)
    assert cache.append(1, np.array([], dtype=dtype)) is True


def test_bad_id_arrays(cache):
    ids32 = np.array([1], dtype=np.int32)
    one = np.array([5], dtype=np.int64)
    for fn in (
        lambda: cache.append_batch(ids32, one),
        lambda: cache.free_batch(ids32),
        lambda: cache.block_tables(ids32),
        lambda: cache.slot_mapping(ids32, np.array([1], dtype=np.int64)),
        lambda: cache.slot_mapping(np.array([1], dtype=np.int64), np.array([1], dtype=np.int32)),
        lambda: cache.append_batch(
            np.array([1, 2], dtype=np.int64), np.arange(4), np.array([0, 2, 4], dtype=np.int32)
        ),
        lambda: cache.free_batch([1, 2]),
        lambda: cache.free_batch(np.array([[1, 2]], dtype=np.int64)),
        lambda: cache.evict_blocks(np.array([5.0])),
        lambda: cache.evict_blocks("12"),
    ):
        expect_unchanged(cache, DTypeError, TypeError, fn)
    for fn in (
        lambda: cache.append_batch(np.array([-1], dtype=np.int64), one),
        lambda: cache.free_batch(np.array([1, -2], dtype=np.int64)),
        lambda: cache.block_tables(np.array([-1], dtype=np.int64)),
        lambda: cache.slot_mapping(np.array([-1], dtype=np.int64), np.array([1], dtype=np.int64)),
    ):
        expect_unchanged(cache, InvalidArgumentError, ValueError, fn)


# ---------------------------------------------------------------------------------------
# Constructors and pure functions
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [0, -1, -(2**40), 2**20 + 1])
def test_bad_block_size(block_size):
    assert_raises(InvalidArgumentError, ValueError, kvindex.HashChainCache, 16, block_size)
    assert_raises(InvalidArgumentError, ValueError, kvindex.block_hashes, BASE, block_size)


@pytest.mark.parametrize("num_blocks", [1, 0, -1, -(2**40), 2**40])
def test_bad_num_blocks(num_blocks):
    assert_raises(InvalidArgumentError, ValueError, kvindex.HashChainCache, num_blocks, 16)


def test_smallest_valid_sizes():
    c = kvindex.HashChainCache(2, 1)
    assert c.num_free_blocks == 1
    assert c.admit(1, np.array([5], dtype=np.int64)).block_ids.tolist() == [1]
    assert c.admit(2, np.array([6], dtype=np.int64)) is None
    c.check_invariants()
    assert kvindex.block_hashes(BASE, 2**20).shape == (0, 16)


@pytest.mark.parametrize(
    "algo", ["", "md5", "SHA256", "xxhash", "sha256_cbor", "xxhash_cbor", "vllm_sha256 ", "builtin"]
)
def test_unknown_algo(algo):
    assert_raises(InvalidArgumentError, ValueError, kvindex.HashChainCache, 16, 4, algo=algo)
    assert_raises(InvalidArgumentError, ValueError, kvindex.block_hashes, BASE, 4, algo=algo)
    assert_raises(InvalidArgumentError, ValueError, kvindex.none_hash, algo=algo)


def test_known_algos_all_construct():
    for algo in kvindex.HASH_ALGOS:
        c = kvindex.HashChainCache(8, 4, algo=algo)
        assert c.algo == algo


# ---------------------------------------------------------------------------------------
# Request ids
# ---------------------------------------------------------------------------------------

UNKNOWN_ID_CALLS = {
    "free": lambda c: c.free(99),
    "append": lambda c: c.append(99, np.array([1], dtype=np.int64)),
    "num_tokens": lambda c: c.num_tokens(99),
    "request_blocks": lambda c: c.request_blocks(99),
    "request_block_hashes": lambda c: c.request_block_hashes(99),
    "block_tables": lambda c: c.block_tables(np.array([1, 99], dtype=np.int64)),
    "slot_mapping": lambda c: c.slot_mapping(
        np.array([1, 99], dtype=np.int64), np.array([1, 1], dtype=np.int64)
    ),
    "free_batch_middle": lambda c: c.free_batch(np.array([1, 99, 2], dtype=np.int64)),
    "append_batch_middle": lambda c: c.append_batch(
        np.array([1, 99, 2], dtype=np.int64), np.array([1, 2, 3], dtype=np.int64)
    ),
    "append_batch_middle_offsets": lambda c: c.append_batch(
        np.array([1, 99, 2], dtype=np.int64),
        np.arange(9, dtype=np.int64),
        np.array([0, 4, 5, 9], dtype=np.int64),
    ),
    "freed_request": lambda c: c.free(3),
    "append_to_freed": lambda c: c.append(3, np.array([1], dtype=np.int64)),
}


@pytest.mark.parametrize("call", sorted(UNKNOWN_ID_CALLS))
def test_unknown_request(cache, call):
    expect_unchanged(cache, UnknownRequestError, KeyError, UNKNOWN_ID_CALLS[call], cache)


def test_unknown_request_message_is_not_quoted(cache):
    e = assert_raises(UnknownRequestError, KeyError, cache.free, 99)
    assert str(e).startswith("unknown request id 99")


def test_duplicate_request(cache):
    expect_unchanged(cache, DuplicateRequestError, ValueError, cache.admit, 1, P1)
    expect_unchanged(cache, DuplicateRequestError, ValueError, cache.admit, 2, P3)
    expect_unchanged(
        cache, DuplicateRequestError, ValueError, cache.admit, 1, np.arange(200, dtype=np.int32)
    )


def test_double_free_and_append_after_free(cache):
    cache.free(2)
    expect_unchanged(cache, UnknownRequestError, KeyError, cache.free, 2)
    expect_unchanged(
        cache, UnknownRequestError, KeyError, cache.append, 2, np.array([1], dtype=np.int64)
    )
    expect_unchanged(
        cache,
        UnknownRequestError,
        KeyError,
        cache.append_batch,
        np.array([2], dtype=np.int64),
        np.array([1], dtype=np.int64),
    )
    expect_unchanged(
        cache, UnknownRequestError, KeyError, cache.free_batch, np.array([2], dtype=np.int64)
    )
    # the id can be reused after being freed
    assert cache.admit(2, P2) is not None
    cache.check_invariants()


@pytest.mark.parametrize("rid", [-1, -(2**63), 2**64, 2**70])
def test_out_of_range_request_id(cache, rid):
    for fn in (
        lambda: cache.admit(rid, P3),
        lambda: cache.free(rid),
        lambda: cache.append(rid, np.array([1], dtype=np.int64)),
        lambda: cache.num_tokens(rid),
        lambda: cache.request_blocks(rid),
    ):
        expect_unchanged(cache, InvalidArgumentError, ValueError, fn)


@pytest.mark.parametrize("rid", [True, False, 1.0, "1", None, b"1", [1]])
def test_non_int_request_id(cache, rid):
    for fn in (
        lambda: cache.admit(rid, P3),
        lambda: cache.free(rid),
        lambda: cache.append(rid, np.array([1], dtype=np.int64)),
        lambda: cache.num_tokens(rid),
    ):
        expect_unchanged(cache, DTypeError, TypeError, fn)


def test_numpy_int_request_id_accepted(cache):
    assert cache.num_tokens(np.int64(1)) == 13
    assert cache.admit(np.int32(7), P3) is not None
    assert 7 in cache
    cache.free(np.uint64(7))


def test_max_request_id(cache):
    big = 2**64 - 1
    assert cache.admit(big, P3) is not None
    assert cache.num_tokens(big) == len(P3)
    cache.free(big)
    cache.check_invariants()


# ---------------------------------------------------------------------------------------
# Batches: all or nothing
# ---------------------------------------------------------------------------------------


def test_append_batch_repeated_id(cache):
    ids = np.array([1, 2, 1], dtype=np.int64)
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.append_batch,
        ids,
        np.array([4, 5, 6], dtype=np.int64),
    )
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.append_batch,
        ids,
        np.arange(12, dtype=np.int64),
        np.array([0, 4, 8, 12], dtype=np.int64),
    )
    # a valid batch still works afterwards (no stale duplicate-detection state)
    assert cache.append_batch(np.array([2, 1], dtype=np.int64), np.array([4, 5], dtype=np.int64))
    assert cache.append_batch(np.array([1, 2], dtype=np.int64), np.array([4, 5], dtype=np.int64))
    cache.check_invariants()


@pytest.mark.parametrize(
    "offsets",
    [
        [0, 3],  # too short
        [0, 3, 6, 6],  # too long
        [1, 3, 6],  # does not start at 0
        [0, 3, 5],  # does not end at len(tokens)
        [0, 3, 7],  # past the end
        [0, 4, 3],  # decreasing and wrong end
        [5, 4, 6],  # does not start at 0, decreasing
        [0, -1, 6],  # negative, decreasing
        [-1, 3, 6],
        [],
    ],
)
def test_append_batch_bad_offsets(cache, offsets):
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.append_batch,
        np.array([1, 2], dtype=np.int64),
        np.arange(6, dtype=np.int64),
        np.array(offsets, dtype=np.int64),
    )


def test_append_batch_decreasing_offsets(cache):
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.append_batch,
        np.array([1, 2, 1000], dtype=np.int64),
        np.arange(6, dtype=np.int64),
        np.array([0, 4, 2, 6], dtype=np.int64),
    )


def test_append_batch_token_count_without_offsets(cache):
    for n in (0, 1, 3):
        expect_unchanged(
            cache,
            InvalidArgumentError,
            ValueError,
            cache.append_batch,
            np.array([1, 2], dtype=np.int64),
            np.arange(n, dtype=np.int64),
        )


def test_free_batch_repeated_id(cache):
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.free_batch,
        np.array([1, 2, 1], dtype=np.int64),
    )


def test_append_batch_shortfall_is_false_and_unchanged():
    c = kvindex.HashChainCache(6, 2, enable_events=True)
    c.admit(1, np.arange(3, dtype=np.int64))  # 2 blocks
    c.admit(2, np.arange(10, 13, dtype=np.int64))  # 2 blocks; 1 free left
    c.take_events()
    before = snapshot(c)
    # each request needs 1 more block at its 5th token: 2 needed, 1 free
    assert (
        c.append_batch(
            np.array([1, 2], dtype=np.int64), np.arange(4, dtype=np.int64), np.array([0, 2, 4])
        )
        is False
    )
    assert snapshot(c) == before and c.take_events() == []
    assert c.append(1, np.arange(2, dtype=np.int64)) is True
    c.check_invariants()


# ---------------------------------------------------------------------------------------
# Eviction and reset
# ---------------------------------------------------------------------------------------


def _idle_hashed_block(c) -> int:
    for b in c.free_queue().tolist():
        if c.block_hash(b) is not None:
            return b
    raise AssertionError("fixture has no idle hashed block")


def test_evict_in_use_block(cache):
    in_use = int(cache.request_blocks(1)[0])
    idle = _idle_hashed_block(cache)
    for ids in ([in_use], [idle, in_use], [in_use, idle]):
        for arr in (np.array(ids, dtype=np.int64), np.array(ids, dtype=np.int32), ids):
            expect_unchanged(cache, BlockInUseError, RuntimeError, cache.evict_blocks, arr)
    assert cache.block_hash(idle) is not None


@pytest.mark.parametrize("bad", [0, -1, NUM_BLOCKS, NUM_BLOCKS + 1, 2**31, 2**63 - 1, -(2**63)])
def test_evict_bad_block_id(cache, bad):
    idle = _idle_hashed_block(cache)
    for ids in ([bad], [idle, bad]):
        expect_unchanged(
            cache,
            InvalidArgumentError,
            ValueError,
            cache.evict_blocks,
            np.array(ids, dtype=np.int64),
        )
    assert cache.block_hash(idle) is not None


def test_evict_idle_ok(cache):
    idle = _idle_hashed_block(cache)
    assert cache.evict_blocks(np.array([idle, idle], dtype=np.int64)) == 1
    assert cache.block_hash(idle) is None
    assert cache.evict_blocks(np.array([], dtype=np.int64)) == 0
    cache.check_invariants()


def test_reset_while_in_use(cache):
    expect_unchanged(cache, BlockInUseError, RuntimeError, cache.reset)
    cache.free(1)
    expect_unchanged(cache, BlockInUseError, RuntimeError, cache.reset)
    cache.free(2)
    cache.reset()
    assert cache.num_cached_blocks == 0
    cache.check_invariants()


# ---------------------------------------------------------------------------------------
# Extra keys
# ---------------------------------------------------------------------------------------

BAD_MM = {
    "unsorted": [("a", 5, 1), ("b", 1, 1)],
    "overlapping": [("a", 1, 5), ("b", 3, 1)],
    "same-offset": [("a", 2, 1), ("b", 2, 1)],
    "negative-offset": [("a", -1, 3)],
    "zero-length": [("a", 1, 0)],
    "negative-length": [("a", 1, -2)],
    "overflow": [("a", 2**63 - 1, 2)],
    "pair": [("a", 1)],
    "quad": [("a", 1, 2, 3)],
    "int-identifier": [(1, 1, 1)],
    "bytes-identifier": [(b"a", 1, 1)],
    "float-offset": [("a", 1.5, 1)],
    "not-a-sequence": 5,
    "bare-tuple": ("a", 1, 1),
}


@pytest.mark.parametrize("bad", sorted(BAD_MM))
def test_bad_mm_items(cache, bad):
    mm = BAD_MM[bad]
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.admit, 50, P3, mm_items=mm)
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.lookup, P3, mm_items=mm)
    assert_raises(InvalidArgumentError, ValueError, kvindex.block_hashes, P3, BS, mm_items=mm)


@pytest.mark.parametrize("lora", [("x",), ("x", "y", "z"), "xy", ("x", 1), (None, "p"), 5, ()])
def test_bad_lora(cache, lora):
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.admit, 50, P3, lora=lora)
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.lookup, P3, lora=lora)
    assert_raises(InvalidArgumentError, ValueError, kvindex.block_hashes, P3, BS, lora=lora)


def test_valid_extra_key_edge_cases(cache):
    """Items past the prompt end, touching items and zero-offset items are valid."""
    mm = [("a", 0, 1), ("b", 1, 3), ("c", 4, 1000)]
    assert cache.admit(50, P3, mm_items=mm, lora=("", "p"), cache_salt="") is not None
    cache.check_invariants()


# ---------------------------------------------------------------------------------------
# Tables, slot mapping, introspection
# ---------------------------------------------------------------------------------------


def test_block_tables_bad_arguments(cache):
    ids = np.array([1, 2], dtype=np.int64)
    w = cache.block_tables(ids).shape[1]
    assert w == 4
    for fn, exc, builtin in [
        (lambda: cache.block_tables(ids, max_blocks=w - 1), InvalidArgumentError, ValueError),
        (lambda: cache.block_tables(ids, max_blocks=0), InvalidArgumentError, ValueError),
        (lambda: cache.block_tables(ids, max_blocks=-1), InvalidArgumentError, ValueError),
        (
            lambda: cache.block_tables(ids, out=np.zeros((2, w - 1), np.int32)),
            InvalidArgumentError,
            ValueError,
        ),
        (
            lambda: cache.block_tables(ids, max_blocks=w, out=np.zeros((2, w + 1), np.int32)),
            InvalidArgumentError,
            ValueError,
        ),
        (
            lambda: cache.block_tables(ids, max_blocks=w, out=np.zeros((3, w), np.int32)),
            InvalidArgumentError,
            ValueError,
        ),
        (
            lambda: cache.block_tables(ids, out=np.zeros((2, 2 * w), np.int32)[:, ::2]),
            InvalidArgumentError,
            ValueError,
        ),
        (
            lambda: cache.block_tables(ids, out=np.zeros((w, 2), np.int32).T),
            InvalidArgumentError,
            ValueError,
        ),
        (lambda: cache.block_tables(ids, out=np.zeros((2, w), np.int64)), DTypeError, TypeError),
        (lambda: cache.block_tables(ids, out=np.zeros((2, w), np.uint32)), DTypeError, TypeError),
        (lambda: cache.block_tables(ids, out=np.zeros(2 * w, np.int32)), DTypeError, TypeError),
        (lambda: cache.block_tables(ids, out=[[0] * w] * 2), DTypeError, TypeError),
    ]:
        expect_unchanged(cache, exc, builtin, fn)


def test_block_tables_read_only_out(cache):
    ids = np.array([1, 2], dtype=np.int64)
    out = np.full((2, 4), -7, dtype=np.int32)
    out.setflags(write=False)
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.block_tables, ids, out=out)
    assert (out == -7).all()


def test_block_tables_out_untouched_on_error(cache):
    out = np.full((2, 4), -7, dtype=np.int32)
    expect_unchanged(
        cache,
        UnknownRequestError,
        KeyError,
        cache.block_tables,
        np.array([1, 99], dtype=np.int64),
        out=out,
    )
    assert (out == -7).all()
    out2 = np.full((2, 2), -7, dtype=np.int32)
    expect_unchanged(
        cache,
        InvalidArgumentError,
        ValueError,
        cache.block_tables,
        np.array([1, 2], dtype=np.int64),
        out=out2,
    )
    assert (out2 == -7).all()
    # and the happy path fills every entry, padding with the null block
    out3 = np.full((2, 6), -7, dtype=np.int32)
    got = cache.block_tables(np.array([2, 1], dtype=np.int64), out=out3)
    assert got is out3 or np.shares_memory(got, out3)
    assert out3[0].tolist() == cache.request_blocks(2).tolist() + [0, 0]
    assert out3[1].tolist() == cache.request_blocks(1).tolist() + [0, 0]


_HUGE_WIDTH_SCRIPT = """
import numpy as np, kvindex
c = kvindex.HashChainCache(8, 4)
c.admit(1, np.arange(5, dtype=np.int64))
try:
    c.block_tables(np.array([1], dtype=np.int64), max_blocks=2**62)
except BaseException as e:
    print("RAISED", type(e).__name__)
else:
    print("RAISED nothing")
c.check_invariants()
"""


def test_block_tables_huge_width_is_not_a_panic():
    # in a subprocess: the panic also leaves numpy's error set, reported later as unraisable
    r = subprocess.run(
        [sys.executable, "-c", _HUGE_WIDTH_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] in {"InvalidArgumentError", "MemoryError", "ValueError"}, r.stdout


def test_slot_mapping_bad_arguments(cache):
    ids = np.array([1, 2], dtype=np.int64)
    for q in ([14, 1], [1, 14], [-1, 1], [1, -(2**63)], [2**62, 1]):
        expect_unchanged(
            cache,
            InvalidArgumentError,
            ValueError,
            cache.slot_mapping,
            ids,
            np.array(q, dtype=np.int64),
        )
    for q in ([1], [1, 1, 1], []):
        expect_unchanged(
            cache,
            InvalidArgumentError,
            ValueError,
            cache.slot_mapping,
            ids,
            np.array(q, dtype=np.int64),
        )
    # edge: a query of the whole request is fine
    assert len(cache.slot_mapping(ids, np.array([13, 13], dtype=np.int64))) == 26
    assert len(cache.slot_mapping(ids, np.array([0, 0], dtype=np.int64))) == 0


@pytest.mark.parametrize("bid", [-1, NUM_BLOCKS, NUM_BLOCKS + 100, 2**31, -(2**63)])
def test_block_introspection_out_of_range(cache, bid):
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.block_hash, bid)
    expect_unchanged(cache, InvalidArgumentError, ValueError, cache.ref_count, bid)


def test_null_block_introspection(cache):
    assert cache.block_hash(0) is None
    assert cache.ref_count(0) == 0
    assert 0 not in cache.free_queue().tolist()


# ---------------------------------------------------------------------------------------
# Token values and zero-copy
# ---------------------------------------------------------------------------------------


I32_MIN, I32_MAX = -(2**31), 2**31 - 1


@pytest.mark.parametrize("algo", kvindex.HASH_ALGOS)
def test_int32_extreme_and_negative_tokens_accepted(algo):
    # Token ids anywhere in int32 (negative ones included) are keys like any other.
    t = np.array([-1, I32_MIN, I32_MAX, 0, 2**30, -(2**30), 5, 6, 7], dtype=np.int64)
    c = kvindex.HashChainCache(8, 4, algo=algo)
    adm = c.admit(1, t)
    assert adm is not None
    assert np.array_equal(c.request_block_hashes(1), kvindex.block_hashes(t, 4, algo=algo))
    assert c.append(1, np.array([I32_MIN] * 3, dtype=np.int64))
    assert np.array_equal(
        c.request_block_hashes(1),
        kvindex.block_hashes(np.concatenate([t, [I32_MIN] * 3]), 4, algo=algo),
    )
    c.free(1)
    assert c.lookup(t) == 8
    c.check_invariants()


BEYOND_INT32 = [2**31, I32_MIN - 1, 2**40, 2**63 - 1, -(2**63)]


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
@pytest.mark.parametrize("bad", BEYOND_INT32)
def test_both_caches_reject_token_ids_beyond_int32(design, bad):
    # One rule for both caches: token ids index a vocabulary, so they fit in int32.
    c = kvindex.make_cache(design, 16, 4)
    assert c.admit(1, np.arange(6, dtype=np.int64)) is not None

    def state():
        return (c.stats, c.num_free_blocks, c.block_tables(np.array([1])).tolist(), c.num_tokens(1))

    before = state()
    prompt = np.array([1, 2, 3, bad, 5], dtype=np.int64)
    for call in (
        lambda: c.admit(2, prompt),
        lambda: c.lookup(prompt),
        lambda: c.append(1, np.array([bad], dtype=np.int64)),
        lambda: c.append_batch(np.array([1]), np.array([7, bad], dtype=np.int64), np.array([0, 2])),
    ):
        with pytest.raises(InvalidArgumentError, match=f"token id {bad} does not fit in int32"):
            call()
        assert state() == before
        assert 2 not in c
        c.check_invariants()
    # block_hashes, vLLM's hashing on its own, hashes any int64 as vLLM hashes any int.
    assert kvindex.block_hashes(np.array([bad] * 4, dtype=np.int64), 4).shape[0] == 1


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
@pytest.mark.parametrize("bs", [1, 4])
def test_prompt_larger_than_the_pool_raises_request_too_large(design, bs):
    # 9 blocks, 8 usable: 8 blocks' worth of prompt can wait for room (None while held),
    # one token more can never be admitted: an error, not None, and nothing changes.
    c = kvindex.make_cache(design, 9, bs)
    fits = np.arange(8 * bs, dtype=np.int32)
    assert c.admit(1, np.arange(1000, 1000 + bs, dtype=np.int32)) is not None
    assert c.admit(2, fits) is None  # not now: request 1 holds a block
    before = (c.stats, c.num_free_blocks, c.num_requests)
    too_big = np.arange(8 * bs + 1, dtype=np.int64)
    with pytest.raises(kvindex.RequestTooLargeError, match="never be admitted") as ei:
        c.admit(3, too_big)
    assert isinstance(ei.value, kvindex.CapacityError) and isinstance(ei.value, MemoryError)
    assert f"needs 9 {'blocks' if design == 'hash_chain' else 'pages'}" in str(ei.value)
    assert (c.stats, c.num_free_blocks, c.num_requests) == before and 3 not in c
    c.check_invariants()
    c.free(1)
    assert c.admit(2, fits) is not None  # the largest prompt the pool holds


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_admit_returns_fresh_block_ids_and_leaves_tokens_alone(dtype):
    c = kvindex.HashChainCache(32, 4)
    t = np.arange(30, dtype=dtype)
    t_copy = t.copy()
    adm = c.admit(1, t)
    assert t.flags.writeable and np.array_equal(t, t_copy)
    ids = adm.block_ids
    assert (
        isinstance(ids, np.ndarray)
        and ids.dtype == np.int32
        and ids.ndim == 1
        and ids.flags.c_contiguous
    )
    assert ids.tolist() == c.request_blocks(1).tolist()
    num_cached, ids2 = adm  # unpacks like a tuple
    assert num_cached == adm.num_cached_tokens == 0 and ids2 is ids
    # a fresh array: writing to it does not touch the cache, and it shares no memory
    rb = c.request_blocks(1)
    assert not np.shares_memory(ids, rb)
    if ids.flags.writeable:
        ids[:] = 0
        assert c.request_blocks(1).tolist() == rb.tolist()
    adm2 = c.admit(2, t)
    assert adm2.num_cached_tokens == 28
    assert not np.shares_memory(adm2.block_ids, adm.block_ids)
    # tokens untouched by every entry point, and still writeable afterwards
    c.lookup(t)
    c.append(1, t[:5])
    c.append_batch(np.array([1, 2], dtype=np.int64), t[:2])
    kvindex.block_hashes(t, 4)
    assert np.array_equal(t, t_copy)
    t[0] = 99  # not left borrowed
    c.check_invariants()


def test_read_only_tokens_accepted():
    t = np.arange(20, dtype=np.int64)
    t.setflags(write=False)
    c = kvindex.HashChainCache(16, 4)
    assert c.admit(1, t) is not None
    assert c.lookup(t) == 16
    assert c.append(1, t[:3])
    assert kvindex.block_hashes(t, 4).shape == (5, 16)


def test_none_means_default_for_optional_arguments(cache):
    assert cache.admit(50, P3, cache_salt=None, lora=None, mm_items=None) is not None
    assert cache.append_batch(np.array([50], dtype=np.int64), np.array([1], dtype=np.int64), None)
    cache.check_invariants()


# ---------------------------------------------------------------------------------------
# Fuzz: arbitrary junk arguments never panic, and a failing call changes nothing
# ---------------------------------------------------------------------------------------

_JUNK = st.sampled_from(
    [
        None,
        True,
        0,
        1,
        2,
        3,
        99,
        -1,
        2**63,
        2**64,
        1.5,
        "x",
        b"x",
        (),
        [],
        ("a", "b"),
        [("a", 1, 1)],
        np.array([], dtype=np.int64),
        np.array([1], dtype=np.int64),
        np.array([1, 2], dtype=np.int64),
        np.array([0, 1, 2], dtype=np.int64),
        np.array([1, 2], dtype=np.int32),
        np.array([-1], dtype=np.int64),
        np.arange(6, dtype=np.int64)[::2],
        np.zeros((2, 2), dtype=np.int32),
        np.zeros((2, 4), dtype=np.int32),
        np.array([1.0]),
        np.array(["a"]),
        np.array([NUM_BLOCKS], dtype=np.int64),
        P1,
        P3,
    ]
)

_METHODS = [
    ("admit", 2),
    ("lookup", 1),
    ("append", 2),
    ("append_batch", 2),
    ("append_batch", 3),
    ("free", 1),
    ("free_batch", 1),
    ("evict_blocks", 1),
    ("block_tables", 1),
    ("block_tables", 2),
    ("block_tables", 3),
    ("slot_mapping", 2),
    ("num_tokens", 1),
    ("request_blocks", 1),
    ("request_block_hashes", 1),
    ("block_hash", 1),
    ("ref_count", 1),
]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_METHODS), st.lists(_JUNK, min_size=3, max_size=3))
def test_junk_arguments_never_panic(method, args):
    name, arity = method
    c = make_cache()
    before = snapshot(c)
    try:
        getattr(c, name)(*args[:arity])
    except BaseException as e:
        assert type(e).__name__ != "PanicException", f"{name}{tuple(args[:arity])!r}: panic {e}"
        assert isinstance(e, (KvIndexError, TypeError, OverflowError)), f"{name}: {type(e)} {e}"
        assert snapshot(c) == before, (
            f"{name}{tuple(args[:arity])!r} raised {e!r} but changed state"
        )
        assert c.take_events() == []
    c.check_invariants()
