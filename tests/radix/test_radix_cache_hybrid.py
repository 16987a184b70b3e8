"""The request-level radix cache over hybrid layouts (``make_cache("radix", groups=...)``):
a sliding-window pool beside the full pool (pages leave a request's window as it decodes;
the tree keeps tombstones), Mamba state slots (one per running request, forked at a
checkpoint, donated at free), and random request streams keeping every invariant."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kvindex

GPT_OSS_1 = [("full_attention", 1, 0, ""), ("sliding_window", 1, 4, "")]
QWEN3_NEXT_2 = [("full_attention", 2, 0, ""), ("mamba", 2, 0, "align")]


def toks(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


def hit(c: kvindex.RadixPrefixCache, rid: int, prompt: np.ndarray) -> int | None:
    """Tokens an admission hits, or None when it waits."""
    a = c.admit(rid, prompt)
    return None if a is None else a.num_cached_tokens


def test_swa_pages_leave_the_window_and_the_tree_keeps_a_tombstone() -> None:
    c = kvindex.RadixPrefixCache(64, 1, groups=GPT_OSS_1)
    assert hit(c, 1, np.arange(10, dtype=np.int32)) == 0
    assert c.swa_blocks == (53, 10, 63)
    for t in range(10, 30):
        assert c.append(1, toks(t))
    # The last step saw 29 tokens: max(window, page) = 4 of them and the new one live.
    assert c.swa_blocks is not None and c.swa_blocks[1] == 5
    c.free(1)
    assert c.cached_tokens == 30 and c.swa_sizes == (5, 0)
    assert c.lookup(np.arange(20, dtype=np.int32)) == 0  # ends inside the tombstone
    assert hit(c, 2, np.arange(31, dtype=np.int32)) == 30
    c.check_invariants()


def test_mamba_states_follow_requests() -> None:
    c = kvindex.RadixPrefixCache(64, 2, groups=QWEN3_NEXT_2, mamba_states=2)
    a = np.arange(9, dtype=np.int32)
    assert hit(c, 1, a) == 0 and c.mamba_states == (1, 1, 2)
    c.free(1)
    assert c.mamba_sizes == (1, 0)
    assert hit(c, 2, a) == 8 and c.mamba_states == (0, 2, 2)
    assert hit(c, 3, toks(50, 51, 52)) is None  # every state held
    c.free(2)
    c.check_invariants()


@pytest.mark.parametrize(
    "groups",
    [
        GPT_OSS_1,
        [("full_attention", 2, 0, ""), ("sliding_window", 2, 3, "")],
        QWEN3_NEXT_2,
        [("full_attention", 1, 0, ""), ("sliding_window", 1, 2, ""), ("mamba", 1, 0, "align")],
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_keep_the_invariants(
    groups: list[tuple[str, int, int, str]], seed: int
) -> None:
    rng = random.Random(seed)
    bs = groups[0][1]
    kw: dict[str, int] = {}
    if any(g[0] == "sliding_window" for g in groups):
        kw["swa_blocks"] = 24
    if any(g[0] == "mamba" for g in groups):
        kw["mamba_states"] = 4
    c = kvindex.make_cache("radix", 48, bs, groups=groups, **kw)
    prefixes = [np.array([rng.randrange(4) for _ in range(12)], dtype=np.int32) for _ in range(3)]
    running: set[int] = set()
    for rid in range(300):
        op = rng.random()
        if op < 0.4 or not running:
            p = prefixes[rng.randrange(3)][: rng.randrange(1, 12)]
            tail = np.array([rng.randrange(4) for _ in range(rng.randrange(0, 6))], dtype=np.int32)
            if c.admit(rid, np.concatenate([p, tail])) is not None:
                running.add(rid)
        elif op < 0.75:
            r = rng.choice(sorted(running))
            c.append(r, toks(rng.randrange(4)))
        elif op < 0.85:
            c.checkpoint(rng.choice(sorted(running)))
        else:
            r = rng.choice(sorted(running))
            c.free(r)
            running.discard(r)
        c.check_invariants()
    for r in sorted(running):
        c.free(r)
    c.check_invariants()
    c.reset()
    assert c.swa_blocks in (None, (24, 0, 24))
    assert c.mamba_states in (None, (4, 0, 4))
