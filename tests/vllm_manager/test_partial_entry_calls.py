"""The multi-group ``_VllmManager`` calls added for prompt-tail entries, per-group hits
and the metrics log: what they answer on a small layout (full attention of block 8 beside
a window of 4 at hash block 4), and that bad arguments raise ``InvalidArgumentError`` or
answer False, leaving the state unchanged."""

from __future__ import annotations

import hashlib

import pytest

from kvindex._core import _VllmManager
from kvindex.exceptions import InvalidArgumentError


def hashes(n: int) -> list[bytes]:
    return [hashlib.sha256(bytes([i])).digest() for i in range(n)]


def manager() -> _VllmManager:
    m = _VllmManager(
        40,
        8,
        log_removed=True,
        groups=[("full_attention", 8, 0, ""), ("sliding_window", 4, 4, "")],
    )
    m.log_metrics(True)
    return m


def prefill_and_decode(m: _VllmManager, hs: list[bytes]) -> None:
    # Prompt of 14 tokens, then decoded to 16: the tail (12) goes beside block 1's hash.
    m.set_cache_context(14, 0)
    args = (None, 14, 0, 0, None, None, 0, 0, 0, True)
    assert m.allocate_slots_groups("a", *args, hashes=hs[:3], cache_tokens=14) is not None
    args = (None, 16, 14, 0, None, None, 14, 0, 0, False)
    assert m.allocate_slots_groups("a", *args, hashes=hs, cache_tokens=16) is not None


def test_tail_entry_runs_keys_and_metrics() -> None:
    m, hs = manager(), hashes(4)
    assert m.registers_prompt_tails
    prefill_and_decode(m, hs)
    runs = [(g, s, e, list(st), bs) for g, s, e, st, bs, _r0, _r1 in m.last_cached_runs]
    assert runs[:2] == [(0, 1, 2, [1], 8), (0, 2, 3, [2], 4)]
    b1 = int(m.group_blocks("a")[0][1])
    assert m.extra_keys() == [(hs[2], 0, b1)]
    assert m.holds_key(hs[2], 0, b1) and m.cached_block(hs[2], 0) == b1
    assert m.estimate_cached_tokens("a") == 16 and m.estimate_cached_tokens("nobody") == 0
    log = m.take_metrics()
    assert log and all(event == 0 for _, event in log) and m.take_metrics() == []
    blocks, lens = m.find_hit_per_group(hs, 15)
    assert lens == [8, 8] and [len(b) for b in blocks] == [1, 2]
    # The key leaves silently and comes back as it was.
    assert m.pop_cached_key(hs[2], 0, b1) and not m.holds_key(hs[2], 0, b1)
    assert m.take_removed_groups() == []
    assert m.restore_cached_key(hs[2], 0, b1, False, 12) and m.extra_keys() == [(hs[2], 0, b1)]
    m.check_invariants()


def test_bad_arguments_change_nothing() -> None:
    m, hs = manager(), hashes(4)
    prefill_and_decode(m, hs)
    before = (m.extra_keys(), m.free_queue(), m.num_cached_hashes)
    for call in (
        lambda: m.holds_key(hs[2], 0, -1),
        lambda: m.pop_cached_key(hs[2], 0, 10_000),
        lambda: m.restore_cached_key(hs[2], 0, 1, True, -5),
        lambda: m.find_hit_per_group(hs, -1),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    # Answers, not errors: a group out of range, an oversized digest, the null block, a
    # key no block holds, an extra key on a block of a group without prompt tails.
    assert not m.holds_key(hs[2], 7, 1) and not m.pop_cached_key(b"x" * 100, 0, 1)
    assert not m.pop_cached_key(hs[2], 0, 0) and not m.pop_cached_key(hs[3], 1, 1)
    assert not m.restore_cached_key(hs[2], 1, 1, False, 4)
    assert not m.restore_cached_key(hs[2], 0, 0, True, 4)
    assert (m.extra_keys(), m.free_queue(), m.num_cached_hashes) == before
    m.check_invariants()
