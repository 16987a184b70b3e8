"""The native per-step calls of kvindex's vLLM ``KVCacheManager`` (``_VllmFront``).

``allocate_slots``, ``cache_blocks`` and ``estimate_cached_tokens`` are served by a native
object installed on each manager instance; it answers a running request's no-op or
cache-only step itself and hands everything else to the class's Python methods. Here
three managers take the same random calls — vLLM's own, kvindex's as installed, and
kvindex's with the native front removed (the Python methods alone) — and every answer,
the free queue and the KV events must agree after every call. Watermarks, delayed
caching, re-prefilled MTP tails, lookahead slots and drafts are in the mix, so each of the
front's refusals is exercised.

Needs vLLM 0.33 (the vLLM test environment); skipped where vLLM is not installed.
"""

from __future__ import annotations

import gc
import random
import sys
import warnings
import weakref
from types import FrameType
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("vllm")
    from test_manager import VllmManager, config, ids, make_request
    from vllm.v1.request import Request, RequestStatus

    from kvindex.integrations.vllm.manager import KVCacheManager

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FRONT_METHODS = ("allocate_slots", "cache_blocks", "estimate_cached_tokens")


def without_front(m: KVCacheManager) -> KVCacheManager:
    """The manager answering through its class's Python methods alone."""
    for name in FRONT_METHODS:
        del m.__dict__[name]
    return m


def python_calls(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """``fn``'s result and the Python functions it entered."""
    names: list[str] = []

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        out = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return out, names


def running(m: KVCacheManager, rid: str, prompt: list[int], bs: int) -> Request:
    r = make_request(rid, prompt, bs)
    blocks, n, _ = m.get_computed_blocks(r)
    assert m.allocate_slots(r, len(prompt) - n, n, blocks) is not None
    r.num_computed_tokens = len(prompt)
    r.status = RequestStatus.RUNNING
    return r


def test_front_is_installed_natively_unless_overridden() -> None:
    m = KVCacheManager(config(32, 4), max_model_len=512, scheduler_block_size=4, hash_block_size=4)
    for name in FRONT_METHODS:
        assert type(m.__dict__[name]).__name__ == "builtin_function_or_method"

    class Custom(KVCacheManager):
        def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
            return None

    c = Custom(config(32, 4), max_model_len=512, scheduler_block_size=4, hash_block_size=4)
    assert "cache_blocks" not in c.__dict__  # the subclass's override is what runs
    assert type(c.__dict__["allocate_slots"]).__name__ == "builtin_function_or_method"


def test_running_steps_run_no_python_frame_until_a_block_is_needed() -> None:
    bs = 4
    m = KVCacheManager(
        config(32, bs), max_model_len=512, scheduler_block_size=bs, hash_block_size=bs
    )
    r = running(m, "a", list(range(10)), bs)  # 3 blocks held: 12 slots, 2 blocks cached
    r.append_output_token_ids(7)  # token 11
    out, frames = python_calls(m.allocate_slots, r, 1, num_lookahead_tokens=0)
    assert out is m.empty_kv_cache_blocks and frames == []
    r.num_computed_tokens += 1
    r.append_output_token_ids(8)  # token 12 fills block 3: cached, no new block
    out, frames = python_calls(m.allocate_slots, r, 1, num_lookahead_tokens=0)
    assert out is m.empty_kv_cache_blocks
    assert frames == ["num_tokens"]  # vLLM's Request property; the rest is native
    assert m.estimate_cached_tokens(r) == 12 and m._core.num_cached("a") == 3
    r.num_computed_tokens += 1
    r.append_output_token_ids(9)  # token 13 needs a fourth block
    out, frames = python_calls(m.allocate_slots, r, 1, num_lookahead_tokens=0)
    assert out is not None and out.get_block_ids() == (m.get_block_ids("a")[0][3:],)
    assert frames == ["num_tokens", "__init__"]  # vLLM's property, KVCacheBlocks(...)
    _, frames = python_calls(m.cache_blocks, r, 12)
    assert frames == []
    # An admission adopting a hit is the Python method's.
    c = make_request("c", list(range(9)), 4)
    hit, n, _ = m.get_computed_blocks(c)
    assert n == 8
    _, frames = python_calls(m.allocate_slots, c, 1, n, hit)
    assert frames[0] == "allocate_slots"


def test_bad_arguments_reach_the_general_path_unchanged() -> None:
    m = KVCacheManager(config(32, 4), max_model_len=512, scheduler_block_size=4, hash_block_size=4)
    r = running(m, "a", list(range(10)), 4)
    before = m.get_block_ids("a")
    with pytest.raises(TypeError):
        m.allocate_slots(r, "1")
    with pytest.raises(TypeError):
        m.allocate_slots(r, 1, num_lookahead_tokens=None)
    with pytest.raises(TypeError):
        m.allocate_slots(r, 1, bogus=1)
    assert m.get_block_ids("a") == before
    m._core.check_invariants()


@pytest.mark.parametrize(
    ("n", "look", "computed"),
    [(2**62, 2**62, None), (1, 2**63 - 1, None), (2**63 - 1, 0, 2**62), (2**64, 0, None)],
)
def test_huge_counts_are_answered_as_the_python_methods_answer(
    n: int, look: int, computed: int | None
) -> None:
    """Counts whose sums leave int64 (or that do not fit it) get the Python methods'
    answer: the native arithmetic saturates instead of wrapping into a no-op."""
    answers = []

    def manager() -> KVCacheManager:
        return KVCacheManager(
            config(32, 4), max_model_len=64, scheduler_block_size=4, hash_block_size=4
        )

    for m in (manager(), without_front(manager())):
        r = running(m, "a", list(range(10)), 4)
        if computed is not None:
            r.num_computed_tokens = computed
        try:
            out = ids(m.allocate_slots(r, n, num_lookahead_tokens=look))
        except Exception as e:  # the two paths must fail alike
            out = type(e).__name__
        answers.append((out, m.get_block_ids("a"), m.block_pool.get_num_free_blocks()))
        m.cache_blocks(r, -(2**63))
        m._core.check_invariants()
    assert answers[0] == answers[1]


def _admit(
    ms: tuple[Any, ...], rid: str, prompt: list[int], bs: int, rng: random.Random
) -> tuple[list[Request], Any]:
    reqs = [make_request(rid, prompt, bs) for _ in ms]
    hits = [m.get_computed_blocks(r) for m, r in zip(ms, reqs, strict=True)]
    assert len({(tuple(map(tuple, ids(b))), n) for b, n, _ in hits}) == 1
    n = hits[0][1]
    chunk = rng.randint(1, len(prompt) - n)
    look = rng.choice([0, 0, 2])
    scheduled = rng.random() < 0.7
    delay = rng.random() < 0.15
    outs = [
        ids(
            m.allocate_slots(
                r,
                chunk,
                n,
                b,
                num_lookahead_tokens=look,
                delay_cache_blocks=delay,
                has_scheduled_reqs=scheduled,
            )
        )
        for m, r, (b, _, _) in zip(ms, reqs, hits, strict=True)
    ]
    assert outs[1:] == outs[:-1]
    if outs[0] is not None:
        # Most admitted requests run; the others stay WAITING, under the watermark.
        run = rng.random() < 0.8
        for m, r in zip(ms, reqs, strict=True):
            r.num_computed_tokens = n + chunk
            if run:
                r.status = RequestStatus.RUNNING
            if delay:
                m.cache_blocks(r, n + chunk)
    return reqs, outs[0]


@pytest.mark.parametrize("seed", range(10))
def test_front_agrees_with_the_python_methods_and_vllm(seed: int) -> None:
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8, 16])
    kw: dict[str, Any] = dict(
        max_model_len=rng.choice([64, 8192]),
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=rng.random() < 0.85,
        enable_kv_cache_events=rng.random() < 0.5,
        watermark=rng.choice([0.0, 0.0, 0.1]),
        use_eagle=rng.random() < 0.3,
        num_prefill_lookahead=rng.choice([0, 0, 2]),
    )
    num_blocks = rng.randint(12, 90)
    ms = (
        VllmManager(config(num_blocks, bs), **kw),
        KVCacheManager(config(num_blocks, bs), **kw),
        without_front(KVCacheManager(config(num_blocks, bs), **kw)),
    )
    prefixes = [[rng.randrange(40) for _ in range(rng.randint(0, 5 * bs))] for _ in range(3)]
    live: dict[str, list[Request]] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.25 or not live:
            rid = f"r{step}"
            tail = [rng.randrange(40) for _ in range(rng.randint(1, 4 * bs))]
            prompt = rng.choice(prefixes) + tail
            if len(prompt) >= kw["max_model_len"]:
                continue
            reqs, out = _admit(ms, rid, prompt, bs, rng)
            if out is not None:
                live[rid] = reqs
        elif op < 0.8:
            rid = rng.choice(sorted(live))
            reqs = live[rid]
            r0 = reqs[0]
            drafts = 0
            if r0.num_computed_tokens < r0.num_tokens:
                n = rng.randint(1, r0.num_tokens - r0.num_computed_tokens)
            else:
                if r0.num_tokens + 4 >= kw["max_model_len"]:
                    continue
                tok = rng.randrange(40)
                for r in reqs:
                    r.append_output_token_ids(tok)
                drafts = rng.choice([0, 0, 0, 2])
                n = 1 + drafts
            look = rng.choice([0, 0, 1, 3])
            outs = [
                ids(m.allocate_slots(r, n, num_lookahead_tokens=look))
                for m, r in zip(ms, reqs, strict=True)
            ]
            assert outs[1:] == outs[:-1], f"step {step}"
            if outs[0] is None:
                continue
            for m, r in zip(ms, reqs, strict=True):
                r.num_computed_tokens += n - drafts
                if rng.random() < 0.3:  # async scheduling caches what a step computed
                    m.cache_blocks(r, r.num_computed_tokens)
        else:
            rid = rng.choice(sorted(live))
            for m, r in zip(ms, live.pop(rid), strict=True):
                m.free(r)
        some = list(live.values())
        for reqs in rng.sample(some, min(3, len(some))):
            est = [m.estimate_cached_tokens(r) for m, r in zip(ms, reqs, strict=True)]
            assert est[1:] == est[:-1], f"step {step}"
        queues = [
            [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()] for m in ms
        ]
        assert queues[1:] == queues[:-1], f"step {step}"
        events = [m.take_events() for m in ms]
        assert events[1:] == events[:-1], f"step {step}"
        ms[1]._core.check_invariants()


def test_a_dropped_manager_is_collected() -> None:
    """The front and the manager refer to each other (its bound methods, block list and
    tables); the cycle is visible to the garbage collector, so nothing leaks."""
    m = KVCacheManager(config(32, 4), max_model_len=512, scheduler_block_size=4, hash_block_size=4)
    running(m, "a", list(range(10)), 4)
    gone = weakref.ref(m)
    del m
    gc.collect()
    assert gone() is None
