"""Reliability of the binding under adversarial inputs, for every class that takes them:
fallible output allocation, injective cache keys, one integer rule, arguments that run
Python code (and release the GIL), bounded KV event buffers, and radix node handles
that belong to one tree."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvindex
from kvindex import (
    DTypeError,
    InvalidArgumentError,
    KvIndexError,
    StaleHandleError,
)
from kvindex.sizing import SizingError, kv_budget_bytes, kv_bytes_per_token, kv_pool_size

DESIGNS = ["hash_chain", "radix"]


def make(design: str, num_blocks: int = 64, block_size: int = 16, **kw: Any) -> Any:
    if design == "hash_chain":
        return kvindex.HashChainCache(num_blocks, block_size, **kw)
    return kvindex.RadixPrefixCache(num_blocks, block_size, **kw)


# ------------------------------------------------------------ output allocation failure

_ALLOC_SCRIPT = """
import resource, sys
import numpy as np, kvindex
design, call = sys.argv[1], sys.argv[2]
c = (kvindex.HashChainCache if design == "hash_chain" else kvindex.RadixPrefixCache)(64, 16)
assert c.admit(1, np.arange(512, dtype=np.int32)) is not None
limit = 3 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    if call == "slot_mapping":
        c.slot_mapping(np.full(2**22, 1, np.int64), np.full(2**22, 512, np.int64))
    elif call == "block_tables":
        c.block_tables(np.full(2**25, 1, np.int64), max_blocks=64)
    else:  # 2**27 SHA-256 hashes: 4 GiB of output
        kvindex.block_hashes(np.zeros(2**27, np.int32), 1, algo="sha256")
except BaseException as e:
    ok = isinstance(e, kvindex.CapacityError), isinstance(e, MemoryError)
    print("RAISED", type(e).__name__, *ok)
else:
    print("RAISED nothing")
c.check_invariants()
assert c.num_tokens(1) == 512
print("USABLE", c.slot_mapping(np.array([1], np.int64), np.array([2], np.int64)).tolist())
"""


@pytest.mark.parametrize(
    ("design", "call"),
    [(d, c) for d in DESIGNS for c in ("slot_mapping", "block_tables")]
    + [("hash_chain", "block_hashes")],
)
def test_output_too_large_is_capacity_error(design: str, call: str) -> None:
    # In a child under an address-space limit: the 16 GiB slot mapping (or 8 GiB block
    # table) of repeated request ids must raise CapacityError, not abort or panic.
    r = subprocess.run(
        [sys.executable, "-c", _ALLOC_SCRIPT, design, call],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "RAISED CapacityError True True", r.stdout + r.stderr[-2000:]
    assert lines[1].startswith("USABLE [")


# ------------------------------------------------------------ key injectivity

_ADVERSARIAL = st.one_of(
    st.sampled_from(
        ["", "a", "b", "\x1f", "\x1e", "salt=", "lora=", "-", ":", "0:", "S1:x", "é", "\x00"]
    ),
    st.text(alphabet=st.sampled_from("ab:\x1f\x1e=-S0L1é\x00"), max_size=6),
    st.text(max_size=300).map(lambda s: s * 2),
)
_LORA = st.one_of(st.none(), st.tuples(_ADVERSARIAL, _ADVERSARIAL))
_SALT = st.one_of(st.none(), _ADVERSARIAL)


def _canon(lora: tuple[str, str] | None, salt: str | None) -> tuple[object, object]:
    # An empty salt is no salt (as in vLLM); everything else is a distinct key.
    return (lora, salt or None)


PROMPT = np.arange(1000, 1040, dtype=np.int32)


@pytest.mark.parametrize("design", DESIGNS)
@settings(max_examples=150)
@given(a=st.tuples(_LORA, _SALT), b=st.tuples(_LORA, _SALT))
def test_keys_never_share_blocks(design: str, a: tuple[Any, Any], b: tuple[Any, Any]) -> None:
    c = make(design, num_blocks=32, block_size=4)
    assert c.admit(1, PROMPT, lora=a[0], cache_salt=a[1]) is not None
    c.free(1)  # the radix cache inserts at free
    same = _canon(*a) == _canon(*b)
    want = 36 if same else 0
    assert c.lookup(PROMPT, lora=b[0], cache_salt=b[1]) == want
    adm = c.admit(2, PROMPT, lora=b[0], cache_salt=b[1])
    assert adm is not None and adm.num_cached_tokens == want
    c.free(2)
    c.check_invariants()


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((("a\x1fb", "c"), None), (("a", "b\x1fc"), None)),
        ((("n", "p\x1esalt=x"), "y"), (("n", "p"), "x\x1esalt=y")),
        ((("", ""), "s"), (None, "s")),
        ((("", ""), None), (None, None)),
        ((("a", ""), None), (("", "a"), None)),
    ],
)
def test_known_key_collisions_are_apart(design: str, a: Any, b: Any) -> None:
    c = make(design, num_blocks=32, block_size=4)
    assert c.admit(1, PROMPT, lora=a[0], cache_salt=a[1]) is not None
    c.free(1)
    assert c.lookup(PROMPT, lora=b[0], cache_salt=b[1]) == 0


@pytest.mark.parametrize("algo", ["xxh3_128", "sha256", "vllm_sha256_cbor"])
@settings(max_examples=100)
@given(a=st.tuples(_LORA, _SALT), b=st.tuples(_LORA, _SALT))
def test_block_hash_keys_are_injective(algo: str, a: Any, b: Any) -> None:
    ha = kvindex.block_hashes(PROMPT, 4, algo=algo, lora=a[0], cache_salt=a[1])
    hb = kvindex.block_hashes(PROMPT, 4, algo=algo, lora=b[0], cache_salt=b[1])
    assert (ha.tobytes() == hb.tobytes()) == (_canon(*a) == _canon(*b))


@settings(max_examples=100)
@given(a=st.one_of(st.none(), _ADVERSARIAL), b=st.one_of(st.none(), _ADVERSARIAL))
def test_tree_namespaces_are_exact(a: str | None, b: str | None) -> None:
    t = kvindex.RadixTree(1)
    t.insert(PROMPT, np.arange(40, dtype=np.int32), a)
    assert t.probe(PROMPT, b) == (40 if a == b else 0)


# ------------------------------------------------------------ integer parameters


class Boom(Exception):
    """Raised by an argument's own Python code."""


class Index:
    """An int-like whose ``__index__`` raises."""

    def __index__(self) -> int:
        raise Boom("from __index__")


# Outside every integer parameter's range (int64, uint64 ids; handles take 2**64 as
# another tree's).
BIG = [2**64, 2**100, -(2**63) - 1]


def _int_calls(design: str) -> dict[str, Callable[[Any, Any], object]]:
    ids = np.array([1], dtype=np.int64)
    calls: dict[str, Callable[[Any, Any], object]] = {
        "request_id": lambda c, v: c.num_tokens(v),
        "admit_id": lambda c, v: c.admit(v, PROMPT),
        "free": lambda c, v: c.free(v),
        "contains": lambda c, v: v in c,
        "checkpoint": lambda c, v: c.checkpoint(v),
        "ref_count": lambda c, v: c.ref_count(v),
        "max_blocks": lambda c, v: c.block_tables(ids, max_blocks=v),
        "ctor_num_blocks": lambda c, v: make(design, num_blocks=v),
        "ctor_block_size": lambda c, v: make(design, block_size=v),
        "ctor_max_events": lambda c, v: make(design, max_events=v),
    }
    if design == "hash_chain":
        calls["block_hash"] = lambda c, v: c.block_hash(v)
        calls["evict_blocks_list"] = lambda c, v: c.evict_blocks([v])
    else:
        calls["evict"] = lambda c, v: c.evict(v)
        calls["ctor_slru"] = lambda c, v: make(design, slru_threshold=v)
    return calls


def _tree_int_calls() -> dict[str, Callable[[Any, Any], object]]:
    return {
        "page_size": lambda t, v: kvindex.RadixTree(v),
        "slru_threshold": lambda t, v: kvindex.RadixTree(1, slru_threshold=v),
        "evict": lambda t, v: t.evict(v),
        "lock": lambda t, v: t.lock(v),
        "unlock": lambda t, v: t.unlock(v),
        "lock_ref": lambda t, v: t.lock_ref(v),
        "path_slots": lambda t, v: t.path_slots(v),
        "priority": lambda t, v: t.insert(PROMPT, np.arange(40, dtype=np.int32), priority=v),
    }


def _targets() -> list[tuple[str, str]]:
    out = [(d, n) for d in DESIGNS for n in _int_calls(d)]
    return out + [("tree", n) for n in _tree_int_calls()]


def _target(kind: str, name: str) -> tuple[Any, Callable[[Any, Any], object]]:
    if kind == "tree":
        t = kvindex.RadixTree(1)
        return t, _tree_int_calls()[name]
    c = make(kind)
    assert c.admit(1, PROMPT) is not None
    return c, _int_calls(kind)[name]


@pytest.mark.parametrize(("kind", "name"), _targets())
def test_integer_parameters_follow_one_rule(kind: str, name: str) -> None:
    obj, call = _target(kind, name)
    for v in BIG:
        with pytest.raises(KvIndexError) as info:
            call(obj, v)
        expected = (InvalidArgumentError, StaleHandleError)
        assert isinstance(info.value, expected), (
            name,
            v,
            info.value,
        )
    for v in (True, False, 1.0, "1", None):
        if v is None and name == "max_blocks":
            continue  # None is max_blocks' default
        with pytest.raises((DTypeError, TypeError)):
            call(obj, v)

    with pytest.raises(Boom):
        call(obj, Index())
    obj.check_invariants()


@settings(max_examples=100)
@given(v=st.integers(min_value=-(2**130), max_value=2**130))
def test_any_int_is_a_result_or_a_kvindex_error(v: int) -> None:
    c = make("hash_chain")
    assert c.admit(1, PROMPT) is not None
    t = kvindex.RadixTree(1)
    for call in (
        lambda: c.ref_count(v),
        lambda: c.block_hash(v),
        lambda: c.num_tokens(v),
        lambda: c.block_tables(np.array([1], np.int64), max_blocks=v),
        lambda: t.evict(v),
        lambda: t.lock(v),
        lambda: t.insert(PROMPT[:4], np.arange(4, dtype=np.int32), priority=v),
    ):
        try:
            call()
        except KvIndexError:
            pass
    c.check_invariants()
    t.check_invariants()


def test_numpy_integer_scalars_are_ints() -> None:
    c = make("hash_chain")
    assert c.admit(np.int64(1), PROMPT) is not None
    assert c.num_tokens(np.int32(1)) == 40
    assert c.ref_count(np.uint8(0)) >= 0
    with pytest.raises(DTypeError):
        c.num_tokens(np.array([1], np.int64))


# ------------------------------------------------------------ id arrays


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1], dtype=np.uint64),
        np.array([], dtype=np.float64),
        np.array([[1]], dtype=np.int64),
        np.array([1.0]),
        [1.5],
        [True],
        "12",
        {1},
    ],
)
def test_evict_blocks_takes_only_int_arrays_and_int_lists(bad: object) -> None:
    c = make("hash_chain")
    with pytest.raises(DTypeError):
        c.evict_blocks(bad)


# ------------------------------------------------------------ arguments that run Python code


class SlowId:
    """A request id whose ``__index__`` releases the GIL (as I/O would)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        time.sleep(0.0005)
        return self.v


def _slow_items() -> Any:
    time.sleep(0.0005)
    yield from ()


@pytest.mark.parametrize("design", DESIGNS)
def test_gil_release_inside_arguments_does_not_break_serialisation(design: str) -> None:
    c = make(design, num_blocks=4096, block_size=4)
    errors: list[BaseException] = []
    stop = time.monotonic() + 1.0

    def slow(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            rid = 10_000 * (k + 1) + i
            try:
                c.admit(
                    SlowId(rid),
                    PROMPT[:8],
                    mm_items=_slow_items() if design == "hash_chain" else None,
                )
                c.num_tokens(SlowId(rid))
                c.free(SlowId(rid))
            except BaseException as e:
                errors.append(e)
                return
            i += 1

    def fast(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            rid = 1_000_000 * (k + 1) + i
            try:
                c.admit(rid, PROMPT)
                c.block_tables(np.array([rid], np.int64))
                _ = c.stats
                c.free(rid)
            except BaseException as e:
                errors.append(e)
                return
            i += 1

    threads = [threading.Thread(target=slow, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=fast, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert c.num_requests == 0
    c.check_invariants()


def test_tree_handle_conversion_releasing_the_gil() -> None:
    t = kvindex.RadixTree(1)
    t.insert(PROMPT, np.arange(40, dtype=np.int32))
    node = t.match_prefix(PROMPT).node
    errors: list[BaseException] = []
    stop = time.monotonic() + 0.5

    class SlowHandle:
        def __index__(self) -> int:
            time.sleep(0.0005)
            return node

    def locker() -> None:
        while time.monotonic() < stop:
            try:
                t.lock(SlowHandle())
                t.unlock(SlowHandle())
            except BaseException as e:
                errors.append(e)
                return

    def matcher() -> None:
        while time.monotonic() < stop:
            try:
                t.probe(PROMPT)
                t.evict(0)
            except BaseException as e:
                errors.append(e)
                return

    ths = [threading.Thread(target=f) for f in (locker, locker, matcher, matcher)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert errors == []
    t.check_invariants()


# ------------------------------------------------------------ bounded event buffers


@pytest.mark.parametrize("design", DESIGNS)
@settings(max_examples=20)
@given(cap=st.integers(1, 40), cycles=st.integers(0, 60))
def test_event_buffer_is_bounded(design: str, cap: int, cycles: int) -> None:
    c = make(design, num_blocks=16, block_size=4, enable_events=True, max_events=cap)
    ref = make(design, num_blocks=16, block_size=4, enable_events=True, max_events=10**6)
    for i in range(cycles):
        p = np.arange(i * 100, i * 100 + 13, dtype=np.int32)
        for x in (c, ref):
            assert x.admit(i, p) is not None
            x.free(i)
    got, want = c.take_events(), ref.take_events()
    assert len(got) == min(cap, len(want))
    assert [repr(e) for e in got] == [repr(e) for e in want[len(want) - len(got) :]]
    assert c.stats["events_dropped"] == len(want) - len(got)
    assert c.take_stats()["events_dropped"] == len(want) - len(got)
    assert c.stats["events_dropped"] == 0


def test_tree_event_buffer_is_bounded() -> None:
    t = kvindex.RadixTree(1, enable_events=True, max_events=3)
    for i in range(10):
        t.insert(np.array([i, i + 1], np.int32), np.array([2 * i, 2 * i + 1], np.int32))
    assert len(t.take_events()) == 3
    assert t.events_dropped == 7


@pytest.mark.parametrize("design", DESIGNS)
def test_max_events_must_be_positive(design: str) -> None:
    with pytest.raises(InvalidArgumentError):
        make(design, max_events=0)
    with pytest.raises(InvalidArgumentError):
        kvindex.RadixTree(1, max_events=0)


def test_events_off_by_default_count_nothing() -> None:
    c = make("hash_chain")
    assert c.stats["events_dropped"] == 0


# ------------------------------------------------------------ refused-admit memo


def test_reset_releases_refused_prompts() -> None:
    # A refused prompt is kept for the retry; reset() drops it, so a retry after
    # reset hashes again and is admitted normally.
    c = kvindex.HashChainCache(4, 4, algo="sha256")
    assert c.admit(2, np.arange(200, 208, dtype=np.int32)) is not None  # holds 2 of 3 blocks
    big = np.arange(100, 112, dtype=np.int32)  # 3 blocks: fits the pool, not now
    assert c.admit(1, big) is None
    c.free(2)
    c.reset()
    assert c.admit(1, np.arange(8, dtype=np.int32)) is not None
    c.check_invariants()


# ------------------------------------------------------------ radix node handles


def _tree_with(prompt: np.ndarray) -> tuple[kvindex.RadixTree, int]:
    t = kvindex.RadixTree(1)
    t.insert(prompt, np.arange(len(prompt), dtype=np.int32))
    return t, t.match_prefix(prompt).node


def test_foreign_handle_is_stale() -> None:
    t1, h1 = _tree_with(PROMPT)
    t2, h2 = _tree_with(PROMPT)
    assert h1 != h2  # same index and generation, different trees
    for call in (t2.lock, t2.unlock, t2.lock_ref, t2.path_slots):
        with pytest.raises(StaleHandleError):
            call(h1)
    assert t2.protected_size == 0
    t2.lock(h2)
    assert t2.protected_size == 40
    t1.check_invariants()
    t2.check_invariants()


@settings(max_examples=50)
@given(n=st.integers(1, 5), which=st.data())
def test_handles_work_only_on_their_tree(n: int, which: st.DataObject) -> None:
    trees = [_tree_with(PROMPT) for _ in range(n)]
    i = which.draw(st.integers(0, n - 1))
    j = which.draw(st.integers(0, n - 1))
    t, _ = trees[i]
    h = trees[j][1]
    if i == j:
        t.lock(h)
        assert t.lock_ref(h) == 1
        t.unlock(h)
    else:
        with pytest.raises(StaleHandleError):
            t.lock(h)
    t.check_invariants()


def test_root_handle_is_zero_everywhere() -> None:
    t = kvindex.RadixTree(1)
    assert t.match_prefix(PROMPT).node == 0
    t.lock(0)  # the root: a no-op
    t.unlock(0) if t.lock_ref(0) else None


# ------------------------------------------------------------ sizing inputs


@pytest.mark.parametrize("dtype", [None, 2.0, ["bf16"], True, b"bf16"])
def test_sizing_refuses_bad_dtypes(dtype: Any) -> None:
    with pytest.raises(SizingError):
        kv_bytes_per_token(32, 8, 128, dtype)


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 1e10, 123.5, True, "1GiB"])
def test_sizing_refuses_non_int_budgets(budget: Any) -> None:
    with pytest.raises(SizingError):
        kv_pool_size(131072, 16, budget_bytes=budget)


@pytest.mark.parametrize("gpu", [float("inf"), float("nan"), 8e9])
def test_sizing_refuses_non_int_gpu_memory(gpu: Any) -> None:
    with pytest.raises(SizingError):
        kv_budget_bytes("vllm", gpu_memory_bytes=gpu)


@settings(max_examples=100)
@given(budget=st.integers(0, 2**70), bpt=st.integers(1, 2**20), bs=st.integers(1, 256))
def test_pool_counts_are_ints(budget: int, bpt: int, bs: int) -> None:
    pool = kv_pool_size(bpt, bs, budget_bytes=budget)
    assert type(pool.num_blocks) is int and pool.num_blocks == budget // (bs * bpt)


# ------------------------------------------------------------ key arguments and hashing


def test_mm_item_integers_follow_the_int_rule() -> None:
    c = make("hash_chain")

    with pytest.raises(Boom):
        c.lookup(PROMPT, mm_items=[("img", Index(), 4)])
    for v in BIG:
        with pytest.raises(InvalidArgumentError):
            c.lookup(PROMPT, mm_items=[("img", 0, v)])
    # a non-int offset or length (bool included) is a malformed item
    with pytest.raises(InvalidArgumentError):
        c.lookup(PROMPT, mm_items=[("img", True, 4)])
    assert c.lookup(PROMPT, mm_items=[("img", np.int64(0), np.int32(4))]) == 0


def test_mm_items_generator_exception_propagates() -> None:
    def items() -> Any:
        yield ("img", 0, 4)
        raise Boom("from the generator")

    c = make("hash_chain")
    with pytest.raises(Boom):
        c.admit(1, PROMPT, mm_items=items())
    assert 1 not in c


@pytest.mark.parametrize("bs", [*BIG, 2**63 - 1, 0])
def test_block_hashes_block_size_range(bs: int) -> None:
    with pytest.raises(InvalidArgumentError):
        kvindex.block_hashes(PROMPT, bs)


# ------------------------------------------------------------ one interface


@pytest.mark.parametrize("design", DESIGNS)
def test_both_caches_satisfy_the_protocol(design: str) -> None:
    c = make(design)
    assert isinstance(c, kvindex.PrefixCache)
    assert c.admit(1, PROMPT) is not None
    c.checkpoint(1)  # both designs: request 1's full blocks are hittable now
    hit, ids = c.admit(2, PROMPT) or (None, None)
    assert hit == 32 and ids is not None and ids.dtype == np.int32
    assert c.free_blocks().dtype == np.int32
    assert c.num_cached_blocks >= 0
