"""The lifecycle model (``tests/support/models/vllm_lifecycle.py``) against vLLM 0.33's own traces.

``tests/data/vllm_golden/vllm_lifecycle.json`` holds what vLLM 0.33's ``KVCacheManager``
answered to a scheduler using chunked prefill, lookahead slots, speculative drafts with
rejection, preemption and resume (see that directory's README). Every operation is
replayed through the model's scheduler-facing calls and compared with vLLM's answer,
the request's block table and counters, the whole free queue and the KV events, step by
step; the first difference fails with the scenario, the operation and a field diff.
vLLM's whole-prompt KV-event traces (``vllm_kv_events.json``) replay through the
one-chunk calls. Further tests pin the parts the traces do not exercise (async
placeholders, external hits with delayed caching, watermark, batch calls, caller errors,
stats), check that ``admit`` + ``append`` + ``finish`` is ``HashChainModel`` call for
call, run a hypothesis state machine over every call, and drive the radix-tree model
(``tests/support/models/radix_lifecycle.py``) and this one with the same random workloads:
identical hits and cached prefixes after every call.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from models.hash_chain_model import HashChainModel
from models.radix_lifecycle import RadixLifecycleModel
from models.vllm_lifecycle import LifecycleError, Status, VllmLifecycleModel

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "vllm_golden" / "vllm_lifecycle.json"
_DATA = json.loads(GOLDEN.read_text())
SCENARIOS = _DATA["scenarios"]


def _diff(want: Any, got: Any, path: str = "") -> list[str]:
    """Field-by-field differences, readable in a failure message."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{path}.{k}: missing (vLLM {want[k]!r})")
            elif k not in want:
                out.append(f"{path}.{k}: unexpected {got[k]!r}")
            else:
                out += _diff(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        pairs = enumerate(zip(want, got, strict=True))
        return [d for i, (w, g) in pairs for d in _diff(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: vLLM {want!r}, model {got!r}"]


class Replayer:
    """Drives the model with one golden operation at a time, as vLLM's scheduler did."""

    def __init__(self, sc: dict[str, Any]) -> None:
        self.m = VllmLifecycleModel(
            sc["num_blocks"],
            sc["block_size"],
            hash_algo=sc["hash_algo"],
            seed=sc["none_hash_seed"],
        )
        assert self.m.none_hash.hex() == sc["none_hash_hex"]

    def running(self) -> bool:
        return any(r.status is Status.RUNNING for r in self.m.requests.values())

    def apply(self, op: dict[str, Any]) -> dict[str, Any] | None:
        m, rid, kind = self.m, op["id"], op["op"]
        result: dict[str, Any] | None
        if kind == "admit":
            res = m.admit(
                rid,
                None if op.get("resume") else op["tokens"],
                chunk=op["chunk"],
                lookahead=op["lookahead"],
                must_fit=op["must_fit"],
                has_scheduled=self.running(),
            )
            result = (
                None
                if res is None
                else {
                    "hit": res.hit,
                    "scheduled": res.scheduled,
                    "new_blocks": res.new_blocks,
                }
            )
        elif kind == "prefill":
            r = m.requests[rid]
            n = min(r.num_tokens - r.num_computed, op["chunk"])
            blocks = m.schedule(rid, n, lookahead=op["lookahead"])
            result = None if blocks is None else {"scheduled": n, "new_blocks": blocks}
        elif kind == "decode":
            drafts = op["drafts"]
            blocks = m.schedule(
                rid, 1 + len(drafts), lookahead=op["lookahead"], draft_token_ids=drafts
            )
            result = None if blocks is None else {"new_blocks": blocks}
            if blocks is not None:
                acc = op["accept"]
                m.commit_tokens(rid, drafts[:acc] + [op["bonus"]], len(drafts) - acc)
        elif kind == "preempt":
            m.preempt(rid)
            result = {}
        elif kind == "finish":
            if m.requests[rid].status is Status.PREEMPTED:
                m.free(rid)  # vLLM frees a preempted request's (empty) table too
                m.requests[rid].status = Status.FINISHED
            else:
                m.finish(rid)
            result = {}
        else:
            raise AssertionError(f"unknown op {kind}")
        if "sampled" in op:
            m.commit_tokens(rid, [op["sampled"]])
        return result

    def after(self, rid: str) -> dict[str, Any]:
        r = self.m.requests.get(rid)  # a refused new request was never registered
        return {
            "table": self.m.block_table(rid),
            "num_computed": r.num_computed if r else 0,
            "num_tokens": r.num_tokens if r else 0,
            "free_queue": self.m.free_queue(),
            "num_free": self.m.num_free,
        }


def _replay(sc: dict[str, Any]) -> Replayer:
    rp = Replayer(sc)
    for i, op in enumerate(sc["ops"]):
        result = rp.apply(op)
        got = {"result": result, "after": rp.after(op["id"]), "events": rp.m.take_events()}
        want = {"result": op["result"], "after": op["after"], "events": op["events"]}
        diff = _diff(want, got)
        if diff:
            brief = {k: v for k, v in op.items() if k not in ("tokens", "after", "events")}
            pytest.fail(
                f"{sc['hash_algo']} bs={sc['block_size']} op #{i} {brief}:\n  "
                + "\n  ".join(diff[:20])
            )
        rp.m.check_invariants()
    return rp


@pytest.mark.parametrize(
    "sc", SCENARIOS, ids=[f"{s['hash_algo']}-bs{s['block_size']}" for s in SCENARIOS]
)
def test_golden_lifecycle_replay(sc: dict[str, Any]) -> None:
    _replay(sc)


def test_golden_file_covers_the_lifecycle() -> None:
    ops = [op for sc in SCENARIOS for op in sc["ops"]]
    assert len(SCENARIOS) == 6 and len(ops) == 900
    assert sum(op["result"] is None for op in ops) > 0  # refusals
    assert sum(bool(op.get("resume")) for op in ops) > 0
    assert sum(op["op"] == "decode" and op["accept"] < len(op["drafts"]) for op in ops) > 0
    assert sum(op.get("lookahead", 0) > 0 for op in ops) > 0
    assert sum(op.get("must_fit", False) for op in ops) > 0


def test_stats_count_resumed_hits_apart() -> None:
    rp = Replayer(SCENARIOS[0])
    admitted: dict[str, int] = {}
    resumed: dict[str, int] = {}
    for op in SCENARIOS[0]["ops"]:
        before = rp.m.requests[op["id"]].num_preemptions if op["id"] in rp.m.requests else 0
        rp.apply(op)
        rp.m.take_events()
        if op["op"] == "admit" and op["result"] is not None:
            bucket = resumed if before else admitted
            r = rp.m.requests[op["id"]]
            bucket["requests"] = bucket.get("requests", 0) + 1
            bucket["queries"] = bucket.get("queries", 0) + r.num_tokens - ("sampled" in op)
            bucket["hits"] = bucket.get("hits", 0) + op["result"]["hit"]
    stats = rp.m.take_stats()
    assert resumed["requests"] > 0
    for k in ("requests", "queries", "hits"):
        assert stats[k] == admitted[k]
        assert stats["preempted_" + k] == resumed[k]
    assert all(v == 0 for v in rp.m.take_stats().values())


# ---------------------------------------------------------------------------- semantics


def _model(num_blocks: int = 32, bs: int = 4) -> VllmLifecycleModel:
    return VllmLifecycleModel(num_blocks, bs, hash_algo="sha256", seed="0")


def _stored(events: list[dict[str, Any]]) -> int:
    return sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")


def test_chunk_blocks_visible_when_scheduled() -> None:
    m = _model()
    prompt = list(range(100, 120))  # 5 blocks
    assert m.admit("a", prompt, chunk=6) is not None  # tokens 0..5: block 0 full
    assert m.lookup(prompt) == 4
    assert m.schedule("a", 6) is not None  # tokens 6..11: blocks 1, 2 full
    assert m.lookup(prompt) == 12
    # a second request now hits what "a" is still prefilling
    b = m.admit("b", prompt + [7], chunk=64)
    assert b is not None and b.hit == 12


def test_lookahead_and_drafts_are_never_cached() -> None:
    m = _model()
    m.admit("a", list(range(7)), lookahead=4)  # 7 tokens + 4 lookahead -> 3 blocks
    assert len(m.block_table("a")) == 3
    assert _stored(m.take_events()) == 1  # only block 0 (tokens 0..3) is full
    m.commit_tokens("a", [7])  # sampled: now 8 known ids, block 1 full but not cached
    assert m.lookup(list(range(8)) + [99]) == 4
    m.schedule("a", 3, draft_token_ids=[8, 9])  # pending 7 + drafts 8, 9
    assert _stored(m.take_events()) == 1  # block 1 (ids 4..7) cached, drafts not
    m.commit_tokens("a", [8, 50], num_rejected=1)  # draft 9 rejected, bonus 50
    r = m.requests["a"]
    assert r.num_computed == 9 and r.tokens[-2:] == [8, 50]
    held = m.block_table("a")
    assert m.schedule("a", 1) == []  # the rejected draft's slot is reused
    assert m.block_table("a") == held
    m.check_invariants()


def test_async_placeholders_cache_only_known_ids() -> None:
    m = _model()
    m.admit("a", list(range(6)))  # samples position 6 (pending)
    m.take_events()
    # async: schedule position 6 before its id is known, and position 7 after it
    assert m.schedule("a", 1) is not None
    assert m.requests["a"].pending == 2
    with pytest.raises(LifecycleError):
        m.schedule("a", 2)  # positions 8, 9: only 8 (sampled by the step in flight) will come
    assert m.take_events() == []  # block 1 (positions 4..7) has unknown ids
    m.commit_tokens("a", [6])
    m.commit_tokens("a", [7])  # block 1's last id is known: hashed, not yet cached
    assert m.take_events() == []
    assert m.lookup(list(range(8)) + [0]) == 4
    with pytest.raises(LifecycleError):
        m.commit_tokens("a", [8])  # no placeholder left
    m.schedule("a", 1)  # the next scheduling call caches it
    assert _stored(m.take_events()) == 1
    assert m.lookup(list(range(8)) + [0]) == 8
    m.check_invariants()


def test_external_hits_with_delayed_caching() -> None:
    m = _model()
    prompt = list(range(40, 58))  # 18 tokens
    a = m.admit("a", prompt, external_prefix=12, delay_cache=True)
    assert a is not None and a.scheduled == 0 and len(a.new_blocks) == 3
    assert m.requests["a"].status is Status.WAITING_FOR_REMOTE_KVS
    assert m.take_events() == [] and m.lookup(prompt) == 0
    m.finish_transfer("a")
    assert _stored(m.take_events()) == 3 and m.lookup(prompt) == 12
    assert m.schedule("a", 6) is not None
    assert m.requests["a"].num_computed == 18 and m.requests["a"].pending == 1
    assert _stored(m.take_events()) == 1  # block 3 (tokens 12..15)
    # without delay the external blocks are cached at once
    b = m.admit("b", [1] * 9, external_prefix=9)  # capped at num_tokens - 1
    assert b is not None and b.scheduled == 1 and _stored(m.take_events()) == 2
    m.check_invariants()


def test_refusal_changes_nothing() -> None:
    m = _model(num_blocks=6, bs=4)  # 5 usable blocks
    m.admit("a", list(range(12)))  # 3 blocks
    m.finish("a")
    m.take_events()
    q, cached = m.free_queue(), dict(m.cached)
    # hit 12 tokens (3 idle cached blocks count as consumed) + 3 new blocks > 5 free
    assert m.admit("b", list(range(12)) + list(range(50, 60)), must_fit=True, chunk=4) is None
    assert "b" not in m.requests and m.free_queue() == q and m.cached == cached
    assert m.take_events() == [] and m.take_stats()["requests"] == 1
    assert m.admit("c", list(range(12)) + [1], chunk=4, must_fit=True) is not None


def test_watermark_applies_to_admissions_with_running_requests() -> None:
    m = VllmLifecycleModel(11, 4, watermark=0.2)  # 2 blocks of watermark
    assert m.admit("a", list(range(28)), has_scheduled=False) is not None  # 7 of 10
    assert m.admit("b", list(range(100, 108)), has_scheduled=True) is None  # 2 + 2 > 3
    assert m.admit("b", list(range(100, 104)), has_scheduled=True) is not None  # 1 + 2


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.schedule("nope", 1),
        lambda m: m.schedule("a", 0),
        lambda m: m.schedule("a", 5),  # beyond known ids + the one placeholder
        lambda m: m.schedule("a", 1, lookahead=-1),
        lambda m: m.commit_tokens("a", [1, 2]),  # one placeholder only
        lambda m: m.commit_tokens("a", [1], num_rejected=1),  # no drafts in flight
        lambda m: m.commit_batch(["a", "a"], [[1], [2]]),
        lambda m: m.admit("a", [1, 2]),  # duplicate id
        lambda m: m.admit("z", [1, 2], chunk=0),
        lambda m: m.admit("z", [1, 2], external_prefix=-1),
        lambda m: m.admit_batch(["z", "a"], [[1], [2]]),  # "a" exists: "z" not admitted either
        lambda m: m.finish("nope"),
        lambda m: m.preempt("f"),  # finished
    ],
)
def test_caller_errors_leave_state_unchanged(call: Any) -> None:
    m = _model()
    m.admit("a", list(range(6)))
    m.admit("f", list(range(3)))
    m.finish("f")
    before = (m.free_queue(), m.block_table("a"), dict(m.requests["a"].__dict__), len(m.requests))
    with pytest.raises(LifecycleError):
        call(m)
    after = (m.free_queue(), m.block_table("a"), dict(m.requests["a"].__dict__), len(m.requests))
    assert before == after
    m.check_invariants()


def test_schedule_batch_stops_at_first_refusal() -> None:
    m = _model(num_blocks=5, bs=2)  # 4 usable
    for rid in "abc":
        m.admit(rid, [ord(rid), 1])  # 1 block each, all full, each samples
        m.commit_tokens(rid, [5])
    done = m.schedule_batch(["a", "b", "c"], [1, 1, 1])  # each needs a 2nd block; 1 free
    assert len(done) == 1 and m.requests["b"].num_computed == 2
    m.preempt("c")
    assert len(m.schedule_batch(["b"], [1])) == 1
    m.check_invariants()


@pytest.mark.parametrize("seed", range(5))
def test_one_chunk_special_case_is_the_whole_prompt_model(seed: int) -> None:
    """``admit`` without ``chunk`` + ``append`` = ``HashChainModel``'s admit / append / free."""
    rng = random.Random(seed)
    bs, nb = rng.choice([2, 4, 8]), rng.choice([12, 24, 48])
    new = VllmLifecycleModel(nb, bs, hash_algo="sha256")
    old = HashChainModel(nb, bs)
    system = [rng.randrange(1000) for _ in range(3 * bs)]
    live: list[int] = []
    for step in range(300):
        u = rng.random()
        if u < 0.35 or not live:
            toks = system[: rng.randrange(len(system) + 1)]
            toks = toks + [rng.randrange(1000) for _ in range(rng.randrange(1, 3 * bs))]
            a = new.admit(step, toks)
            b = old.admit(step, toks)
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert (a.hit, new.block_table(step)) == b
                live.append(step)
        elif u < 0.75:
            rid = rng.choice(live)
            toks = [rng.randrange(1000) for _ in range(rng.randrange(1, bs + 2))]
            assert new.append(rid, toks) == old.append(rid, toks)
        else:
            rid = live.pop(rng.randrange(len(live)))
            new.finish(rid)
            old.free(rid)
        assert new.free_queue() == old.free_queue()
        assert set(new.cached) == set(old.map)
        new.check_invariants()


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash_cbor"])
def test_model_hashes_match_kvindex(algo: str) -> None:
    np = pytest.importorskip("numpy")
    kvindex = pytest.importorskip("kvindex")
    m = VllmLifecycleModel(8, 4, hash_algo=algo, seed="0")
    r = m.add_request("a", list(range(-3, 30)), cache_salt="s1", lora=("n1", "/p"))
    native = kvindex.block_hashes(
        np.array(r.tokens, dtype=np.int64),
        4,
        algo="vllm_" + algo,
        seed="0",
        cache_salt="s1",
        lora=("n1", "/p"),
    )
    assert [bytes(row) for row in native] == r.hashes


# ---------------------------------------------------------------------------- radix side


def _vllm_prefixes(
    m: VllmLifecycleModel, prefix_of: dict[bytes, tuple[int, ...]]
) -> set[tuple[int, ...]]:
    """The token prefix of every cached hash (``prefix_of`` is filled incrementally)."""
    bs = m.block_size
    for h in m.cached:
        if h not in prefix_of:
            for r in m.requests.values():
                for i in range(len(r.hashes) - 1, -1, -1):
                    if r.hashes[i] in prefix_of:
                        break
                    prefix_of[r.hashes[i]] = tuple(r.tokens[: (i + 1) * bs])
    return {prefix_of[h] for h in m.cached}


@pytest.mark.parametrize("seed", range(12))
def test_radix_and_hash_chain_cache_the_same_tokens_at_the_same_moments(seed: int) -> None:
    """Both designs under one op stream, unbounded capacity, page size = block size."""
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8])
    vm = VllmLifecycleModel(4096, bs, hash_algo="sha256")
    rm = RadixLifecycleModel(bs)
    systems = [[rng.randrange(50) for _ in range(rng.randrange(1, 5 * bs))] for _ in range(3)]
    rids: list[int] = []
    prefix_of: dict[bytes, tuple[int, ...]] = {}
    n_cached = 0
    for step in range(400):
        rid = rng.choice(rids) if rids and rng.random() < 0.85 else step
        r = vm.requests.get(rid)
        if r is None:
            act = "a"
        elif r.status is Status.PREEMPTED:
            act = rng.choice("rrrf")
        else:
            act = rng.choice("ssssccccpf")
        call: tuple[str, tuple[Any, ...], dict[str, Any]]
        if act == "a":
            toks = rng.choice(systems)[: rng.randrange(1, 5 * bs)]
            toks = toks + [rng.randrange(50) for _ in range(rng.randrange(0, 2 * bs))]
            kw = {"chunk": rng.randrange(1, 3 * bs + 1), "lookahead": rng.randrange(4)}
            rids.append(rid)
            call = ("admit", (rid, toks), kw)
        elif act == "r":
            kw = {"chunk": rng.choice([None, rng.randrange(1, 3 * bs + 1)])}
            call = ("admit", (rid, None), kw)
        elif act == "s":
            assert r is not None
            drafts = [rng.randrange(50) for _ in range(rng.choice([0, 0, 1, 3]))]
            left = r.num_tokens + r.pending - r.num_computed
            n = (left if drafts else rng.randrange(1, max(left, 1) + 1)) + len(drafts)
            la = rng.randrange(4)
            call = ("schedule", (rid, n), {"lookahead": la, "draft_token_ids": drafts})
        elif act == "c":
            assert r is not None
            acc = rng.randrange(len(r.spec) + 1)
            ids = r.spec[:acc] + [rng.randrange(50) for _ in range(rng.choice([0, 1, 1, 2]))]
            rej = len(r.spec) - acc
            call = ("commit_tokens", (rid, ids, rej), {})
        else:
            call = ("preempt" if act == "p" else "finish", (rid,), {})
        outcomes = []
        for m in (vm, rm):
            try:
                outcomes.append(getattr(m, call[0])(*call[1], **call[2]))
            except LifecycleError as e:
                outcomes.append(type(e))
        a, b = outcomes
        assert (a is LifecycleError) == (b is LifecycleError), (step, act, a, b)
        if act in "ar" and a is not LifecycleError:
            assert a is not None and b is not None and a.hit == b.hit, (step, a, b)
        cached = _vllm_prefixes(vm, prefix_of)
        assert cached == rm.cached_prefixes(), (step, act)
        if rid in vm.requests and vm.requests[rid].status is not Status.FINISHED:
            x, y = vm.requests[rid], rm.requests[rid].req
            assert (x.tokens, x.num_computed, x.pending) == (y.tokens, y.num_computed, y.pending)
        n_cached = max(n_cached, len(cached))
        if act == "f" and a is None:
            rids.remove(rid)
        vm.check_invariants()
        rm.check_invariants()
    assert n_cached > 0


# ---------------------------------------------------------------------------- state machine


class LifecycleMachine(RuleBasedStateMachine):
    """Every protocol call in random order on a small pool; after every step the model's
    invariants hold and the KV events replay to exactly the cached copies. The Rust caches
    are meant to run under the same rules, compared call for call with this model."""

    def __init__(self) -> None:
        super().__init__()
        self.m = VllmLifecycleModel(16, 2, hash_algo="sha256", watermark=0.1)
        self.copies: dict[int, int] = {}  # low-64 hash -> cached physical copies, from events
        self.next_id = 0

    def _live(self, *statuses: Status) -> list[int | str]:
        return [rid for rid, r in self.m.requests.items() if r.status in statuses]

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
        resumable = self._live(Status.PREEMPTED)
        resume = bool(resumable) and data.draw(st.booleans())
        rid = data.draw(st.sampled_from(resumable)) if resume else self.next_id
        self.next_id += not resume
        try:
            self.m.admit(
                rid,
                None if resume else toks,
                chunk=chunk,
                lookahead=lookahead,
                must_fit=must_fit,
                external_prefix=external,
                delay_cache=delay,
                has_scheduled=bool(self._live(Status.RUNNING)),
            )
        except LifecycleError:
            pass

    @rule(data=st.data(), lookahead=st.integers(0, 4), n_drafts=st.integers(0, 3))
    def schedule(self, data: Any, lookahead: int, n_drafts: int) -> None:
        live = self._live(Status.RUNNING)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        r = self.m.requests[rid]
        left = r.num_tokens + r.pending - r.num_computed
        n = data.draw(st.integers(1, max(left, 1))) if not n_drafts else left + n_drafts
        drafts = data.draw(st.lists(st.integers(0, 3), min_size=n_drafts, max_size=n_drafts))
        try:
            self.m.schedule(rid, n, lookahead=lookahead, draft_token_ids=drafts)
        except LifecycleError:
            pass

    @rule(data=st.data(), extra=st.integers(0, 2))
    def commit(self, data: Any, extra: int) -> None:
        live = self._live(Status.RUNNING)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        r = self.m.requests[rid]
        acc = data.draw(st.integers(0, len(r.spec)))
        ids = r.spec[:acc] + data.draw(st.lists(st.integers(0, 3), min_size=extra, max_size=extra))
        try:
            self.m.commit_tokens(rid, ids, len(r.spec) - acc)
        except LifecycleError:
            pass

    @rule(data=st.data())
    def transfer_done(self, data: Any) -> None:
        waiting = self._live(Status.WAITING_FOR_REMOTE_KVS)
        if waiting:
            self.m.finish_transfer(data.draw(st.sampled_from(waiting)))

    @rule(data=st.data(), finish=st.booleans())
    def preempt_or_finish(self, data: Any, finish: bool) -> None:
        live = self._live(Status.RUNNING, Status.WAITING_FOR_REMOTE_KVS, Status.PREEMPTED)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        if finish:
            self.m.finish(rid)
        elif self.m.requests[rid].status is not Status.PREEMPTED:
            self.m.preempt(rid)

    @rule(x=st.integers(0, 15))
    def reset(self, x: int) -> None:
        if x == 15:  # rarely: a reset wipes the cache the other rules build
            self.m.reset_prefix_cache()

    @invariant()
    def consistent(self) -> None:
        self.m.check_invariants()
        for e in self.m.take_events():
            if e["type"] == "AllBlocksCleared":
                self.copies.clear()
            for h in e.get("block_hashes", ()):
                self.copies[h] = self.copies.get(h, 0) + (1 if e["type"] == "BlockStored" else -1)
        want: dict[int, int] = {}
        for h, blocks in self.m.cached.items():
            low = int.from_bytes(h, "big") & ((1 << 64) - 1)
            want[low] = want.get(low, 0) + len(blocks)
        assert {h: c for h, c in self.copies.items() if c} == want


TestLifecycleMachine = LifecycleMachine.TestCase
TestLifecycleMachine.settings = settings(max_examples=150, stateful_step_count=40)


# ---------------------------------------------------------------------------- whole-prompt traces

_EVENTS = json.loads((GOLDEN.parent / "vllm_kv_events.json").read_text())["scenarios"]


@pytest.mark.parametrize(
    "sc", _EVENTS, ids=[f"{i}-{s['hash_algo']}-bs{s['block_size']}" for i, s in enumerate(_EVENTS)]
)
def test_golden_kv_event_batches_are_the_one_chunk_case(sc: dict[str, Any]) -> None:
    """vLLM's whole-prompt KV-event traces (``vllm_kv_events.json``: admit, decode tokens
    computed one step per token, finish, reset) through ``admit`` / ``append`` /
    ``finish``: hits, block tables and every event batch as vLLM published them."""
    m = VllmLifecycleModel(
        sc["num_blocks"], sc["block_size"], hash_algo=sc["hash_algo"], seed=sc["none_hash_seed"]
    )
    for i, step in enumerate(sc["steps"]):
        for op in step["ops"]:
            kind, rid = op["op"], op.get("id")
            if kind == "admit":
                res = m.admit(rid, op["tokens"], cache_salt=op.get("cache_salt"))
                got = None if res is None else (res.hit, m.block_table(rid))
                want = None if op["hit"] is None else (op["hit"], op["blocks"])
                assert got == want, (i, op)
            elif kind == "append":  # one decode step per token, up to the first refusal
                before = len(m.block_table(rid))
                ok = all(m.append(rid, [t]) for t in op["tokens"])
                got = m.block_table(rid)[before:] if ok else None
                assert got == op["new_blocks"], (i, op)
            elif kind == "finish":
                m.finish(rid)
            else:
                assert kind == "reset" and m.reset_prefix_cache()
        fields = ("type", "block_hashes", "parent_block_hash", "token_ids")
        want_events = [{k: e[k] for k in fields if k in e} for e in step["decoded"][1]]
        assert m.take_events() == want_events, i
        m.check_invariants()
