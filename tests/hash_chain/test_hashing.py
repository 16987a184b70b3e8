"""Block hashing: vLLM golden vectors, differential checks against
CPython's own pickle / cbor2 / xxhash, kvindex's compact encodings, chain
properties and GIL release.

The vLLM-mode references below rebuild vLLM 0.33's exact payload
``(parent, tuple(tokens), extra_keys)`` as Python objects and serialise them with
CPython itself, so object identity matters for pickle's memo (see "Pickle protocol 5" in
``tests/data/vllm_golden/README.md``):
the tag strings are one module-level object each (vLLM's constants) and every user
string is a fresh object (:func:`fresh`), except where CPython itself shares it
(``""`` and one-character latin-1 strings are singletons).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import struct
import threading
from pathlib import Path

import cbor2
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import kvindex

# vLLM 0.33.0 golden vectors, copied into the repository (provenance: tests/data/README.md).
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "vllm_golden"
_GOLDEN_DATA = json.loads((GOLDEN / "vllm_block_hashes.json").read_text(encoding="utf-8"))
CASES = _GOLDEN_DATA["cases"]
ALGO_MAP = {
    "sha256_cbor": "vllm_sha256_cbor",
    "sha256": "vllm_sha256",
    "xxhash_cbor": "vllm_xxhash_cbor",
}
VLLM_ALGOS = ["vllm_sha256", "vllm_xxhash", "vllm_sha256_cbor", "vllm_xxhash_cbor"]
ALL_ALGOS = list(kvindex.HASH_ALGOS)
DIGEST_LEN = {
    "xxh3_128": 16,
    "sha256": 32,
    "vllm_sha256_cbor": 32,
    "vllm_xxhash_cbor": 16,
    "vllm_sha256": 32,
    "vllm_xxhash": 16,
}
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def rows(arr: np.ndarray) -> list[bytes]:
    return [r.tobytes() for r in arr]


def case_kwargs(c: dict) -> dict:
    kw: dict = {}
    if c["cache_salt"] is not None:
        kw["cache_salt"] = c["cache_salt"]
    if c["lora"] is not None:
        kw["lora"] = (c["lora"]["name"], c["lora"]["path"])
    if c["mm_items"]:
        kw["mm_items"] = [(m["identifier"], m["offset"], m["length"]) for m in c["mm_items"]]
    return kw


def fresh(s: str) -> str:
    """A new str object equal to ``s`` (as vLLM's engine gets user strings from
    deserialisation). CPython still returns its shared singleton for ``""`` and
    one-character latin-1 strings, exactly as it would inside vLLM."""
    return s.encode("utf-8").decode("utf-8")


# vLLM's tag constants: ONE object each, so a repeat in one payload is a pickle BINGET.
TAG_LORA = fresh("lora")
TAG_MM = fresh("mm")
TAG_SALT = fresh("cache_salt")


def vllm_extra_keys(start: int, bs: int, lora, mm_items, salt):
    """vLLM 0.33 ``generate_block_hash_extra_keys`` for the block ``[start, start+bs)``."""
    keys: list[tuple] = []
    if lora is not None:
        keys.append((TAG_LORA, fresh(lora[0]), fresh(lora[1])))
    for ident, off, length in mm_items or ():
        if off < start + bs and off + length > start:
            keys.append((TAG_MM, fresh(ident), off - start))
    if start == 0 and salt:
        keys.append((TAG_SALT, fresh(salt)))
    return tuple(keys) if keys else None


def _pickle5(obj) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _cbor(obj) -> bytes:
    return cbor2.dumps(obj, canonical=True)


def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def _xxh(b: bytes) -> bytes:
    return xxhash.xxh3_128_digest(b)


VLLM_MODES = {
    "vllm_sha256": (_pickle5, _sha),
    "vllm_xxhash": (_pickle5, _xxh),
    "vllm_sha256_cbor": (_cbor, _sha),
    "vllm_xxhash_cbor": (_cbor, _xxh),
}


def vllm_none_hash(algo: str, seed: str | None) -> bytes:
    ser, dig = VLLM_MODES[algo]
    return dig(ser(fresh("vllm-none-hash" if seed is None else seed)))


def vllm_ref_chain(
    algo, tokens, bs, *, seed=None, cache_salt=None, lora=None, mm_items=None
) -> list[bytes]:
    """vLLM's chain computed by CPython: parent_0 = NONE_HASH = H(serialize(seed))."""
    ser, dig = VLLM_MODES[algo]
    toks = [int(t) for t in tokens]
    parent = vllm_none_hash(algo, seed)
    out = []
    for i in range(len(toks) // bs):
        s = i * bs
        extra = vllm_extra_keys(s, bs, lora, mm_items, cache_salt)
        parent = dig(ser((parent, tuple(toks[s : s + bs]), extra)))
        out.append(parent)
    return out


# kvindex's compact encoding (documented in rust/core/hash/mod.rs), re-implemented.
def _cstr(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def compact_none_hash(algo: str, seed: str | None) -> bytes:
    payload = b"kvindex-none-hash\0" + ("kvindex" if seed is None else seed).encode("utf-8")
    return (_xxh if algo == "xxh3_128" else _sha)(payload)


def compact_block_payload(parent: bytes, toks: list[int], keys) -> bytes:
    out = bytearray(parent)
    out += struct.pack("<I", len(toks))
    if all(-(2**31) <= t < 2**31 for t in toks):
        out += b"\x04" + struct.pack(f"<{len(toks)}i", *toks)
    else:
        out += b"\x08" + struct.pack(f"<{len(toks)}q", *toks)
    keys = keys or ()
    out += struct.pack("<I", len(keys))
    for k in keys:
        if k[0] == "lora":
            out += b"\x01" + _cstr(k[1]) + _cstr(k[2])
        elif k[0] == "mm":
            out += b"\x02" + _cstr(k[1]) + struct.pack("<q", k[2])
        else:
            out += b"\x03" + _cstr(k[1])
    return bytes(out)


def compact_ref_chain(
    algo, tokens, bs, *, seed=None, cache_salt=None, lora=None, mm_items=None
) -> list[bytes]:
    dig = _xxh if algo == "xxh3_128" else _sha
    toks = [int(t) for t in tokens]
    parent = compact_none_hash(algo, seed)
    out = []
    for i in range(len(toks) // bs):
        s = i * bs
        keys = vllm_extra_keys(s, bs, lora, mm_items, cache_salt)
        parent = dig(compact_block_payload(parent, toks[s : s + bs], keys))
        out.append(parent)
    return out


def ref_chain(algo, tokens, bs, **kw) -> list[bytes]:
    if algo in VLLM_MODES:
        return vllm_ref_chain(algo, tokens, bs, **kw)
    return compact_ref_chain(algo, tokens, bs, **kw)


def kv_chain(algo, tokens, bs, **kw) -> list[bytes]:
    out = kvindex.block_hashes(np.asarray(tokens, dtype=np.int64), bs, algo=algo, **kw)
    assert out.dtype == np.uint8
    assert out.shape == (len(tokens) // bs, DIGEST_LEN[algo])
    return rows(out)


# ---------------------------------------------------------------------------------------
# 1. vLLM golden vectors (tests/data/vllm_golden)
# ---------------------------------------------------------------------------------------


def test_golden_file_is_complete():
    assert _GOLDEN_DATA["format"] == "vllm-block-hash-vectors/1"
    assert _GOLDEN_DATA["num_cases"] == len(CASES) == 42
    assert sum(len(c["block_hashes"]) for c in CASES) == 150
    assert {c["algo"] for c in CASES} == set(ALGO_MAP)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_block_hashes(case):
    algo = ALGO_MAP[case["algo"]]
    tokens = np.array(case["tokens"], dtype=np.int64)
    assert len(tokens) == case["num_tokens"]
    got = kvindex.block_hashes(
        tokens, case["block_size"], algo=algo, seed=case["seed"], **case_kwargs(case)
    )
    assert got.dtype == np.uint8
    assert got.shape == (
        len(case["block_hashes"]),
        _GOLDEN_DATA["algos"][case["algo"]]["digest_len"],
    )
    assert [r.hex() for r in rows(got)] == case["block_hashes"]
    assert kvindex.none_hash(algo=algo, seed=case["seed"]).hex() == case["none_hash"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_matches_cpython_reference(case):
    """The test's own CPython reference reproduces every golden digest (so the
    differential tests below compare against something proven right)."""
    algo = ALGO_MAP[case["algo"]]
    kw = case_kwargs(case)
    ref = vllm_ref_chain(algo, case["tokens"], case["block_size"], seed=case["seed"], **kw)
    assert [h.hex() for h in ref] == case["block_hashes"]
    assert vllm_none_hash(algo, case["seed"]).hex() == case["none_hash"]


def test_golden_int32_input_matches():
    for c in CASES:
        if "int64_tokens" in c["tags"]:
            continue
        t32 = np.array(c["tokens"], dtype=np.int32)
        got = kvindex.block_hashes(
            t32, c["block_size"], algo=ALGO_MAP[c["algo"]], seed=c["seed"], **case_kwargs(c)
        )
        assert [r.hex() for r in rows(got)] == c["block_hashes"], c["id"]


GOLDEN_CACHE_IDS = [
    c["id"]
    for c in CASES
    if c["cache_salt"]
    or c["lora"]
    or c["mm_items"]
    or c["id"].endswith(("sequential-3-blocks", "int64-tokens"))
]


@pytest.mark.parametrize("case_id", GOLDEN_CACHE_IDS)
def test_golden_via_hash_chain_cache(case_id):
    c = next(x for x in CASES if x["id"] == case_id)
    algo, bs = ALGO_MAP[c["algo"]], c["block_size"]
    tokens = np.array(c["tokens"], dtype=np.int64)
    cache = kvindex.HashChainCache(256, bs, algo=algo, seed=c["seed"])
    if "int64_tokens" in c["tags"]:
        # Ids outside int32 are not vocabulary ids (vLLM's server rejects them before
        # hashing): the caches refuse them; block_hashes still reproduces their digests.
        with pytest.raises(kvindex.InvalidArgumentError, match="does not fit in int32"):
            cache.admit(7, tokens, **case_kwargs(c))
        assert cache.num_requests == 0 and cache.stats["requests"] == 0
        return
    adm = cache.admit(7, tokens, **case_kwargs(c))
    assert adm is not None and adm.num_cached_tokens == 0
    assert [r.hex() for r in rows(cache.request_block_hashes(7))] == c["block_hashes"]
    for i, h in enumerate(c["block_hashes"]):
        assert cache.block_hash(int(adm.block_ids[i])).hex() == h
    # A second request with the same prompt and keys hits (capped at n-1 tokens).
    n = len(tokens)
    full = n // bs
    assert cache.lookup(tokens, **case_kwargs(c)) == min(full, (n - 1) // bs) * bs
    # Decode growth: the prompt admitted in part, the rest appended in uneven chunks,
    # gives the same chain (extra keys follow token positions).
    cache2 = kvindex.HashChainCache(256, bs, algo=algo, seed=c["seed"])
    cut = max(1, n // 3)
    assert cache2.admit(1, tokens[:cut], **case_kwargs(c)) is not None
    pos = cut
    for step in (1, 5, 2, 17):
        if pos >= n:
            break
        assert cache2.append(1, tokens[pos : pos + step])
        pos += step
    if pos < n:
        assert cache2.append(1, tokens[pos:])
    assert cache2.num_tokens(1) == n
    assert [r.hex() for r in rows(cache2.request_block_hashes(1))] == c["block_hashes"]
    cache.check_invariants()
    cache2.check_invariants()


# ---------------------------------------------------------------------------------------
# 2. Differential: kvindex's vllm_* modes vs CPython pickle / cbor2 / xxhash
# ---------------------------------------------------------------------------------------

INT_EDGES = [
    0,
    1,
    23,
    24,
    255,
    256,
    65535,
    65536,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**39,
    2**40 - 1,
    2**47,
    2**55,
    2**63 - 1,
    -1,
    -24,
    -25,
    -128,
    -129,
    -256,
    -257,
    -32768,
    -32769,
    -(2**31),
    -(2**31) - 1,
    -(2**39),
    -(2**39) - 1,
    -(2**47) - 1,
    -(2**55) - 1,
    I64_MIN,
    I64_MIN + 1,
]


def random_tokens(rng: random.Random, n: int) -> list[int]:
    kinds = [
        lambda: rng.randrange(0, 256),
        lambda: rng.randrange(256, 65536),
        lambda: rng.randrange(-(2**31), 2**31),
        lambda: rng.randrange(I64_MIN, I64_MAX + 1),
        lambda: rng.choice(INT_EDGES),
        lambda: rng.randrange(0, 152064),  # a real vocabulary
    ]
    return [rng.choice(kinds)() for _ in range(n)]


def check_all_vllm(tokens, bs, **kw):
    for algo in VLLM_ALGOS:
        assert kv_chain(algo, tokens, bs, **kw) == vllm_ref_chain(algo, tokens, bs, **kw), algo


@pytest.mark.parametrize("bs", [1, 2, 3, 4, 5, 16, 24, 255, 256])
def test_vllm_int_encodings_every_edge(bs):
    """Every integer-width edge in every position, for TUPLE1/2/3 and MARK tuples."""
    tokens = INT_EDGES * max(1, (3 * bs) // len(INT_EDGES) + 1)
    check_all_vllm(tokens, bs)
    check_all_vllm(tokens[::-1], bs, seed="0")


def test_vllm_random_blocks_seeded():
    rng = random.Random(20260523)
    for _ in range(150):
        bs = rng.choice([1, 2, 3, 4, 16, 16, 32])
        n = rng.randrange(0, 6 * bs + 3)
        tokens = random_tokens(rng, n)
        kw: dict = {}
        if rng.random() < 0.4:
            kw["cache_salt"] = rng.choice(["s", "tenant-A", "sälz-🔑", "x" * 300, ""])
        if rng.random() < 0.4:
            kw["lora"] = (
                rng.choice(["n", "lora-ñ", "L" * 256]),
                rng.choice(["/p", "p", "/srv/" + "q" * 70]),
            )
        if rng.random() < 0.5 and n:
            items, pos = [], 0
            while pos < n + bs and len(items) < 8:
                pos += rng.randrange(0, 2 * bs + 1)
                length = rng.randrange(1, 2 * bs + 2)
                items.append((rng.choice(["img", "a", "b", "vid-0042", "é", "€"]), pos, length))
                pos += length
            kw["mm_items"] = items
        if rng.random() < 0.5:
            kw["seed"] = rng.choice(["", "0", "42", "random", "ünï", "s" * 300])
        check_all_vllm(tokens, bs, **kw)


# Pieces include "", 1-char latin-1 (CPython singletons), non-latin-1, astral, NUL and
# strings equal to the tags; joined into strings of 0..4 pieces.
_text = st.lists(
    st.sampled_from(
        ["a", "b", "é", "ÿ", "€", "🔑", "キ", "-", "/", "\x00", "mm", "lora", "cache_salt"]
    ),
    max_size=4,
).map("".join)


@st.composite
def _vllm_inputs(draw):
    bs = draw(st.sampled_from([1, 2, 3, 4, 7, 16]))
    tokens = draw(
        st.lists(
            st.one_of(
                st.integers(0, 300),
                st.integers(-(2**31) - 2, 2**31 + 1),
                st.integers(I64_MIN, I64_MAX),
                st.sampled_from(INT_EDGES),
            ),
            max_size=5 * bs + 2,
        )
    )
    kw: dict = {}
    if draw(st.booleans()):
        kw["seed"] = draw(_text)
    if draw(st.booleans()):
        kw["cache_salt"] = draw(_text)
    if draw(st.booleans()):
        kw["lora"] = (draw(_text), draw(_text))
    if draw(st.booleans()):
        items, pos = [], 0
        for gap, length, ident in draw(
            st.lists(
                st.tuples(st.integers(0, 2 * bs), st.integers(1, 2 * bs + 1), _text), max_size=6
            )
        ):
            pos += gap
            items.append((ident, pos, length))
            pos += length
        kw["mm_items"] = items
    return tokens, bs, kw


@settings(max_examples=300, deadline=None)
@given(_vllm_inputs())
def test_vllm_modes_match_cpython_hypothesis(inp):
    tokens, bs, kw = inp
    check_all_vllm(tokens, bs, **kw)


@pytest.mark.parametrize(
    "bs,make",
    [
        (20000, "i64"),  # ~200 KB of LONG1: several 64 KiB frames
        (20000, "mixed"),
        (7000, "i64"),  # frames split inside the token tuple of the 2nd block only
        (70000, "small"),  # BININT1 only: 140 KB
        (33000, "int2"),  # BININT2: 3 bytes each, ~99 KB
    ],
)
def test_vllm_large_blocks_frame_splitting(bs, make):
    rng = random.Random(bs)
    n = 2 * bs + 5
    if make == "i64":
        tokens = [rng.choice([I64_MIN, I64_MAX, rng.randrange(I64_MIN, I64_MAX)]) for _ in range(n)]
    elif make == "small":
        tokens = [rng.randrange(0, 256) for _ in range(n)]
    elif make == "int2":
        tokens = [rng.randrange(256, 65536) for _ in range(n)]
    else:
        tokens = random_tokens(rng, n)
    payload = _pickle5((b"\0" * 32, tuple(tokens[:bs]), None))
    assert len(payload) > 64 * 1024  # CPython splits this payload into several frames
    kw = {"lora": ("big-lora", "/p/big"), "mm_items": [("img", bs - 3, 10)], "cache_salt": "tenant"}
    for algo in VLLM_ALGOS:
        assert kv_chain(algo, tokens, bs, **kw) == vllm_ref_chain(algo, tokens, bs, **kw), algo
        assert kv_chain(algo, tokens, bs) == vllm_ref_chain(algo, tokens, bs), algo


@pytest.mark.parametrize(
    "length",
    [2, 23, 24, 255, 256, 257, 65535, 65536, 65537, 70000, 131072, 200001],
)
def test_vllm_long_strings(length):
    """Short/long str forms (8c / 58, CBOR 78/79/7a) and strings >= 64 KiB, which
    CPython writes outside any frame."""
    rng = random.Random(length)
    s_ascii = "".join(rng.choice("abcdefgh") for _ in range(length))
    # multi-byte: UTF-8 length differs from the character count
    s_multi = "".join(rng.choice("aé€🔑") for _ in range(max(2, length // 3)))
    tokens = random_tokens(rng, 40)
    for s in (s_ascii, s_multi):
        for kw in (
            {"cache_salt": s},
            {"lora": (s, "/p/" + s[:10])},
            {"lora": ("n" + s[:5], s)},
            {"mm_items": [(s, 3, 4), (s, 9, 20)]},
            {"seed": s},
            {"seed": s, "cache_salt": s, "lora": (s, s), "mm_items": [(s, 0, 1), (s, 1, 1)]},
        ):
            check_all_vllm(tokens, 8, **kw)


@pytest.mark.parametrize("extra", [0, 1, 3, 5, 8, 9, 12, 40, 64])
def test_vllm_frame_boundary_near_64k(extra):
    """A frame that reaches 64 KiB right before/at a string or token: the commit
    happens at the next opcode boundary only."""
    base = 65536 - 32 - 40 - extra
    for size in (base - 1, base, base + 1, base + 7):
        salt = "z" * size
        tokens = list(range(1000, 1016))
        check_all_vllm(tokens * 2, 16, cache_salt=salt, lora=("ab", "cd"))
        check_all_vllm(
            tokens * 2, 16, lora=(salt, "cd"), mm_items=[("q" * 30, 2, 3), ("r" * 30, 6, 3)]
        )


def test_vllm_many_mm_items_in_one_block():
    """Several mm items per block: the "mm" tag is a BINGET after the first; the
    extra-keys tuple uses MARK...TUPLE from 4 keys on; memo indices pass 256
    (LONG_BINGET for a repeated shared one-character identifier)."""
    bs = 512
    items = [(f"item-{i:04d}", i, 1) for i in range(300)]
    items += [
        ("a", 300, 1),
        ("a", 301, 1),
        ("", 302, 1),
        ("", 303, 1),
        ("é", 304, 1),
        ("é", 305, 1),
    ]
    tokens = list(range(2 * bs))
    check_all_vllm(tokens, bs, mm_items=items)
    check_all_vllm(tokens, bs, mm_items=items, lora=("a", "a"), cache_salt="a")
    # 2, 3, 4, 5 items per block
    for k in (2, 3, 4, 5):
        its = [(f"id{j % 2}", j * (16 // k), 1) for j in range(k)]
        check_all_vllm(list(range(32)), 16, mm_items=its)
        check_all_vllm(list(range(32)), 16, mm_items=its, lora=("n1", "p1"), cache_salt="s1")


def test_vllm_shared_one_char_strings_are_memoised():
    """CPython shares "" and 1-char latin-1 strings, so a repeat inside one payload
    is a BINGET under vLLM's pickle; longer user strings are always written in full."""
    tokens = list(range(32))
    for kw in (
        {"lora": ("a", "a")},
        {"lora": ("a", "b"), "cache_salt": "a"},
        {"lora": ("", "")},
        {"lora": ("ÿ", "ÿ")},
        {"lora": ("€", "€")},  # not shared by CPython: written twice
        {"lora": ("ab", "ab")},  # not shared: written twice
        {"mm_items": [("a", 0, 2), ("a", 4, 2), ("b", 6, 1), ("a", 7, 1)]},
        {"mm_items": [("x", 0, 2)], "cache_salt": "x", "lora": ("x", "x")},
    ):
        check_all_vllm(tokens, 16, **kw)


def test_vllm_default_seed_and_none_hash():
    for algo in VLLM_ALGOS:
        assert kvindex.none_hash(algo=algo) == vllm_none_hash(algo, None)
        for seed in ["", "0", "random", "ü" * 200, "s" * 70000]:
            assert kvindex.none_hash(algo=algo, seed=seed) == vllm_none_hash(algo, seed)
    assert (
        kvindex.none_hash(algo="vllm_sha256").hex()
        == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    )
    assert (
        kvindex.none_hash(algo="vllm_sha256_cbor").hex()
        == "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    )


# ---------------------------------------------------------------------------------------
# 3. kvindex's own encodings (xxh3_128, sha256): pinned values + layout re-implemented
# ---------------------------------------------------------------------------------------

PIN_T48 = np.arange(48, dtype=np.int64)
PIN_BIG = np.array([2**40, I64_MIN, I64_MAX, -1, 0, 2**31, -(2**31) - 1, 7], dtype=np.int64)
PIN_KEYS = {
    "seed": "s",
    "cache_salt": "tenant",
    "lora": ("sql", "/p/sql"),
    "mm_items": [("img", 10, 12), ("img2", 30, 2)],
}
PINNED = {
    "xxh3_128": {
        "none": "f090f218a07dcabf9956b63ebd3fe01b",
        "none_s": "8d0f3adea25a5b370fcff68fd2b195f8",
        "plain": [
            "4d4db08e7b0966ce8a0cc3b5b20a2a25",
            "97b4d631f0c17111ef104f63d5431d0f",
            "39121f885d2824c63a35e1c5a2a45e7a",
        ],
        "keys": [
            "07e9b23db6c3fb84e77a81c1ade31ac9",
            "d7c3df0d450189243bcc5c1489c97cb3",
            "da864874689aca3a1315ddcc36b70c2e",
        ],
        "big": ["7ff7d16175d9bb3ad237589da33bbc5a", "99fd0274cbc2d72bdb555b2c65873043"],
    },
    "sha256": {
        "none": "ebbb39ecda9c5f8414caa1c8935660c5785805d0ea077c6b34220ee2353b5ce9",
        "none_s": "fa4171a89695a91fe5c430c839ed110ddd0c182adbff0ee8886d45c8fb37d3dd",
        "plain": [
            "7f491c708a824f3110b46fd4442e232c05e435c1671464a70a6baa18c6cd8621",
            "9223b62c77b28d82c49d8dc9e83182881aa8d743ae182d7df8431fb1a31a7737",
            "e9937225af88bcb6d4a055f943dea402bb90a32f8bc5fc87f144b02bd8e8c7aa",
        ],
        "keys": [
            "655844aabda745737c4e7c40944764908e9965db0d2a85498743828a39cb7ac8",
            "a4c0828ccba84a712f69ab9ee535940a2c19ef2209f0c93db4aa5c7619e2567c",
            "19ad29428f509a6efbd485ef523e4fa3f2ef0833bf2a9f2350a76f3c59b83f96",
        ],
        "big": [
            "7bde3517f6f4ad4edd3523dc3a4580c1fd0f7c4f7be48b07b6a30a5d174de443",
            "710a65ee1fb5b70b5858649f0ef0688a8f7c2a2128316df1ec4a0ff1faecf033",
        ],
    },
}


@pytest.mark.parametrize("algo", ["xxh3_128", "sha256"])
def test_compact_pinned_values(algo):
    p = PINNED[algo]
    assert kvindex.none_hash(algo=algo).hex() == p["none"]
    assert (
        kvindex.none_hash(algo=algo, seed="kvindex").hex() == p["none"]
    )  # the documented default seed
    assert kvindex.none_hash(algo=algo, seed="s").hex() == p["none_s"]
    for dt in (np.int32, np.int64):
        t = PIN_T48.astype(dt)
        assert [r.hex() for r in rows(kvindex.block_hashes(t, 16, algo=algo))] == p["plain"]
        assert [r.hex() for r in rows(kvindex.block_hashes(t, 16, algo=algo, **PIN_KEYS))] == p[
            "keys"
        ]
    assert [r.hex() for r in rows(kvindex.block_hashes(PIN_BIG, 4, algo=algo))] == p["big"]
    # algo is the default
    if algo == "xxh3_128":
        assert [r.hex() for r in rows(kvindex.block_hashes(PIN_T48, 16))] == p["plain"]
        assert kvindex.none_hash().hex() == p["none"]


@pytest.mark.parametrize("algo", ["xxh3_128", "sha256"])
def test_compact_pinned_values_follow_documented_layout(algo):
    """The pinned digests are the documented layout, not just whatever the code does."""
    p = PINNED[algo]
    assert compact_none_hash(algo, None).hex() == p["none"]
    assert compact_none_hash(algo, "s").hex() == p["none_s"]
    assert [h.hex() for h in compact_ref_chain(algo, PIN_T48, 16)] == p["plain"]
    assert [h.hex() for h in compact_ref_chain(algo, PIN_T48, 16, **PIN_KEYS)] == p["keys"]
    assert [h.hex() for h in compact_ref_chain(algo, PIN_BIG, 4)] == p["big"]


@settings(max_examples=200, deadline=None)
@given(_vllm_inputs(), st.sampled_from(["xxh3_128", "sha256"]))
def test_compact_layout_matches_python_reimplementation(inp, algo):
    tokens, bs, kw = inp
    assert kv_chain(algo, tokens, bs, **kw) == compact_ref_chain(algo, tokens, bs, **kw)
    assert kvindex.none_hash(algo=algo, seed=kw.get("seed")) == compact_none_hash(
        algo, kw.get("seed")
    )


def test_compact_token_width_depends_on_values_not_dtype():
    rng = np.random.default_rng(5)
    for algo in ALL_ALGOS:
        t64 = rng.integers(-(2**31), 2**31, size=100, dtype=np.int64)
        t64[[0, 17, 99]] = [-(2**31), 2**31 - 1, 0]
        a = kvindex.block_hashes(t64, 16, algo=algo)
        b = kvindex.block_hashes(t64.astype(np.int32), 16, algo=algo)
        assert np.array_equal(a, b), algo
    # beyond int32: only that block switches to 8-byte tokens; others are unchanged
    t = np.arange(64, dtype=np.int64)
    t2 = t.copy()
    t2[40] = 2**31
    for algo in ("xxh3_128", "sha256"):
        a, b = (
            rows(kvindex.block_hashes(t, 16, algo=algo)),
            rows(kvindex.block_hashes(t2, 16, algo=algo)),
        )
        assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
        assert b == compact_ref_chain(algo, t2, 16)


# ---------------------------------------------------------------------------------------
# 4. Properties of the chain (every algorithm)
# ---------------------------------------------------------------------------------------


def _prompt(n=100, seed=1):
    return np.random.default_rng(seed).integers(0, 150000, size=n, dtype=np.int64)


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_output_shape_and_dtype(algo):
    d = DIGEST_LEN[algo]
    for n, bs in [(0, 16), (1, 16), (15, 16), (16, 16), (17, 16), (100, 1), (100, 7)]:
        out = kvindex.block_hashes(_prompt(n), bs, algo=algo)
        assert out.dtype == np.uint8 and out.shape == (n // bs, d) and out.flags.c_contiguous
    assert len(kvindex.none_hash(algo=algo)) == d
    assert isinstance(kvindex.none_hash(algo=algo), bytes)


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_prefix_stability_and_partial_tail_ignored(algo):
    t = _prompt(203)
    kw = {"lora": ("n1", "p1"), "mm_items": [("img", 20, 40)], "cache_salt": "s1"}
    for extra in ({}, kw):
        full = rows(kvindex.block_hashes(t, 16, algo=algo, **extra))
        assert len(full) == 12
        for k in (0, 1, 15, 16, 17, 31, 32, 100, 192, 200):
            assert rows(kvindex.block_hashes(t[:k], 16, algo=algo, **extra)) == full[: k // 16]
        # the tail block's values do not matter
        t2 = t.copy()
        t2[192:] = -5
        assert rows(kvindex.block_hashes(t2, 16, algo=algo, **extra)) == full


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_chain_commits_to_every_earlier_token(algo):
    t = _prompt(64)
    base = rows(kvindex.block_hashes(t, 16, algo=algo))
    for pos in (0, 15, 16, 40, 63):
        t2 = t.copy()
        t2[pos] += 1
        h = rows(kvindex.block_hashes(t2, 16, algo=algo))
        b = pos // 16
        assert h[:b] == base[:b]
        assert all(x != y for x, y in zip(h[b:], base[b:], strict=True))


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_seed_sensitivity(algo):
    t = _prompt(64)
    seeds = [None, "", "0", "1", "vllm-none-hash", "kvindex", "random"]
    chains = {s: rows(kvindex.block_hashes(t, 16, algo=algo, seed=s)) for s in seeds}
    nones = {s: kvindex.none_hash(algo=algo, seed=s) for s in seeds}
    default = "kvindex" if algo in ("xxh3_128", "sha256") else "vllm-none-hash"
    assert chains[None] == chains[default] and nones[None] == nones[default]
    distinct = [s for s in seeds if s is not None]
    for i, a in enumerate(distinct):
        for b in distinct[i + 1 :]:
            assert nones[a] != nones[b]
            assert all(x != y for x, y in zip(chains[a], chains[b], strict=True)), (a, b)


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_salt_changes_every_block_through_the_chain(algo):
    t = _prompt(80)
    base = rows(kvindex.block_hashes(t, 16, algo=algo))
    s1 = rows(kvindex.block_hashes(t, 16, algo=algo, cache_salt="tenant-1"))
    s2 = rows(kvindex.block_hashes(t, 16, algo=algo, cache_salt="tenant-2"))
    assert all(a != b != c != a for a, b, c in zip(base, s1, s2, strict=True))
    # empty salt == no salt
    assert rows(kvindex.block_hashes(t, 16, algo=algo, cache_salt="")) == base
    # the salt is a key of block 0 only: block i>0 is H(parent, tokens, None) with the salted parent
    if algo in VLLM_MODES:
        ser, dig = VLLM_MODES[algo]
        toks = [int(x) for x in t]
        for i in range(1, 5):
            assert s1[i] == dig(ser((s1[i - 1], tuple(toks[16 * i : 16 * i + 16]), None)))


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_lora_changes_every_block(algo):
    t = _prompt(80)
    base = rows(kvindex.block_hashes(t, 16, algo=algo))
    variants = [("a1", "/p"), ("a2", "/p"), ("a1", "/q"), ("a1/", "p"), ("", "/p")]
    hs = [rows(kvindex.block_hashes(t, 16, algo=algo, lora=lo)) for lo in variants]
    for i, h in enumerate(hs):
        assert all(x != y for x, y in zip(h, base, strict=True))
        for h2 in hs[i + 1 :]:
            assert all(x != y for x, y in zip(h, h2, strict=True))
    # lora=None is no lora
    assert rows(kvindex.block_hashes(t, 16, algo=algo, lora=None)) == base
    # LoRA and salt keys are tagged: a salt equal to the LoRA name is not confused with it
    a = rows(kvindex.block_hashes(t, 16, algo=algo, cache_salt="x1"))
    b = rows(kvindex.block_hashes(t, 16, algo=algo, lora=("x1", "x1")))
    assert a[0] != b[0]


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_mm_item_changes_blocks_from_first_overlap(algo):
    t = _prompt(128)
    base = rows(kvindex.block_hashes(t, 16, algo=algo))
    for off, length in [(0, 1), (16, 1), (15, 2), (37, 20), (63, 1), (64, 100), (127, 5), (128, 4)]:
        h = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("img", off, length)]))
        first = off // 16
        assert h[:first] == base[:first], (off, length)
        assert all(x != y for x, y in zip(h[first:], base[first:], strict=True)), (off, length)
    # identifier matters, and so does the offset within the block
    a = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("img-a", 20, 4)]))
    b = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("img-b", 20, 4)]))
    c = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("img-a", 21, 4)]))
    assert a[0] == b[0] == c[0] == base[0] and a[1] != b[1] and a[1] != c[1]
    # empty mm list == None
    assert rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[])) == base


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_extra_keys_commit_to_each_block_they_touch(algo):
    """An mm item spanning blocks is a key of each of them (negative relative offset
    after its first block): moving its end changes exactly the blocks it reaches."""
    t = _prompt(96)
    short = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("v", 10, 10)]))  # blocks 0,1
    long_ = rows(kvindex.block_hashes(t, 16, algo=algo, mm_items=[("v", 10, 30)]))  # blocks 0,1,2
    # block 0 and 1 keys equal (same identifier, same relative offset): the chains agree up to 1
    assert short[:2] == long_[:2]
    assert all(x != y for x, y in zip(short[2:], long_[2:], strict=True))


# ---------------------------------------------------------------------------------------
# 5. GIL release: concurrent hashing of big prompts
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["xxh3_128", "vllm_sha256_cbor"])
def test_concurrent_hashing_matches_sequential(algo):
    rng = np.random.default_rng(11)
    prompts = [
        rng.integers(0, 200_000, size=2_000_000, dtype=np.int32),
        rng.integers(-(2**40), 2**40, size=2_000_000, dtype=np.int64),
    ]
    kws = [{}, {"cache_salt": "t", "lora": ("l", "/p"), "mm_items": [("img", 1000, 5000)]}]
    sequential = [
        kvindex.block_hashes(p, 16, algo=algo, **kw) for p, kw in zip(prompts, kws, strict=True)
    ]
    results: list = [None, None]
    errors: list = []
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = kvindex.block_hashes(prompts[i], 16, algo=algo, **kws[i])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads)
    assert not errors
    for got, want in zip(results, sequential, strict=True):
        assert got is not None and got.shape == (125_000, DIGEST_LEN[algo])
        assert np.array_equal(got, want)
    # the input arrays were not modified or left borrowed
    prompts[0][0] = 1
    prompts[1][0] = 1
