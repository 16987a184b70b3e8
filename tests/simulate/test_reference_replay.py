"""The in-order replay's "everything fits" pool: a trial on a smaller pool is kept only when
nothing was evicted, so its figures are always those of the full pool."""

from __future__ import annotations

import numpy as np
import pytest

import kvindex.simulate.reference as ref
from kvindex.simulate.reference import replay_in_order


def _seqs(shared: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    base = rng.integers(0, 1000, size=400, dtype=np.int32)
    out = []
    for i in range(40):
        if shared:  # a long common prefix: distinct blocks are a small share of all
            prompt = np.concatenate((base, rng.integers(0, 1000, size=8, dtype=np.int32)))
        else:
            prompt = rng.integers(0, 1000, size=48, dtype=np.int32)
        out.append((prompt, np.arange(i * 10, i * 10 + 4, dtype=np.int32)))
    return out


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("shared", [True, False])
def test_default_pool_gives_the_full_pools_figures(
    design: str, bs: int, shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = _seqs(shared)
    full = -(-sum(len(p) + len(o) for p, o in seqs) // bs) + len(seqs)
    want = replay_in_order(seqs, design, bs, num_blocks=full, per_request=True)
    sizes: list[int] = []
    real = ref.make_cache

    def spy(d: str, n: int, b: int, **kw: object) -> object:
        sizes.append(n - 1)
        return real(d, n, b, **kw)

    monkeypatch.setattr(ref, "make_cache", spy)
    done: list[int] = []
    got = replay_in_order(seqs, design, bs, per_request=True, progress=done.append)
    assert (got.hit_tokens, got.prompt_tokens, got.per_request) == (
        want.hit_tokens,
        want.prompt_tokens,
        want.per_request,
    )
    assert sum(done) == len(seqs)
    # Shared prefixes fit the eighth-size trial; 40 unrelated sequences evict there, and
    # the replay is redone on the full pool.
    assert sizes == ([full // 8] if shared else [full // 8, full])
