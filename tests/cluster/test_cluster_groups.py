"""KV cache groups in the cluster index, fed over real loopback ZMQ sockets (tcp and ipc):
every group's events are ingested and kept apart, a worker with a declared layout is
scored by the hit its engine would give over its groups (the core's hybrid fixed point on
its per-group membership), a worker without one is scored on full attention and says so,
and a router that scores full attention only picks the wrong worker where hybrid scoring
picks the right one.

Every wait is bounded by a deadline; tcp ports are picked by the OS."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kvindex
from kvindex.cluster import ClusterIndex, ClusterListener, Router
from kvindex.events import EventPublisher

BS = 16
DEADLINE_S = 10.0
# Full attention in blocks of 32, a sliding window of 32 tokens in blocks of 16: hashes at
# 16 (the gcd), hits aligned to 32 (the lcm).
LAYOUT = [("sliding_window", 16, 32, ""), ("full_attention", 32, 0, "")]


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def stored(
    hashes: list[int], bs: int, group: int, kind: str, window: int | None = None
) -> kvindex.BlockStored:
    return kvindex.BlockStored(
        hashes, None, [1] * (bs * len(hashes)), bs, None, "GPU", None, None, group, kind, window
    )


PROMPT = np.arange(100, dtype=np.int32)


def fine() -> list[int]:
    """The prompt's block hashes at 16 tokens, as the engine's events carry them."""
    out: list[int] = ClusterIndex(BS).hashes(PROMPT).tolist()
    return out


def engine_events(full_blocks: int, window_blocks: list[int]) -> list[kvindex.BlockStored]:
    """Events of an engine holding the first `full_blocks` full-attention blocks (of 32)
    and the sliding-window blocks (of 16) `window_blocks`."""
    h = fine()
    return [
        stored([h[2 * j + 1] for j in range(full_blocks)], 32, 1, "full_attention"),
        stored([h[i] for i in window_blocks], 16, 0, "sliding_window", 32),
    ]


@pytest.fixture
def listener() -> Iterator[ClusterListener]:
    with ClusterListener(ClusterIndex(BS), replay_timeout=2.0) as lst:
        yield lst


def connect(
    lst: ClusterListener,
    pub: EventPublisher,
    endpoint: str,
    name: str,
    events: list[kvindex.BlockStored],
    **kw: object,
) -> int:
    slot = lst.add_worker(name, endpoint, **kw)  # type: ignore[arg-type]
    deadline = time.monotonic() + DEADLINE_S
    while lst.index.worker_info(slot)["next_seq"] == 0:
        assert time.monotonic() < deadline, "never connected"
        pub.publish_events(events)  # ZMQ's slow joiner: the first batches may be lost
        time.sleep(0.02)
    return slot


def test_every_group_is_ingested_and_scored_by_its_rules(
    listener: ClusterListener, tmp_path: Path
) -> None:
    ipc = f"ipc://{tmp_path}/b.sock"
    pa = EventPublisher("tcp://127.0.0.1:*", bind=True)
    pb = EventPublisher(ipc)
    try:
        ep_a = pa.endpoint
        # a declares its layout; its window blocks end where its full-attention run ends.
        a = connect(listener, pa, ep_a, "a", engine_events(3, [4, 5]), groups=LAYOUT)
        # b declares nothing and sends one size (16) for both groups.
        h = fine()
        b_events = [
            stored(h[:6], 16, 1, "full_attention"),
            stored(h[4:6], 16, 0, "sliding_window", 32),
        ]
        b = connect(listener, pb, ipc, "b", b_events)
        ix = listener.index
        scores, basis = ix.scores(PROMPT)
        # a: 96 tokens (full 3 x 32, the window's blocks 4, 5 at its end) = 6 blocks of 16.
        assert scores[a] == 6 and basis[a] == "layout"
        # b: no layout; its events named group 1 full attention, so that group is read.
        assert scores[b] == 6 and basis[b] == "full_only_hybrid_events"
        info = ix.worker_info(a)
        assert (
            info["layout"] == [16, 32]
            and info["groups_full"] == [1]
            and info["groups_other"] == [0]
        )
        # The groups are kept apart: group 0's hashes are not group 1's blocks.
        assert ix.overlaps_for_hashes(np.array(h, dtype=np.uint64))[a] == 0
        # a's window blocks go: the engine's hit falls back to the run from block 0 (none).
        pa.publish_events([kvindex.BlockRemoved([h[5]], medium="GPU", group_idx=0)])
        wait_for(lambda: ix.scores(PROMPT)[0][a] != 6, "a's removal")
        assert ix.scores(PROMPT)[0][a] == 0
        # A prompt tail's entry (one 16-token block with one hash in the 32-token group:
        # vLLM's partial-block prefix entry) is ingested as the engine's pool keeps it, not
        # malformed; it never scores (hits are 32-aligned), and its removal drops it.
        before, status = ix.worker_info(a)["malformed"], ix.status(a)
        seq = ix.worker_info(a)["next_seq"]
        pa.publish_events([stored([h[2]], 16, 1, "full_attention")])
        wait_for(lambda: ix.worker_info(a)["next_seq"] > seq, "the tail entry")
        assert ix.worker_info(a)["malformed"] == before and ix.status(a) == status
        assert ix.overlaps_for_hashes(np.array([h[2]], dtype=np.uint64))[a] == 0
        assert ix.scores(PROMPT)[0][a] == 0
        pa.publish_events([kvindex.BlockRemoved([h[2]], medium="GPU", group_idx=1)])
        wait_for(lambda: ix.worker_info(a)["next_seq"] > seq + 1, "the tail's removal")
        assert ix.worker_info(a)["malformed"] == before and ix.status(a) == status
        # An event of a block size its declared group does not have is malformed.
        pa.publish_events([stored(h[:2], 16, 1, "full_attention")])
        wait_for(lambda: ix.worker_info(a)["malformed"] == before + 1, "malformed")
        assert ix.status(a) == "degraded"
        ix.check_invariants()
    finally:
        pa.close()
        pb.close()


def test_a_bad_layout_leaves_no_worker(listener: ClusterListener) -> None:
    with pytest.raises(kvindex.InvalidArgumentError, match="hash block size"):
        listener.add_worker("x", "tcp://127.0.0.1:1", groups=[("full_attention", 32, 0, "")])
    with pytest.raises(kvindex.InvalidArgumentError):
        listener.add_worker("x", "tcp://127.0.0.1:1", groups=[("mamba", 16, 0, "sometimes")])
    assert listener.index.statuses() == [] or all(s == "" for s in listener.index.statuses())


# Full attention and a sliding window of 32 tokens, both in blocks of 16.
LAYOUT16 = [("full_attention", 16, 0, ""), ("sliding_window", 16, 32, "")]


def events16(full_blocks: int, window_blocks: list[int]) -> list[kvindex.BlockStored]:
    h = fine()
    return [
        stored(h[:full_blocks], 16, 0, "full_attention"),
        stored([h[i] for i in window_blocks], 16, 1, "sliding_window", 32),
    ]


def test_full_only_scoring_picks_the_wrong_worker(tmp_path: Path) -> None:
    """a holds the whole prompt's full-attention blocks but its window blocks near the end
    were evicted; b holds fewer full blocks with the window in place. Fed the same streams,
    a router scoring full attention alone (no layouts declared) sends the prompt to a,
    whose engine would reuse only the run from block 0; one scoring by the groups sends
    it to b."""
    ipc = f"ipc://{tmp_path}/b.sock"
    pa = EventPublisher("tcp://127.0.0.1:*", bind=True)
    pb = EventPublisher(ipc)
    full_only = ClusterListener(ClusterIndex(BS), replay_timeout=2.0)
    hybrid = ClusterListener(ClusterIndex(BS), replay_timeout=2.0)
    try:
        a_ev, b_ev = events16(6, [0, 1]), events16(4, [2, 3])
        slots = {}
        for lst, kw in ((full_only, {}), (hybrid, {"groups": LAYOUT16})):
            slots[id(lst)] = (
                connect(lst, pa, pa.endpoint, "a", a_ev, **kw),
                connect(lst, pb, ipc, "b", b_ev, **kw),
            )
        picks = []
        for lst in (full_only, hybrid):
            a, b = slots[id(lst)]
            d = Router(lst.index).route(PROMPT)
            assert d is not None
            picks.append("a" if d.worker == a else "b")
            scores, basis = lst.index.scores(PROMPT)
            if lst is full_only:
                assert (scores[a], scores[b]) == (6, 4)
                assert basis[a] == basis[b] == "full_only_hybrid_events"
            else:
                # a: full 96 tokens, but the window ending there (blocks 4, 5) is gone; the
                # run from block 0 (blocks 0, 1) is all its engine would reuse.
                assert (scores[a], scores[b]) == (2, 4)
                assert basis[a] == basis[b] == "layout"
        assert picks == ["a", "b"]
    finally:
        for x in (full_only, hybrid, pa, pb):
            x.close()


def test_pruned_routing_picks_as_full_scores_do() -> None:
    """`route` skips a layout worker that cannot beat the best cost so far; its pick
    equals the pick over every worker's full score (ties to the first at or after
    `start`), for random memberships and loads."""
    from kvindex.events import EventEncoder

    enc = EventEncoder()
    rng = np.random.default_rng(7)
    h = fine()
    for trial in range(40):
        ix = ClusterIndex(BS)
        for w in range(12):
            slot = ix.add_worker(f"w{w}")
            if w % 4 != 3:  # a few without a layout: full-only scores
                ix.set_worker_layout(slot, LAYOUT16)
            full = int(rng.integers(0, 7))
            window = sorted(set(rng.integers(0, 6, int(rng.integers(0, 4))).tolist()))
            evs = [
                stored(h[:full], 16, 0, "full_attention"),
                stored([h[i] for i in window], 16, 1, "sliding_window", 32),
            ]
            assert ix.apply(slot, 0, enc.encode_events(evs, 0.0))[0] == "applied"
        load = rng.integers(0, 4, ix.slots).astype(np.float64)
        if trial % 5 == 0:
            load[int(rng.integers(0, ix.slots))] = np.nan
        weight = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        start = int(rng.integers(0, ix.slots))
        scores, _ = ix.scores(PROMPT)
        n = len(PROMPT) // BS
        costs = [weight * (n - scores[w]) + load[w] for w in range(ix.slots)]
        best = None
        for k in range(ix.slots):
            w = (start + k) % ix.slots
            if np.isnan(load[w]):
                continue
            if best is None or costs[w] < costs[best]:
                best = w
        w, overlap, blocks = ix.route(PROMPT, load, overlap_weight=weight, start=start)
        assert w == best and overlap == scores[w] and blocks == n
