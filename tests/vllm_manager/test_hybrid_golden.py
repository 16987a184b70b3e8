"""The multi-group ``_VllmManager`` against vLLM 0.33's own ``KVCacheManager``.

``tests/data/vllm_hybrid_golden.json`` holds what vLLM's manager did on synthetic
multi-group configs (full attention, sliding window, chunked local, align-mode Mamba; see
``tests/integrations/vllm/gen_hybrid_golden.py``). Each operation is replayed here with the
arithmetic vLLM's ``KVCacheManager.allocate_slots`` does before it reaches the coordinator;
hits, per-group hit blocks, new blocks, every live table and cached count, the free queue
and the KV events must all be equal after every operation; with a retention interval the
caching step gets the request's prompt length and shared-prefix junction as vLLM's does, and
with KV cache zeroing the block ids logged for zeroing must match too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvindex._core import _VllmManager

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_hybrid_golden.json"
_MASK = (1 << 64) - 1


def _scenarios() -> list[dict[str, Any]]:
    with DATA.open() as f:
        return list(json.load(f)["scenarios"])


def _low64(h: bytes) -> int:
    return int.from_bytes(h, "big") & _MASK


class Replay:
    """One scenario's manager and the vLLM-side arithmetic around it."""

    def __init__(self, sc: dict[str, Any]) -> None:
        self.sc = sc
        self.groups = [
            (k, bs, size, "align" if k == "mamba" else "") for k, bs, size in sc["groups"]
        ]
        self.m = _VllmManager(
            sc["num_blocks"],
            sc["scheduler_block_size"],
            log_removed=True,
            groups=self.groups,
            use_eagle=sc["use_eagle"],
        )
        self.m.set_retention_interval(sc.get("retention_interval"))
        if sc.get("zeroing"):
            self.m.set_zeroing_groups([g for g, x in enumerate(self.groups) if x[0] != "mamba"])
        self.hbs = self.m.hash_block_size
        self.mml = sc["max_model_len"]
        self.hashes = {rid: [bytes.fromhex(h) for h in hs] for rid, hs in sc["hashes"].items()}
        self.live: set[str] = set()

    def events(self) -> list[list[Any]]:
        out: list[list[Any]] = [
            ["removed", g, [_low64(h)]] for h, g in self.m.take_removed_groups()
        ]
        return out

    def stored(self, rid: str, nh: int) -> list[list[Any]]:
        """The caching step's events in vLLM's order: removals no run made (evictions
        before it), then per run the keys it dropped and its ``BlockStored`` (a prompt
        tail's entry is one hash block)."""
        hs = self.hashes[rid][:nh]
        runs = self.m.last_cached_runs
        removed = [["removed", g, [_low64(h)]] for h, g in self.m.take_removed_groups()]
        covered = {k for run in runs for k in range(run[5], run[6])}
        out = [e for k, e in enumerate(removed) if k not in covered]
        for g, start, _end, stored, bs, r0, r1 in runs:
            kind, _bs, size, _ = self.groups[g]
            scale = bs // self.hbs
            parent = None if start == 0 else _low64(hs[start * scale - 1])
            window = size if kind == "sliding_window" else None
            blocks = [_low64(hs[(int(i) + 1) * scale - 1]) for i in stored]
            out += removed[r0:r1]
            out.append(["stored", g, blocks, parent, bs, kind, window])
        return out

    def allocate(
        self, op: dict[str, Any], hit_blocks: list[list[int]] | None
    ) -> list[list[int]] | None:
        rid = op["rid"]
        hit = op.get("hit", 0)
        local = op["num_computed"] + hit
        total = min(local, self.mml)
        need = min(total + op["num_new"] + op["lookahead"], self.mml)
        cache_to = min(total + op["num_new"], op["num_tokens"])
        adopt = hit_blocks is not None and any(len(b) for b in hit_blocks)
        if "num_prompt_tokens" in op:
            self.m.set_cache_context(op["num_prompt_tokens"], op["shared_prefix_boundary"])
        new = self.m.allocate_slots_groups(
            rid,
            hit_blocks if adopt else None,
            need,
            local,
            0,
            None,
            None,
            total,
            0,
            0,
            adopt,
            hashes=self.hashes[rid][: op["num_hashes"]],
            cache_tokens=cache_to,
            num_tokens_main_model=total + op["num_new"],
        )
        return None if new is None else [a.tolist() for a in new]


@pytest.mark.parametrize("sc", _scenarios(), ids=lambda s: str(s["name"]))
def test_hybrid_manager_matches_vllm(sc: dict[str, Any]) -> None:
    r = Replay(sc)
    m = r.m
    for step, op in enumerate(sc["ops"]):
        where = f"{sc['name']} op {step} {op['op']} {op.get('rid')}"
        events: list[list[Any]] = []
        if op.get("new_step"):
            m.new_step_starts()
        if op["op"] == "admit":
            rid = op["rid"]
            hs = r.hashes[rid][: op["num_hashes"]]
            tokens, _ucp, blocks = m.find_hit_groups(hs, op["num_tokens"] - 1)
            got = [b.tolist() for b in blocks]
            want = [list(b) for b in op["hit_blocks"]]
            assert (tokens, got) == (op["hit"], want), where
            new = r.allocate(op, got)
            assert new == op["new"], where
            if new is not None:
                r.live.add(rid)
                events = r.stored(rid, op["num_hashes"])
            else:
                events = r.events()
        elif op["op"] == "step":
            rid = op["rid"]
            new = r.allocate(op, None)
            assert new == op["new"], where
            events = r.stored(rid, op["num_hashes"]) if new is not None else r.events()
        else:
            m.free(op["rid"])
            r.live.discard(op["rid"])
            events = r.events()
        assert events == op["events"], where
        tables = {rid: [a.tolist() for a in m.group_blocks(rid)] for rid in r.live}
        assert tables == op["tables"], where
        cached = {rid: m.num_cached_groups(rid) for rid in r.live}
        assert cached == op["num_cached"], where
        assert m.free_queue() == op["free_queue"], where
        if sc.get("zeroing"):
            assert m.take_new_ids() == op["new_block_ids"], where
        m.check_invariants()
