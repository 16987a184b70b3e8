"""Threading model.

Cache objects belong to one scheduler thread; their methods never release the GIL, so
on a GIL build calls from several threads are serialised and every invariant holds
afterwards (no lost update). ``block_hashes`` is pure and releases the GIL.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kvindex


@pytest.mark.parametrize("design", ["hash_chain", "radix"])
def test_concurrent_callers_are_serialised(design: str) -> None:
    cache = kvindex.make_cache(design, 4096, 16)
    errors: list[BaseException] = []
    per_thread = 60

    def worker(t: int) -> None:
        try:
            rng = np.random.default_rng(t)
            for i in range(per_thread):
                rid = t * 10_000 + i
                prompt = np.concatenate(
                    [np.arange(64, dtype=np.int32), rng.integers(0, 1000, 40, dtype=np.int32)]
                )
                assert cache.admit(rid, prompt) is not None
                for _ in range(5):
                    assert cache.append(rid, rng.integers(0, 1000, 3, dtype=np.int32))
                assert cache.num_tokens(rid) == 104 + 15
                cache.free(rid)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert cache.num_requests == 0
    assert cache.stats["requests"] == 4 * per_thread  # no lost update
    cache.check_invariants()


def test_block_hashes_from_threads_match_sequential() -> None:
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 100_000, 50_000, dtype=np.int32) for _ in range(6)]
    want = [kvindex.block_hashes(p, 16) for p in prompts]
    got: list[np.ndarray | None] = [None] * len(prompts)

    def run(i: int) -> None:
        got[i] = kvindex.block_hashes(prompts[i], 16)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for w, g in zip(want, got, strict=True):
        assert g is not None and np.array_equal(w, g)


def test_internal_panic_surfaces_as_exception_and_process_stays_usable() -> None:
    """A broken internal invariant panics loudly; PyO3 turns the panic into a
    Python exception (no abort), and the interpreter and other caches keep working."""
    from kvindex._core import _force_panic_for_tests

    cache = kvindex.HashChainCache(16, 4)
    cache.admit(1, np.arange(10, dtype=np.int32))
    with pytest.raises(BaseException) as info:
        _force_panic_for_tests()
    assert type(info.value).__name__ == "PanicException"
    assert "forced" in str(info.value)
    cache.check_invariants()
    assert cache.append(1, np.arange(3, dtype=np.int32))
    cache.free(1)
    cache.check_invariants()
