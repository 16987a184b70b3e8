"""The native vLLM request block hasher (``kvindex.integrations.vllm.hashing``) without vLLM.

The requests here are stand-ins with the attributes vLLM's hasher reads; the expected
hashes are vLLM 0.33's own (the golden vectors, produced by a real ``Request`` and
``get_request_block_hasher``; see ``tests/data/vllm_golden/README.md``). The comparison
against vLLM's hasher on random requests is ``test_vllm_request_hasher_vs_vllm.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvindex.exceptions import InvalidArgumentError
from kvindex.integrations.vllm.hashing import VllmRequestHasher, make_request_block_hasher


def _golden_dir() -> Path:
    for p in Path(__file__).resolve().parents:
        if (p / "data" / "vllm_golden").is_dir():
            return p / "data" / "vllm_golden"
    raise FileNotFoundError("tests/data/vllm_golden")


GOLDEN = json.loads((_golden_dir() / "vllm_block_hashes.json").read_text(encoding="utf-8"))


@dataclass
class Pos:
    offset: int
    length: int


@dataclass
class Feature:
    identifier: str
    mm_position: Pos


@dataclass
class Lora:
    lora_name: str
    lora_path: str


@dataclass
class Req:
    """The attributes of ``vllm.v1.request.Request`` that its block hasher reads."""

    _all_token_ids: list[int]
    lora_request: Lora | None = None
    cache_salt: str | None = None
    mm_features: list[Feature] = field(default_factory=list)
    prompt_embeds: Any = None
    block_hashes: list[bytes] = field(default_factory=list)


class TruthyEmpty(list[Feature]):
    """An empty list that claims to be non-empty."""

    def __bool__(self) -> bool:
        return True


def no_fallback(request: Any) -> list[bytes]:
    raise AssertionError("the native path should have hashed this request")


def case_request(c: dict[str, Any], tokens: list[int]) -> Req:
    lora = Lora(c["lora"]["name"], c["lora"]["path"]) if c["lora"] else None
    mm = [Feature(m["identifier"], Pos(m["offset"], m["length"])) for m in c["mm_items"]]
    return Req(list(tokens), lora, c["cache_salt"], mm)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["id"] for c in GOLDEN["cases"]])
@pytest.mark.parametrize("steps", ["whole", "incremental"])
def test_golden_vectors(case: dict[str, Any], steps: str) -> None:
    h = make_request_block_hasher(
        case["block_size"],
        case["algo"],
        none_hash=bytes.fromhex(case["none_hash"]),
        fallback=no_fallback,
    )
    toks = case["tokens"]
    if steps == "whole":
        req = case_request(case, toks)
        req.block_hashes.extend(h(req))
    else:
        # As vLLM calls it: on arrival, then after every appended output token.
        n0 = min(len(toks), 3)
        req = case_request(case, toks[:n0])
        req.block_hashes.extend(h(req))
        for t in toks[n0:]:
            req._all_token_ids.append(t)
            req.block_hashes.extend(h(req))
    assert [x.hex() for x in req.block_hashes] == case["block_hashes"]
    assert h.fallback_calls == 0  # type: ignore[attr-defined]


def _hasher(algo: str = "sha256", bs: int = 4) -> tuple[VllmRequestHasher, list[Any]]:
    seen: list[Any] = []

    def fallback(request: Any) -> list[bytes]:
        seen.append(request)
        return [b"fallback"]

    return VllmRequestHasher(bs, algo, none_hash=b"\x01" * 32, fallback=fallback), seen


def test_no_new_full_block_returns_empty_without_work() -> None:
    h, seen = _hasher()
    req = Req([1, 2, 3])
    assert h(req) == []
    req._all_token_ids.append(4)
    req.block_hashes.extend(h(req))
    assert len(req.block_hashes) == 1
    req._all_token_ids.extend([5, 6, 7])
    assert h(req) == []
    assert not seen


def test_chain_root_read_from_an_object_when_a_request_starts() -> None:
    class Mod:
        NONE_HASH = b"\x02" * 32

    h = VllmRequestHasher(2, "sha256_cbor", none_hash=Mod, fallback=no_fallback)
    a = h(Req([1, 2]))
    Mod.NONE_HASH = b"\x03" * 32
    b = h(Req([1, 2]))
    fixed = VllmRequestHasher(2, "sha256_cbor", none_hash=b"\x03" * 32, fallback=no_fallback)
    assert a != b and b == fixed(Req([1, 2]))


@pytest.mark.parametrize(
    "req",
    [
        Req([1, 2, 3, 4], prompt_embeds=object()),
        Req([1, True, 3, 4]),
        Req([1, 2**63, 3, 4]),
        Req([1, 2, 3, 4], mm_features=[Feature("img-a", Pos(2, 2)), Feature("img-b", Pos(0, 1))]),
        Req([1, 2, 3, 4], mm_features=[Feature("img-a", Pos(1, 0))]),
        Req([1, 2, 3, 4], cache_salt=b"bytes-salt"),  # type: ignore[arg-type]
        Req([1, 2, 3, 4], block_hashes=["not bytes"]),  # type: ignore[list-item]
        Req([1, 2, 3, 4], mm_features=TruthyEmpty()),
    ],
    ids=[
        "prompt-embeds",
        "bool-token",
        "wide-token",
        "unsorted-mm",
        "empty-mm",
        "bytes-salt",
        "str-parent",
        "truthy-empty-mm",
    ],
)
def test_what_the_native_path_does_not_reproduce_goes_to_the_fallback(req: Req) -> None:
    if req.block_hashes:
        req._all_token_ids.extend([5, 6, 7, 8])
    h, seen = _hasher()
    assert h(req) == [b"fallback"]
    assert seen == [req] and h.fallback_calls == 1


def test_pickle_identity_sharing_goes_to_the_fallback_cbor_does_not() -> None:
    ident = "img-shared"
    feats = [Feature(ident, Pos(0, 1)), Feature(ident, Pos(2, 1))]
    for algo, expect_fallback in [("sha256", True), ("xxhash", True), ("sha256_cbor", False)]:
        h, seen = _hasher(algo)
        out = h(Req([1, 2, 3, 4], mm_features=feats))
        assert (out == [b"fallback"]) is expect_fallback, algo
    # Equal strings that are distinct objects are written in full by pickle: native.
    distinct = [Feature("".join(["img-", "x"]), Pos(o, 1)) for o in (0, 2)]
    h, seen = _hasher("sha256")
    assert h(Req([1, 2, 3, 4], mm_features=distinct)) != [b"fallback"] and not seen
    # A user string equal to one of vLLM's tags may be that very object: fallback.
    h, seen = _hasher("sha256")
    assert h(Req([1, 2, 3, 4], cache_salt="mm")) == [b"fallback"]


def test_bad_arguments_raise_kvindex_errors() -> None:
    with pytest.raises(InvalidArgumentError):
        VllmRequestHasher(16, "md5", none_hash=b"\x00" * 32, fallback=no_fallback)
    with pytest.raises(InvalidArgumentError):
        VllmRequestHasher(16, "xxh3_128", none_hash=b"\x00" * 32, fallback=no_fallback)
    with pytest.raises(InvalidArgumentError):
        VllmRequestHasher(0, "sha256", none_hash=b"\x00" * 32, fallback=no_fallback)
    with pytest.raises(InvalidArgumentError):
        make_request_block_hasher(16, len, none_hash=b"\x00" * 32, fallback=no_fallback)
    h = make_request_block_hasher(16, "vllm_xxhash", none_hash=b"\x00" * 16, fallback=no_fallback)
    assert h.algo == "xxhash" and h.block_size == 16  # type: ignore[attr-defined]


def test_errors_from_the_request_propagate() -> None:
    class Broken:
        @property
        def block_hashes(self) -> list[bytes]:
            raise KeyError("boom")

    h, _ = _hasher()
    with pytest.raises(KeyError):
        h(Broken())
