"""``checkpoint`` on both designs: it makes hittable exactly what the hash chain has cached.

The hash chain follows vLLM 0.33: a block is cached at the step that schedules its tokens,
once all its ids are known (a block a commit completes is cached at the next ``schedule``),
and a ``delay_cache`` admission caches nothing until ``finish_transfer`` (its external KV
has not landed). ``checkpoint`` on the hash chain only checks the id; on the radix cache
it inserts the running request's full pages — only those the hash chain would have cached
by then. So both designs, driven by one call sequence with ``checkpoint`` anywhere in it,
answer every lookup and admission the same.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import kvindex

BS = 4


def _arr(xs: Any) -> np.ndarray:
    return np.asarray(list(xs), dtype=np.int64)


def _designs(num_blocks: int = 4096, bs: int = BS) -> list[Any]:
    return [kvindex.HashChainCache(num_blocks, bs), kvindex.RadixPrefixCache(num_blocks, bs)]


@pytest.mark.parametrize("design", [0, 1], ids=["hash_chain", "radix"])
def test_checkpoint_during_a_transfer_makes_nothing_hittable(design: int) -> None:
    c = _designs(64)[design]
    p = _arr(range(100, 117))  # 17 tokens: 4 full blocks
    got = c.admit_chunk(1, p, external_prefix=16, delay_cache=True)
    assert got is not None and got[:2] == (0, 0)
    assert c.request_state(1)["status"] == "waiting_for_remote_kvs"
    c.checkpoint(1)
    # The external pages hold no KV yet: no other request may hit them.
    assert c.lookup(p) == 0
    other = c.admit_chunk(2, p)
    assert other is not None and other[0] == 0
    c.finish(2)
    c.check_invariants()
    c.finish_transfer(1)
    assert c.lookup(p) == 16
    c.checkpoint(1)
    assert c.lookup(p) == 16
    c.check_invariants()


@pytest.mark.parametrize("design", [0, 1], ids=["hash_chain", "radix"])
def test_a_block_a_commit_completes_is_hittable_from_the_next_schedule(design: int) -> None:
    c = _designs(64)[design]
    c.admit_chunk(1, _arr(range(7)))  # 7 positions scheduled; samples position 7
    # Async scheduling: position 7 is scheduled before its id is known (a placeholder).
    c.schedule(1, 1)
    assert c.lookup(_arr(range(9))) == 4
    c.commit_tokens(1, _arr([7]))  # block 1 (ids 4..7) is known now, cached next step
    c.checkpoint(1)
    assert c.lookup(_arr(range(9))) == 4
    c.schedule(1, 1)
    assert c.lookup(_arr(range(9))) == 8
    c.checkpoint(1)
    assert c.lookup(_arr(range(9))) == 8
    c.check_invariants()


def _same(cs: list[Any], method: str, *args: Any, **kw: Any) -> Any:
    """Calls ``method`` on each design: both raise a ``KvIndexError`` or both answer alike
    (block ids aside, which differ by design)."""
    outs: list[Any] = []
    for c in cs:
        try:
            r = getattr(c, method)(*args, **kw)
        except kvindex.KvIndexError as e:
            outs.append(("error", type(e)))
            continue
        if isinstance(r, tuple):  # (hit, scheduled, new blocks)
            r = r[:2]
        elif isinstance(r, np.ndarray):
            r = "blocks"
        outs.append(("ok", r))
    assert outs[0] == outs[1], (method, args, kw, outs)
    return outs[0]


def _drive(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    cs = _designs(4096, bs)
    system = [rng.randrange(30) for _ in range(rng.randrange(1, 4 * bs))]
    prompts: dict[int, list[int]] = {}
    nid = 0
    for _ in range(steps):
        u = rng.random()
        live = sorted(prompts)
        if u < 0.25 or not live:
            nid += 1
            prompt = system[: rng.randrange(len(system) + 1)]
            prompt = prompt + [rng.randrange(30) for _ in range(rng.randrange(1, 4 * bs))]
            kw: dict[str, Any] = {"chunk": rng.choice([None, 1, 2, bs, 3 * bs])}
            kw["lookahead"] = rng.randrange(3)
            if rng.random() < 0.3:
                kw["external_prefix"] = rng.randrange(len(prompt) + 1)
                kw["delay_cache"] = rng.random() < 0.6
            out = _same(cs, "admit_chunk", nid, _arr(prompt), **kw)
            if out[0] == "ok" and out[1] is not None:
                prompts[nid] = prompt
        else:
            x = rng.choice(live)
            st = cs[0].request_state(x)
            assert st == cs[1].request_state(x)
            if u < 0.4:
                _same(cs, "checkpoint", x)
            elif st["status"] == "preempted":
                chunk = rng.choice([None, 1, bs])
                _same(cs, "resume", x, chunk=chunk)
            elif st["status"] == "waiting_for_remote_kvs":
                if rng.random() < 0.7:
                    _same(cs, "finish_transfer", x)
            elif u < 0.65:
                left = st["num_tokens"] - st["num_computed"]
                if left > 0 and rng.random() < 0.8:
                    n, drafts = min(left, rng.choice([1, 2, bs])), []
                else:
                    ready = st["pending"] == 0 and left == 0
                    drafts = [rng.randrange(30) for _ in range(rng.randrange(3))] if ready else []
                    n = len(drafts) + 1 if drafts else rng.randrange(1, 3)
                _same(cs, "schedule", x, n, draft_tokens=_arr(drafts))
            elif u < 0.88:
                acc = rng.randrange(len(st["drafts"]) + 1)
                ids = st["drafts"][:acc] + [rng.randrange(30) for _ in range(min(st["pending"], 2))]
                rej = len(st["drafts"]) - acc
                _same(cs, "commit_tokens", x, _arr(ids), rej)
            elif u < 0.94:
                _same(cs, "preempt", x)
            else:
                _same(cs, "finish", x)
                prompts.pop(x)
        for c in cs:
            c.check_invariants()
        # Every prompt seen so far, and every prefix of the system prompt, hits alike.
        for q in [*prompts.values(), system]:
            for k in (len(q), max(len(q) - 1, 1)):
                assert cs[0].lookup(_arr(q[:k])) == cs[1].lookup(_arr(q[:k]))


@pytest.mark.parametrize("seed", range(10))
def test_both_designs_answer_one_call_sequence_alike(seed: int) -> None:
    _drive(seed, 300)
