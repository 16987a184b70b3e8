"""Router policies over a ClusterIndex: Dynamo-shaped kv cost, baselines, approx mode."""

from __future__ import annotations

import numpy as np
import pytest

from kvindex.cluster import ClusterIndex, Router

BS = 4


def index_with(n: int) -> ClusterIndex:
    ix = ClusterIndex(BS)
    for i in range(n):
        ix.add_worker(f"w{i}")
    return ix


def prompt(seed: int, n_tokens: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n_tokens).astype(np.int32)


def test_kv_prefers_overlap_until_load_outweighs_it() -> None:
    ix = index_with(3)
    p = prompt(1)  # 8 blocks
    ix.store_hashes(1, ix.hashes(p)[:6])
    r = Router(ix, "kv")
    d = r.route(p)
    assert d is not None and (d.worker, d.overlap_blocks, d.blocks) == (1, 6, 8)
    assert d.flagged  # worker 1 has no stream yet: resyncing
    assert r.load.tolist() == [0.0, 8.0, 0.0]
    # Now worker 1 carries 8 blocks of load: cost 2 + 8 > 8 + 0 elsewhere.
    d2 = r.route(p)
    assert d2 is not None and d2.worker != 1
    r.finish(d)
    assert r.load[1] == 0.0
    d3 = r.route(p)
    assert d3 is not None and d3.worker == 1


def test_baselines() -> None:
    ix = index_with(4)
    p = prompt(2)
    rr = Router(ix, "round_robin")
    got = []
    for _ in range(8):
        d = rr.route(p)
        assert d is not None
        got.append(d.worker)
    assert sorted(got[:4]) == [0, 1, 2, 3] and got[:4] == got[4:]
    ll = Router(ix, "least_loaded")
    ds = [ll.route(p) for _ in range(4)]
    assert sorted(d.worker for d in ds if d is not None) == [0, 1, 2, 3]
    rnd = Router(ix, "random", seed=3)
    assert len({d.worker for d in (rnd.route(p) for _ in range(20)) if d}) > 1
    r1, r2 = Router(ix, "random", seed=3), Router(ix, "random", seed=3)
    assert [r1.route(p) for _ in range(10)] == [r2.route(p) for _ in range(10)]
    with pytest.raises(ValueError):
        Router(ix, "nope")


def test_workers_added_and_removed_at_runtime() -> None:
    ix = index_with(2)
    r = Router(ix, "least_loaded")
    p = prompt(3)
    for _ in range(4):
        r.route(p)
    ix.remove_worker(0)
    ds = [r.route(p) for _ in range(3)]
    assert all(d is not None and d.worker == 1 for d in ds)
    ix.add_worker("new")
    d = r.route(p)
    assert d is not None and d.worker == 0  # the new worker, unloaded
    ix.remove_worker(1)
    ix.remove_worker(0)
    assert r.route(p) is None


def test_approx_mode_records_and_expires() -> None:
    now = [0.0]
    ix = index_with(3)
    r = Router(ix, "approx", ttl=10.0, clock=lambda: now[0])
    p = prompt(4)
    d1 = r.route(p)
    assert d1 is not None and d1.overlap_blocks == 0 and not d1.flagged
    r.finish(d1)
    d2 = r.route(p)
    assert d2 is not None and d2.worker == d1.worker and d2.overlap_blocks == 8
    r.finish(d2)
    now[0] = 5.0
    d3 = r.route(np.concatenate([p, prompt(5, 8)]))
    assert d3 is not None and d3.worker == d1.worker and d3.overlap_blocks == 8
    r.finish(d3)
    now[0] = 12.0  # d1, d2 expired; d3 (until 15) still holds the prompt's blocks
    assert ix.overlaps(p).tolist()[d1.worker] == 8
    d4 = r.route(prompt(6))
    assert d4 is not None
    assert ix.worker_info(d1.worker)["blocks"] == 10 + 8 * (d4.worker == d1.worker)
    now[0] = 30.0
    r.route(prompt(8))
    ix.check_invariants()
    assert ix.num_pairs == 8  # only the last decision is remembered


def test_a_worker_replaced_in_its_slot_starts_fresh() -> None:
    now = [0.0]
    ix = index_with(2)
    r = Router(ix, "approx", ttl=10.0, clock=lambda: now[0])
    p = prompt(9)
    d = r.route(p)
    assert d is not None
    w = d.worker
    ix.remove_worker(w)
    assert ix.add_worker("replacement") == w
    assert r.load[w] == 0.0  # the old request's load left with the old worker
    ix.store_hashes(w, ix.hashes(p))  # the new worker announces the same blocks itself
    r.finish(d)  # the old worker's request: nothing to take back
    assert r.load[w] == 0.0
    now[0] = 20.0
    r.route(prompt(10))  # expires d's record: it must not touch the new worker's blocks
    assert ix.overlaps(p).tolist()[w] == 8
    ix.check_invariants()
