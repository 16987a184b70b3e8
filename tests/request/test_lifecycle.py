"""The engine lifecycle of kvindex's Rust caches against vLLM 0.33 and the Python models.

``tests/data/vllm_golden/vllm_lifecycle.json`` (vLLM 0.33's own ``KVCacheManager`` under
chunked prefill, lookahead slots, drafts with rejection, preemption and resume) replays
through ``HashChainCache``'s lifecycle calls (``admit_chunk`` / ``resume`` / ``schedule``
/ ``commit_tokens`` / ``preempt`` / ``finish``): vLLM's answer, the request's table and
counters, the whole free queue and the KV events are compared after every operation, as
``tests/request/test_lifecycle_model.py`` does for the model. Random workloads then drive the Rust
hash chain and the model (``tests/support/models/vllm_lifecycle.py``) with the same calls
(chunks, lookahead, drafts accepted or rejected, async placeholders, external hits with
delayed caching, preemption), comparing answers, tables, free queues and stored blocks
after every step; the radix design is run against its model
(``tests/support/models/radix_lifecycle.py``) and against the hash chain (same hits at unbounded
capacity). Bad input raises ``KvIndexError`` and changes nothing.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import kvindex
from models.radix_lifecycle import RadixLifecycleModel
from models.vllm_lifecycle import LifecycleError, Status, VllmLifecycleModel

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "vllm_golden" / "vllm_lifecycle.json"
SCENARIOS = json.loads(GOLDEN.read_text())["scenarios"]


def _arr(xs: Any) -> np.ndarray:
    return np.asarray(list(xs), dtype=np.int64)


def _event(e: Any) -> dict[str, Any]:
    d = e.to_dict()
    if d["type"] == "BlockStored":
        keys = ("type", "block_hashes", "parent_block_hash", "token_ids")
        return {k: d[k] for k in keys}
    return {k: d[k] for k in ("type", "block_hashes") if k in d}


def _diff(want: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{path}.{k}: vLLM {want.get(k)!r}, kvindex {got.get(k)!r}")
            else:
                out += _diff(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        pairs = enumerate(zip(want, got, strict=True))
        return [d for i, (w, g) in pairs for d in _diff(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: vLLM {want!r}, kvindex {got!r}"]


class RustReplayer:
    """One golden operation at a time through ``HashChainCache``, as vLLM's scheduler."""

    def __init__(self, sc: dict[str, Any]) -> None:
        self.c = kvindex.HashChainCache(
            sc["num_blocks"],
            sc["block_size"],
            algo="vllm_" + sc["hash_algo"],
            seed=sc["none_hash_seed"],
            enable_events=True,
        )
        self.ids: dict[str, int] = {}
        self.status: dict[str, str] = {}
        self.last: dict[str, tuple[int, int]] = {}  # counters of finished requests

    def rid(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids) + 1)

    def running(self) -> bool:
        return any(s == "running" for s in self.status.values())

    def apply(self, op: dict[str, Any]) -> dict[str, Any] | None:
        c, name, kind = self.c, op["id"], op["op"]
        rid = self.rid(name)
        result: dict[str, Any] | None
        if kind == "admit":
            kw = {"chunk": op["chunk"], "lookahead": op["lookahead"], "must_fit": op["must_fit"]}
            if op.get("resume"):
                res = c.resume(rid, **kw)
            else:
                res = c.admit_chunk(rid, _arr(op["tokens"]), **kw)
            result = None
            if res is not None:
                hit, scheduled, new = res
                result = {"hit": hit, "scheduled": scheduled, "new_blocks": new.tolist()}
                self.status[name] = "running"
        elif kind == "prefill":
            st = c.request_state(rid)
            n = min(st["num_tokens"] - st["num_computed"], op["chunk"])
            blocks = c.schedule(rid, n, lookahead=op["lookahead"])
            result = None if blocks is None else {"scheduled": n, "new_blocks": blocks.tolist()}
        elif kind == "decode":
            drafts = op["drafts"]
            blocks = c.schedule(
                rid, 1 + len(drafts), lookahead=op["lookahead"], draft_tokens=_arr(drafts)
            )
            result = None if blocks is None else {"new_blocks": blocks.tolist()}
            if blocks is not None:
                acc = op["accept"]
                c.commit_tokens(rid, _arr(drafts[:acc] + [op["bonus"]]), len(drafts) - acc)
        elif kind == "preempt":
            c.preempt(rid)
            self.status[name] = "preempted"
            result = {}
        elif kind == "finish":
            st = c.request_state(rid)
            self.last[name] = (st["num_computed"], st["num_tokens"])
            c.finish(rid)
            self.status.pop(name, None)
            result = {}
        else:
            raise AssertionError(f"unknown op {kind}")
        if "sampled" in op:
            c.commit_tokens(rid, _arr([op["sampled"]]))
        return result

    def after(self, name: str) -> dict[str, Any]:
        rid = self.rid(name)
        if rid in self.c:
            st = self.c.request_state(rid)
            table = self.c.request_blocks(rid).tolist()
            counters = (st["num_computed"], st["num_tokens"])
        else:
            table, counters = [], self.last.get(name, (0, 0))
        return {
            "table": table,
            "num_computed": counters[0],
            "num_tokens": counters[1],
            "free_queue": self.c.free_queue().tolist(),
            "num_free": self.c.num_free_blocks,
        }


@pytest.mark.parametrize(
    "sc", SCENARIOS, ids=[f"{s['hash_algo']}-bs{s['block_size']}" for s in SCENARIOS]
)
def test_golden_lifecycle_replays_through_the_rust_hash_chain(sc: dict[str, Any]) -> None:
    rp = RustReplayer(sc)
    for i, op in enumerate(sc["ops"]):
        result = rp.apply(op)
        events = [_event(e) for e in rp.c.take_events()]
        got = {"result": result, "after": rp.after(op["id"]), "events": events}
        want = {"result": op["result"], "after": op["after"], "events": op["events"]}
        diff = _diff(want, got)
        if diff:
            brief = {k: v for k, v in op.items() if k not in ("tokens", "after", "events")}
            pytest.fail(
                f"{sc['hash_algo']} bs={sc['block_size']} op #{i} {brief}:\n  "
                + "\n  ".join(diff[:20])
            )
        rp.c.check_invariants()


def test_golden_resumed_hits_are_counted_apart() -> None:
    sc = SCENARIOS[0]
    rp = RustReplayer(sc)
    want = {"requests": 0, "queries": 0, "hits": 0}
    resumed = {"requests": 0, "queries": 0, "hits": 0}
    for op in sc["ops"]:
        before = rp.c.resumed_stats["requests"]
        rp.apply(op)
        rp.c.take_events()
        if op["op"] == "admit" and op["result"] is not None:
            bucket = resumed if op.get("resume") else want
            bucket["requests"] += 1
            bucket["hits"] += op["result"]["hit"]
            assert rp.c.resumed_stats["requests"] == before + bool(op.get("resume"))
    stats, rs = rp.c.stats, rp.c.resumed_stats
    assert resumed["requests"] > 0
    for k in ("requests", "hits"):
        assert stats[k] == want[k]
        assert rs[k] == resumed[k]


# ---------------------------------------------------------------------------- differential


class Pair:
    """The same lifecycle calls on the model and on a Rust cache, compared after each."""

    def __init__(self, num_blocks: int, bs: int, radix: bool = False) -> None:
        self.m = VllmLifecycleModel(num_blocks, bs, hash_algo="sha256", seed="0")
        self.radix = radix
        if radix:
            self.r: Any = kvindex.RadixPrefixCache(num_blocks, bs)
        else:
            self.r = kvindex.HashChainCache(num_blocks, bs, algo="vllm_sha256", seed="0")

    def same(self, a: Any, b: Any) -> None:
        assert a == b

    def check(self, rid: int | None = None) -> None:
        self.r.check_invariants()
        self.m.check_invariants()
        if not self.radix:
            assert self.r.free_queue().tolist() == self.m.free_queue()
            hashes = [self.r.block_hash(b) for b in range(self.m.num_blocks)]
            assert hashes == self.m.block_hash
            for x, req in self.m.requests.items():
                if req.status is Status.FINISHED:
                    continue
                assert self.r.request_blocks(x).tolist() == self.m.block_table(x)
        for x, req in self.m.requests.items():
            if req.status is Status.FINISHED:
                assert x not in self.r
                continue
            st = self.r.request_state(x)
            assert (st["num_computed"], st["num_tokens"], st["pending"]) == (
                req.num_computed,
                req.num_tokens,
                req.pending,
            )
            assert st["drafts"] == req.spec


_ERR = object()


def _both(model_call: Any, rust_call: Any) -> tuple[Any, Any]:
    """Runs the model's call, then the Rust one: both raise a caller error (``_ERR``,
    Rust's state unchanged is checked by the next comparison) or both answer."""
    try:
        a = model_call()
    except LifecycleError:
        with pytest.raises(kvindex.KvIndexError):
            rust_call()
        return _ERR, _ERR
    return a, rust_call()


def _drive(p: Pair, rng: random.Random, steps: int, *, radix_model: Any = None) -> None:
    """Random lifecycle calls on the model and the Rust cache (and the radix model,
    which mirrors every call that succeeded), compared after each."""
    m, r, bs = p.m, p.r, p.m.block_size
    rm = radix_model

    def mirror(call: Any) -> None:
        if rm is not None:
            call(rm)

    system = [rng.randrange(40) for _ in range(rng.randrange(1, 4 * bs))]
    nid = [0]

    def one_step() -> None:
        live = [x for x, q in m.requests.items() if q.status is not Status.FINISHED]
        u = rng.random()
        if u < 0.25 or not live:
            nid[0] += 1
            prompt = system[: rng.randrange(len(system) + 1)]
            prompt = prompt + [rng.randrange(40) for _ in range(rng.randrange(1, 4 * bs))]
            chunk = rng.choice([None, 1, 2, bs, 3 * bs])
            kw: dict[str, Any] = {"chunk": chunk, "lookahead": rng.randrange(5)}
            if not p.radix and rng.random() < 0.2:
                kw["external_prefix"] = rng.randrange(len(prompt) + 1)
                kw["delay_cache"] = rng.random() < 0.5
            if rng.random() < 0.2:
                kw["must_fit"] = True
            a = m.admit(nid[0], prompt, **kw)
            b = r.admit_chunk(nid[0], _arr(prompt), **kw)
            if a is None:
                assert b is None
                m.requests.pop(nid[0], None)
            else:
                assert b is not None
                assert (a.hit, a.scheduled) == (b[0], b[1])
                if not p.radix:
                    assert a.new_blocks == b[2].tolist()
            if rm is not None and a is not None:
                ra = rm.admit(nid[0], prompt, chunk=chunk, lookahead=kw["lookahead"])
                assert ra is not None and ra.hit == a.hit
            p.check()
            _same_lookups(p, rm)
            return
        x = rng.choice(live)
        q = m.requests[x]
        if q.status is Status.PREEMPTED:
            if rng.random() < 0.8:
                kw = {"chunk": rng.choice([None, 1, bs, 2 * bs])}
                a = m.admit(x, None, **kw)
                b = r.resume(x, **kw)
                assert (a is None) == (b is None)
                if a is not None:
                    assert (a.hit, a.scheduled) == (b[0], b[1])
                    mirror(lambda t: t.admit(x, None, **kw))
            else:
                m.finish(x)
                r.finish(x)
                mirror(lambda t: t.finish(x))
        elif q.status is Status.WAITING_FOR_REMOTE_KVS:
            m.finish_transfer(x)
            r.finish_transfer(x)
        elif u < 0.6:
            # next chunk, decode step (drafts), or an async step ahead of its id
            if q.num_computed < q.num_tokens and rng.random() < 0.8:
                n = min(q.num_tokens - q.num_computed, rng.choice([1, 2, bs, 3 * bs]))
                drafts: list[int] = []
            else:
                n = rng.randrange(1, 3)
                drafts = (
                    [rng.randrange(40) for _ in range(rng.randrange(3))]
                    if q.pending == 0 and q.num_computed == q.num_tokens and not q.spec
                    else []
                )
                n = len(drafts) + 1 if drafts else n
            la = rng.randrange(5)
            want, got = _both(
                lambda: m.schedule(x, n, lookahead=la, draft_token_ids=drafts),
                lambda: r.schedule(x, n, lookahead=la, draft_tokens=_arr(drafts)),
            )
            if want is not _ERR:
                assert (want is None) == (got is None)
                if want is not None and not p.radix:
                    assert want == got.tolist()
                if want is not None:
                    mirror(lambda t: t.schedule(x, n, lookahead=la, draft_token_ids=drafts))
        elif u < 0.85:
            acc = rng.randrange(len(q.spec) + 1)
            ids = q.spec[:acc] + [rng.randrange(40) for _ in range(min(q.pending, 2))]
            rej = len(q.spec) - acc
            want, _ = _both(
                lambda: m.commit_tokens(x, ids, rej),
                lambda: r.commit_tokens(x, _arr(ids), rej),
            )
            if want is not _ERR:
                mirror(lambda t: t.commit_tokens(x, ids, rej))
        elif u < 0.93:
            m.preempt(x)
            r.preempt(x)
            mirror(lambda t: t.preempt(x))
        else:
            m.finish(x)
            r.finish(x)
            mirror(lambda t: t.finish(x))
        p.check()
        _same_lookups(p, rm)

    for _ in range(steps):
        one_step()


def _same_lookups(p: Pair, rm: Any) -> None:
    """Every running request's tokens hit the same in every design (unbounded capacity)."""
    if rm is None:
        return
    for q in p.m.requests.values():
        if q.status is Status.FINISHED:
            continue
        want = p.m.lookup(q.tokens)
        assert p.r.lookup(_arr(q.tokens)) == want == rm.lookup(q.tokens)


@pytest.mark.parametrize("seed", range(16))
def test_rust_hash_chain_matches_the_model_on_random_lifecycles(seed: int) -> None:
    rng = random.Random(seed)
    p = Pair(rng.choice([10, 16, 40]), rng.choice([1, 2, 4]))
    _drive(p, rng, 250)


@pytest.mark.parametrize("seed", range(12))
def test_rust_radix_matches_both_models_at_unbounded_capacity(seed: int) -> None:
    """The Rust radix cache, the radix model and the vLLM model under one call stream:
    identical hits at every admission and identical lookups after every call."""
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    p = Pair(4096, bs, radix=True)
    _drive(p, rng, 250, radix_model=RadixLifecycleModel(bs))


# ---------------------------------------------------------------------------- bad input


def _snapshot(c: Any, ids: list[int]) -> Any:
    live = [i for i in ids if i in c]
    return (
        c.free_queue().tolist() if hasattr(c, "free_queue") else c.num_free_blocks,
        [c.request_blocks(i).tolist() for i in live],
        [c.request_state(i) for i in live],
        c.stats,
        c.resumed_stats,
        c.num_requests,
    )


def _setup(kind: str) -> Any:
    c = (
        kvindex.HashChainCache(16, 4, algo="vllm_sha256", seed="0", enable_events=True)
        if kind == "hash_chain"
        else kvindex.RadixPrefixCache(16, 4, enable_events=True)
    )
    assert c.admit_chunk(1, _arr(range(10)), chunk=4) is not None  # prefilling
    assert c.admit_chunk(2, _arr(range(6))) is not None  # prefilled: one placeholder
    assert c.admit_chunk(3, _arr(range(5))) is not None
    c.commit_tokens(3, _arr([9]))
    assert c.schedule(3, 3, draft_tokens=_arr([4, 4])) is not None  # drafts in flight
    assert c.admit_chunk(4, _arr(range(3))) is not None
    c.preempt(4)
    assert c.admit_chunk(5, _arr(range(3))) is not None
    c.finish(5)
    c.take_events()
    return c


BAD_CALLS = {
    "commit more ids than placeholders": lambda c: c.commit_tokens(2, _arr([1, 2])),
    "commit on a prefilling request": lambda c: c.commit_tokens(1, _arr([1])),
    "reject more drafts than scheduled": lambda c: c.commit_tokens(3, _arr([1]), 3),
    "ids not led by accepted drafts": lambda c: c.commit_tokens(3, _arr([5, 1]), 0),
    "negative num_rejected": lambda c: c.commit_tokens(3, _arr([4]), -1),
    "schedule with drafts uncommitted": lambda c: c.schedule(3, 1),
    "zero chunk": lambda c: c.admit_chunk(9, _arr([1, 2]), chunk=0),
    "negative chunk": lambda c: c.admit_chunk(9, _arr([1, 2]), chunk=-4),
    "negative lookahead": lambda c: c.admit_chunk(9, _arr([1, 2]), lookahead=-1),
    "negative external prefix": lambda c: c.admit_chunk(9, _arr([1, 2]), external_prefix=-1),
    "negative reserved": lambda c: c.schedule(1, 2, reserved_blocks=-1),
    "empty prompt": lambda c: c.admit_chunk(9, _arr([])),
    "duplicate id": lambda c: c.admit_chunk(1, _arr([1, 2])),
    "zero new tokens": lambda c: c.schedule(1, 0),
    "negative new tokens": lambda c: c.schedule(1, -3),
    "oversized chunk": lambda c: c.schedule(1, 7),
    "beyond the placeholder": lambda c: c.schedule(2, 2),
    "drafts with no non-draft token": lambda c: c.schedule(2, 1, draft_tokens=_arr([1])),
    "unknown request schedule": lambda c: c.schedule(99, 1),
    "finished request commit": lambda c: c.commit_tokens(5, _arr([1])),
    "finished request preempt": lambda c: c.preempt(5),
    "preempted request schedule": lambda c: c.schedule(4, 1),
    "preempted request commit": lambda c: c.commit_tokens(4, _arr([1])),
    "preempt twice": lambda c: c.preempt(4),
    "resume a running request": lambda c: c.resume(1),
    "resume unknown": lambda c: c.resume(99),
    "transfer not awaited": lambda c: c.finish_transfer(1),
    "append mid-prefill": lambda c: c.append(1, _arr([1])),
    "append with drafts in flight": lambda c: c.append_batch(_arr([2, 3]), _arr([1, 2])),
    "schedule_batch repeated id": lambda c: c.schedule_batch(_arr([2, 2]), _arr([1, 1])),
    "schedule_batch bad entry last": lambda c: c.schedule_batch(_arr([2, 1]), _arr([1, 9])),
    "schedule_batch lengths": lambda c: c.schedule_batch(_arr([2, 1]), _arr([1])),
    "commit_batch bad entry last": lambda c: c.commit_batch(_arr([2, 1]), _arr([7, 8])),
    "commit_batch bad offsets": lambda c: c.commit_batch(_arr([2]), _arr([7]), _arr([0, 2])),
    "schedule_batch int32 ids": lambda c: c.schedule_batch(_arr([2]).astype(np.int32), _arr([1])),
    "schedule_batch negative id": lambda c: c.schedule_batch(_arr([2, -1]), _arr([1, 1])),
    "schedule_batch int32 counts": lambda c: c.schedule_batch(
        _arr([2]), _arr([1]).astype(np.int32)
    ),
    "commit_batch strided ids": lambda c: c.commit_batch(_arr([2, 0, 1])[::2], _arr([7, 8])),
    "commit_batch negative id": lambda c: c.commit_batch(_arr([-2]), _arr([7])),
}


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises_and_changes_nothing(kind: str, name: str) -> None:
    c = _setup(kind)
    before = _snapshot(c, [1, 2, 3, 4, 5])
    with pytest.raises(kvindex.KvIndexError):
        BAD_CALLS[name](c)
    assert _snapshot(c, [1, 2, 3, 4, 5]) == before
    assert c.take_events() == []
    c.check_invariants()


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_a_chunk_is_visible_from_the_step_that_schedules_it(kind: str) -> None:
    c = _setup(kind)
    prompt = _arr(range(100, 120))  # 5 blocks of 4
    assert c.admit_chunk(10, prompt, chunk=6) is not None
    assert c.lookup(prompt) == 4
    assert c.schedule(10, 6) is not None
    assert c.lookup(prompt) == 12
    res = c.admit_chunk(11, np.concatenate([prompt, _arr([7])]), chunk=64)
    assert res is not None and res[0] == 12
    c.check_invariants()


def test_async_batch_step_caches_a_block_only_when_its_ids_are_known() -> None:
    c = kvindex.HashChainCache(32, 4, algo="vllm_sha256", seed="0")
    ids = _arr([1, 2])
    for i in (1, 2):
        assert c.admit_chunk(i, _arr(range(10 * i, 10 * i + 6))) is not None
    # step k+1 is scheduled before step k's ids are known
    done, blocks, offsets = c.schedule_batch(ids, _arr([1, 1]))
    assert done == 2 and offsets.tolist() == [0, 0, 0] and len(blocks) == 0  # slot 6 is held
    assert [c.request_state(i)["pending"] for i in (1, 2)] == [2, 2]
    c.commit_batch(ids, _arr([6, 6]))
    assert c.lookup(_arr(list(range(10, 16)) + [6, 0, 0])) == 4  # block 1 not yet known
    c.commit_batch(ids, _arr([7, 7]))
    assert c.lookup(_arr(list(range(10, 16)) + [6, 7, 0])) == 4  # known, cached next step
    assert c.schedule_batch(ids, _arr([1, 1]))[0] == 2
    assert c.lookup(_arr(list(range(10, 16)) + [6, 7, 0])) == 8
    c.check_invariants()


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_batch_arrays_are_refused_with_the_readers_messages(kind: str) -> None:
    """Per-step id and count arrays are read in place; anything else is refused exactly as
    the copying readers refuse it."""
    c = _setup(kind)
    cases = [
        (
            lambda: c.schedule_batch(_arr([2]).astype(np.int32), _arr([1])),
            kvindex.DTypeError,
            "request_ids must have dtype int64, got int32",
        ),
        (
            lambda: c.schedule_batch(_arr([2, -1]), _arr([1, 1])),
            kvindex.InvalidArgumentError,
            "request_ids must be non-negative, got -1",
        ),
        (
            lambda: c.schedule_batch(_arr([2]), np.ones(1)),
            kvindex.DTypeError,
            "num_new_tokens must have dtype int64, got float64",
        ),
        (
            lambda: c.commit_batch([2], _arr([7])),
            kvindex.DTypeError,
            "request_ids must be a numpy array, got list",
        ),
        (
            lambda: c.commit_batch(_arr([2, 0, 1, 0])[::2], _arr([7, 8])),
            kvindex.DTypeError,
            "request_ids must be C-contiguous",
        ),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=re.escape(msg)):
            call()
    c.check_invariants()


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_batch_steps_follow_requests_that_come_and_go(kind: str) -> None:
    """An async scheduler loop (``schedule_batch`` then ``commit_batch`` over the running
    set) while requests finish, are preempted, resume and are admitted again under old ids:
    every step answers as the same steps made one request at a time on a twin cache."""

    def make() -> Any:
        if kind == "hash_chain":
            return kvindex.HashChainCache(24, 4, algo="xxh3_128", enable_events=True)
        return kvindex.RadixPrefixCache(24, 4, enable_events=True)

    batch, single = make(), make()
    rng = random.Random(5)
    running: list[int] = []
    preempted: list[int] = []
    refused = resumed = 0
    for step in range(400):
        roll = rng.random()
        rid = rng.randrange(8)
        if roll < 0.15 and rid not in running and rid not in preempted:
            prompt = _arr([rng.randrange(3) for _ in range(rng.randrange(1, 9))])
            a, b = batch.admit_chunk(rid, prompt), single.admit_chunk(rid, prompt)
            assert (a is None) == (b is None)
            if a is not None:
                assert a[0] == b[0] and a[2].tolist() == b[2].tolist()
                running.append(rid)
        elif roll < 0.18 and running:
            rid = rng.choice(running)
            running.remove(rid)
            if rng.random() < 0.5:
                batch.finish(rid), single.finish(rid)
            else:
                batch.preempt(rid), single.preempt(rid)
                preempted.append(rid)
        elif roll < 0.3 and preempted:
            rid = preempted.pop(rng.randrange(len(preempted)))
            a, b = batch.resume(rid), single.resume(rid)
            assert (a is None) == (b is None)
            (running if a is not None else preempted).append(rid)
            resumed += a is not None
        ids = _arr(running)
        # every running request holds one placeholder here: commit it, then schedule the next
        sampled = _arr([rng.randrange(3) for _ in running])
        batch.commit_batch(ids, sampled)
        for i, t in zip(running, sampled.tolist(), strict=True):
            single.commit_tokens(i, _arr([t]))
        done, blocks, offsets = batch.schedule_batch(ids, np.ones(len(running), np.int64))
        want: list[list[int]] = []
        for i in running:
            got = single.schedule(i, 1)
            if got is None:
                break
            want.append(got.tolist())
        assert done == len(want), f"step {step}"
        assert [blocks[offsets[k] : offsets[k + 1]].tolist() for k in range(done)] == want
        refused += done < len(running)
        for i in running[done:]:  # refused: the scheduler preempts them
            batch.preempt(i), single.preempt(i)
            running.remove(i)
            preempted.append(i)
        assert _snapshot(batch, list(range(8))) == _snapshot(single, list(range(8)))
        assert batch.take_events() == single.take_events()
        batch.check_invariants()
    assert refused > 2 and resumed > 5, (refused, resumed)  # the loop met both


# ---------------------------------------------------------------------------- state machine


class RustVsModelMachine(RuleBasedStateMachine):
    """Every lifecycle call in random order on a small pool (watermark, chunks, lookahead
    0-4, drafts accepted or rejected, async placeholders, external hits, delayed caching,
    preemption, resets), on the model and on ``HashChainCache``: the same answers and
    caller errors, and after every step the same tables, request counters, free queue
    (exactly), block hashes and KV events; ``check_invariants`` after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.m = VllmLifecycleModel(16, 2, hash_algo="sha256", seed="0", watermark=0.1)
        self.r = kvindex.HashChainCache(16, 2, algo="vllm_sha256", seed="0", enable_events=True)
        self.p = Pair.__new__(Pair)
        self.p.m, self.p.r, self.p.radix = self.m, self.r, False
        self.next_id = 0

    def _live(self, *statuses: Status) -> list[int]:
        return [int(x) for x, q in self.m.requests.items() if q.status in statuses]

    @rule(
        data=st.data(),
        toks=st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=1, max_size=14),
        chunk=st.none() | st.integers(1, 14),
        lookahead=st.integers(0, 4),
        must_fit=st.booleans(),
        external=st.sampled_from([0, 0, 0, 2, 4]),
        delay=st.booleans(),
    )
    def admit(
        self,
        data: Any,
        toks: list[int],
        chunk: int | None,
        lookahead: int,
        must_fit: bool,
        external: int,
        delay: bool,
    ) -> None:
        held = self._live(Status.RUNNING, Status.WAITING_FOR_REMOTE_KVS)
        if len(held) >= 3:  # at most three sequences hold blocks, as max_num_seqs would
            self.m.finish(held[0])
            self.r.finish(held[0])
        resumable = self._live(Status.PREEMPTED)
        resume = bool(resumable) and data.draw(st.booleans())
        rid = data.draw(st.sampled_from(resumable)) if resume else self.next_id
        self.next_id += not resume
        scheduled = bool(self._live(Status.RUNNING))
        kw: dict[str, Any] = {
            "chunk": chunk,
            "lookahead": lookahead,
            "must_fit": must_fit,
            "external_prefix": external,
            "delay_cache": delay,
        }
        want = self.m.admit(rid, None if resume else toks, has_scheduled=scheduled, **kw)
        kw["watermark_blocks"] = self.m.watermark_blocks if scheduled else 0
        got = self.r.resume(rid, **kw) if resume else self.r.admit_chunk(rid, _arr(toks), **kw)
        if want is None:
            assert got is None
            self.m.requests.pop(rid, None) if not resume else None
        else:
            assert got is not None
            assert (want.hit, want.scheduled, want.new_blocks) == (got[0], got[1], got[2].tolist())

    @rule(data=st.data(), lookahead=st.integers(0, 4), n_drafts=st.integers(0, 3))
    def schedule(self, data: Any, lookahead: int, n_drafts: int) -> None:
        live = self._live(Status.RUNNING)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        q = self.m.requests[rid]
        left = q.num_tokens + q.pending - q.num_computed
        n = data.draw(st.integers(1, max(left, 1))) if not n_drafts else left + n_drafts
        drafts = data.draw(st.lists(st.integers(0, 3), min_size=n_drafts, max_size=n_drafts))
        want, got = _both(
            lambda: self.m.schedule(rid, n, lookahead=lookahead, draft_token_ids=drafts),
            lambda: self.r.schedule(rid, n, lookahead=lookahead, draft_tokens=_arr(drafts)),
        )
        if want is not _ERR:
            assert want == (None if got is None else got.tolist())

    @rule(data=st.data(), extra=st.integers(0, 2))
    def commit(self, data: Any, extra: int) -> None:
        live = self._live(Status.RUNNING)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        q = self.m.requests[rid]
        acc = data.draw(st.integers(0, len(q.spec)))
        ids = q.spec[:acc] + data.draw(st.lists(st.integers(0, 3), min_size=extra, max_size=extra))
        rej = len(q.spec) - acc
        _both(
            lambda: self.m.commit_tokens(rid, ids, rej),
            lambda: self.r.commit_tokens(rid, _arr(ids), rej),
        )

    @rule(data=st.data())
    def transfer_done(self, data: Any) -> None:
        waiting = self._live(Status.WAITING_FOR_REMOTE_KVS)
        if waiting:
            rid = data.draw(st.sampled_from(waiting))
            self.m.finish_transfer(rid)
            self.r.finish_transfer(rid)

    @rule(data=st.data(), finish=st.booleans())
    def preempt_or_finish(self, data: Any, finish: bool) -> None:
        live = self._live(Status.RUNNING, Status.WAITING_FOR_REMOTE_KVS, Status.PREEMPTED)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        if finish:
            self.m.finish(rid)
            self.r.finish(rid)
        elif self.m.requests[rid].status is not Status.PREEMPTED:
            self.m.preempt(rid)
            self.r.preempt(rid)

    @rule(x=st.integers(0, 15))
    def reset(self, x: int) -> None:
        if x == 15 and not self._live(
            Status.RUNNING, Status.PREEMPTED, Status.WAITING_FOR_REMOTE_KVS
        ):
            assert self.m.reset_prefix_cache()
            self.r.reset()

    @invariant()
    def same_state(self) -> None:
        self.p.check()
        assert [_event(e) for e in self.r.take_events()] == self.m.take_events()


TestRustVsModelMachine = RustVsModelMachine.TestCase
TestRustVsModelMachine.settings = settings(max_examples=150, stateful_step_count=40)


def test_bench_lifecycle_runs_small() -> None:
    """The lifecycle benchmark's measurements run end to end (tiny sizes, figures unchecked)."""
    import bench_lifecycle

    for design in ("xxh3_128", "radix"):
        assert bench_lifecycle.decode_steps(design, 20, 4) > 0
        assert bench_lifecycle.async_steps(design, 20) > 0
        assert bench_lifecycle.append_steps(design, 20) > 0
        assert bench_lifecycle.prefill(design, True, 1) > 0
    assert set(bench_lifecycle.int_width(2)) >= {"radix_match_i64", "hash_chain_admit_i32"}


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_huge_counts_are_refused_not_wrapped(kind: str) -> None:
    """Lookahead, reservations and watermarks near 2**63 are a shortfall (``None``, nothing
    changed), never an overflow; a huge chunk is just the whole prompt."""
    c = _setup(kind)
    big = 2**63 - 1
    before = _snapshot(c, [1, 2, 3, 4, 5])
    assert c.admit_chunk(9, _arr(range(8)), lookahead=big) is None
    assert c.admit_chunk(9, _arr(range(8)), reserved_blocks=big, watermark_blocks=big) is None
    assert c.admit_chunk(9, _arr(range(8)), must_fit=True, watermark_blocks=big) is None
    assert c.schedule(1, 2, lookahead=big) is None
    assert c.schedule(1, 2, reserved_blocks=big) is None
    assert c.schedule_batch(_arr([1]), _arr([2]), lookahead=big)[0] == 0
    with pytest.raises(kvindex.KvIndexError):
        c.schedule(1, big)
    assert _snapshot(c, [1, 2, 3, 4, 5]) == before
    res = c.admit_chunk(9, _arr(range(8)), chunk=big)
    assert res is not None and res[0] + res[1] == 8
    c.check_invariants()


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_batch_arguments_are_converted_before_the_arrays_are_read(kind: str) -> None:
    """``schedule_batch`` reads its id and count arrays in place, after converting its
    other arguments (``lookahead`` through ``__index__``, which may run Python code). An
    ``__index__`` that rewrites the caller's id array makes the call see the rewritten
    ids (an unknown request: an error, nothing changed), never an array changing under
    a read."""

    class Sneaky:
        def __init__(self, victim: np.ndarray) -> None:
            self.victim = victim

        def __index__(self) -> int:
            self.victim[:] = 999  # an id no request has
            return 1

    c = _setup(kind)
    before = _snapshot(c, [1, 2, 3, 4, 5])
    ids = _arr([1, 2])
    with pytest.raises(kvindex.KvIndexError, match="999"):
        c.schedule_batch(ids, _arr([2, 1]), lookahead=Sneaky(ids))
    assert ids.tolist() == [999, 999]
    assert _snapshot(c, [1, 2, 3, 4, 5]) == before
    c.check_invariants()
