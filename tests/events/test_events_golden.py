"""KV-event payloads against vLLM 0.33's own: every golden batch, byte for byte.

``tests/data/vllm_golden/vllm_kv_events.json`` is a copy of the golden file
``vllm_kv_events.json`` (produced by vLLM 0.33.0's ``KVCacheManager`` with events on and
encoded as its ``ZmqEventPublisher`` encodes batches; see the events section of
``tests/data/vllm_golden/README.md``). Each scenario's scheduler operations are replayed
through ``HashChainCache`` with the same algorithm, block size, pool size and chain seed;
after every step the cache's events are encoded with the golden ``ts`` and compared with
the golden payload.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvindex
from kvindex.events import EventEncoder, decode_batch

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "vllm_golden" / "vllm_kv_events.json"
DATA = json.loads(GOLDEN.read_text())
ALGOS = {
    "sha256": "vllm_sha256",
    "sha256_cbor": "vllm_sha256_cbor",
    "xxhash_cbor": "vllm_xxhash_cbor",
}
SCENARIOS = list(enumerate(DATA["scenarios"]))


def _scenario_id(item: tuple[int, dict[str, Any]]) -> str:
    i, s = item
    return f"{i}-{s['hash_algo']}-bs{s['block_size']}"


def replay(s: dict[str, Any], encoder: EventEncoder) -> list[bytes]:
    """Runs a scenario's operations; returns one payload per step (empty batches too)."""
    cache = kvindex.HashChainCache(
        s["num_blocks"],
        s["block_size"],
        algo=ALGOS[s["hash_algo"]],
        seed=s["none_hash_seed"],
        enable_events=True,
    )
    assert (
        kvindex.none_hash(algo=ALGOS[s["hash_algo"]], seed=s["none_hash_seed"]).hex()
        == (s["none_hash_hex"])
    )
    ids: dict[str, int] = {}
    out = []
    for st in s["steps"]:
        for op in st["ops"]:
            kind = op["op"]
            if kind == "admit":
                rid = ids.setdefault(op["id"], len(ids) + 1)
                tokens = np.array(op["tokens"], dtype=np.int64)
                adm = cache.admit(rid, tokens, cache_salt=op.get("cache_salt"))
                if op["hit"] is None:
                    assert adm is None
                else:
                    assert adm is not None
                    assert adm.num_cached_tokens == op["hit"]
                    assert adm.block_ids.tolist() == op["blocks"]
            elif kind == "append":
                # vLLM appends token by token; a failing token leaves the earlier ones in.
                ok = True
                for t in op["tokens"]:
                    ok = cache.append(ids[op["id"]], np.array([t], dtype=np.int64))
                    if not ok:
                        break
                assert ok == (op["new_blocks"] is not None)
            elif kind == "finish":
                cache.free(ids[op["id"]])
            else:
                assert kind == "reset"
                try:
                    cache.reset()
                    ok = True
                except kvindex.BlockInUseError:
                    ok = False
                assert ok == op["ok"]
        payload = encoder.encode(cache, st["decoded"][0], skip_empty=False)
        assert payload is not None
        out.append(payload)
        cache.check_invariants()
    return out


def test_golden_file_shape() -> None:
    assert DATA["vllm_version"] == "0.33.0"
    assert sum(len(s["steps"]) for s in DATA["scenarios"]) == 240
    for s in DATA["scenarios"]:
        assert [st["seq"] for st in s["steps"]] == list(range(len(s["steps"])))


@pytest.mark.parametrize("item", SCENARIOS, ids=_scenario_id)
def test_every_golden_batch_byte_for_byte(item: tuple[int, dict[str, Any]]) -> None:
    _, s = item
    got = replay(s, EventEncoder())
    for st, payload in zip(s["steps"], got, strict=True):
        assert payload.hex() == st["payload_hex"], f"step {st['step']}: {st['ops']}"


def _vllm_dict(e: Any) -> dict[str, Any]:
    """An event as msgspec writes it: optional fields left out when None."""
    required = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size"}
    required |= {"lora_id", "medium", "lora_name"}
    d = e.to_dict()
    return {k: v for k, v in d.items() if k in required or v is not None}


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("item", SCENARIOS, ids=_scenario_id)
def test_golden_batches_decode_to_the_golden_json(item: tuple[int, dict[str, Any]]) -> None:
    _, s = item
    for st in s["steps"]:
        payload = bytes.fromhex(st["payload_hex"])
        b = decode_batch(payload, block_size=s["block_size"])
        ts, events, dp = st["decoded"]
        assert (b.ts, b.data_parallel_rank, b.skipped_types) == (ts, dp, ())
        assert [_jsonable(_vllm_dict(e)) for e in b.events] == events
        # Re-encoding the decoded objects gives the same bytes.
        assert EventEncoder(data_parallel_rank=dp).encode_events(b.events, ts) == payload


@pytest.mark.parametrize("item", SCENARIOS, ids=_scenario_id)
def test_array_tagged_encoding_decodes_to_the_same_events(item: tuple[int, dict[str, Any]]) -> None:
    _, s = item
    legacy = replay(s, EventEncoder(array_tagged=True))
    for st, payload in zip(s["steps"], legacy, strict=True):
        want = decode_batch(bytes.fromhex(st["payload_hex"]))
        got = decode_batch(payload)
        assert payload[0] == 0x93 and (got.ts, got.data_parallel_rank) == (want.ts, 0)
        assert got.events == want.events
        for e in got.events:
            assert pickle.loads(pickle.dumps(e)) == e


def test_array_tagged_layout() -> None:
    """``[tag, field, ...]`` with every field present, as msgspec writes array-like structs."""
    enc = EventEncoder(array_tagged=True, data_parallel_rank=None)
    ev = kvindex.BlockRemoved([5], medium="GPU", group_idx=0)
    payload = enc.encode_events([ev, kvindex.AllBlocksCleared()], 2.0)
    assert payload == (
        b"\x93\xcb" + np.float64(2.0).byteswap().tobytes() + b"\x92"
        b"\x96\xacBlockRemoved\x91\x05\xa3GPU\x00\xc0\xc0"
        b"\x91\xb0AllBlocksCleared"
        b"\xc0"
    )
