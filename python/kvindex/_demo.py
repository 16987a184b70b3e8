"""``kvindex demo``: the hash-chain worked examples of the vLLM design notes, computed by the
library."""

from __future__ import annotations

import numpy as np

from kvindex._core import HashChainCache


def _toks(*parts: range) -> np.ndarray:
    return np.concatenate([np.arange(p.start, p.stop, dtype=np.int32) for p in parts])


def run_demo() -> list[str]:
    """Runs the hash-chain worked examples; returns the printed lines."""
    lines: list[str] = []
    say = lines.append
    say("kvindex demo: vLLM-style block-hash chain, block size 16")

    c = HashChainCache(16, 16)
    c.admit(0, _toks(range(80)))
    c.free(0)
    a = c.admit(1, _toks(range(30), range(1000, 1050)))
    assert a is not None
    say(
        f"  80-token prompt, first 30 tokens cached  -> hit {a.num_cached_tokens:3d} "
        f"tokens, blocks {a.block_ids.tolist()}"
    )
    c.free(1)

    c = HashChainCache(16, 16)
    c.admit(0, _toks(range(80)))
    c.free(0)
    b = c.admit(1, _toks(range(80)))
    assert b is not None
    say(
        f"  identical 80-token prompt (full hit)     -> hit {b.num_cached_tokens:3d} "
        f"tokens, blocks {b.block_ids.tolist()} (last block recomputed)"
    )

    c = HashChainCache(16, 16)
    c.admit(0, _toks(range(100), range(5000, 5020)))
    d = c.admit(1, _toks(range(100), range(6000, 6020)))
    assert d is not None
    say(
        f"  two prompts sharing 100 tokens           -> hit {d.num_cached_tokens:3d} "
        f"tokens, blocks {d.block_ids.tolist()}"
    )

    c = HashChainCache(8, 16)
    prompt = _toks(range(80))
    c.admit(0, prompt)
    c.free(0)
    q = c.free_queue().tolist()
    c.admit(1, _toks(range(9000, 9064)))
    say(
        f"  reverse-order free: queue {q}; after a 4-block request the same prompt "
        f"hits {c.lookup(prompt)} tokens (a shorter prefix, never a hole)"
    )

    c = HashChainCache(32, 16)
    c.admit(0, _toks(range(20)))
    for t in range(200, 212):
        c.append(0, np.asarray([t], dtype=np.int32))
    c.free(0)
    e = c.admit(1, _toks(range(20), range(200, 212), range(300, 310)))
    assert e is not None
    say(
        f"  next turn (20 prompt + 12 generated + 10 new) -> hit {e.num_cached_tokens} "
        f"token{'' if e.num_cached_tokens == 1 else 's'}"
    )
    return lines
