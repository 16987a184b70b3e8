"""A small pure-Python model of vLLM 0.33's prefix cache (single full-attention group).

It is the oracle for kvindex's ``HashChainCache`` in the property tests and the
in-run baseline of the benchmark. It hashes exactly as vLLM's default ``sha256``
mode does (SHA-256 of ``pickle.dumps((parent, tuple(tokens), extra_keys), 5)``),
so its chains equal kvindex's ``vllm_sha256`` chains (LoRA and cache salt keys;
no multimodal items). The free queue is a doubly linked list over block ids, as
in vLLM, so every operation has vLLM's costs.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field

NONE = -1


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


@dataclass
class _Req:
    tokens: list[int]
    salt: str | None
    lora: tuple[str, str] | None
    hashes: list[bytes] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0


class HashChainModel:
    """Reference semantics: admit / append / free / evict_blocks / reset."""

    def __init__(self, num_blocks: int, block_size: int, seed: str = "vllm-none-hash") -> None:
        assert num_blocks >= 2 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.none_hash = _sha256_pickle(seed)
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        self.map: dict[bytes, list[int]] = {}
        self.reqs: dict[int, _Req] = {}
        # linked list: head sentinel = num_blocks, tail sentinel = num_blocks + 1
        self.head, self.tail = num_blocks, num_blocks + 1
        self.prev = [NONE] * (num_blocks + 2)
        self.next = [NONE] * (num_blocks + 2)
        self.next[self.head], self.prev[self.tail] = self.tail, self.head
        self.num_free = 0
        for b in range(1, num_blocks):
            self._link_before(self.tail, b)
        self.queries = self.hits = self.requests = self.evictions = 0

    # ---- free queue -------------------------------------------------------
    def _link_before(self, at: int, b: int) -> None:
        p = self.prev[at]
        self.prev[b], self.next[b] = p, at
        self.next[p] = b
        self.prev[at] = b
        self.num_free += 1

    def _unlink(self, b: int) -> None:
        p, n = self.prev[b], self.next[b]
        assert p != NONE, f"block {b} not queued"
        self.next[p], self.prev[n] = n, p
        self.prev[b] = self.next[b] = NONE
        self.num_free -= 1

    def free_queue(self) -> list[int]:
        out, cur = [], self.next[self.head]
        while cur != self.tail:
            out.append(cur)
            cur = self.next[cur]
        return out

    # ---- hashing ------------------------------------------------------------
    def _extend_hashes(self, r: _Req) -> None:
        bs = self.block_size
        for i in range(len(r.hashes), len(r.tokens) // bs):
            keys: tuple[tuple[str, ...], ...] = ()
            if r.lora is not None:
                keys += (("lora", r.lora[0], r.lora[1]),)
            if i == 0 and r.salt:
                keys += (("cache_salt", r.salt),)
            parent = r.hashes[-1] if r.hashes else self.none_hash
            toks = tuple(r.tokens[i * bs : (i + 1) * bs])
            r.hashes.append(_sha256_pickle((parent, toks, keys or None)))

    def _hit_blocks(self, r: _Req) -> int:
        cap = (len(r.tokens) - 1) // self.block_size
        k = 0
        while k < min(cap, len(r.hashes)) and r.hashes[k] in self.map:
            k += 1
        return k

    # ---- pool ---------------------------------------------------------------
    def _allocate(self, n: int, out: list[int]) -> None:
        for _ in range(n):
            b = self.next[self.head]
            self._unlink(b)
            h = self.hash[b]
            if h is not None:
                copies = self.map[h]
                copies.remove(b)
                if not copies:
                    del self.map[h]
                self.hash[b] = None
                self.evictions += 1
            self.ref[b] = 1
            out.append(b)

    def _cache_full(self, r: _Req) -> None:
        full = len(r.tokens) // self.block_size
        for i in range(r.num_cached, full):
            b, h = r.blocks[i], r.hashes[i]
            self.hash[b] = h
            self.map.setdefault(h, []).append(b)
        r.num_cached = max(r.num_cached, full)

    # ---- public operations -----------------------------------------------
    def lookup(
        self, tokens: Sequence[int], salt: str | None = None, lora: tuple[str, str] | None = None
    ) -> int:
        r = _Req(list(tokens), salt, lora)
        self._extend_hashes(r)
        return self._hit_blocks(r) * self.block_size

    def admit(
        self,
        rid: int,
        tokens: Sequence[int],
        salt: str | None = None,
        lora: tuple[str, str] | None = None,
        skip_reading: bool = False,
    ) -> tuple[int, list[int]] | None:
        assert rid not in self.reqs and len(tokens) > 0
        r = _Req(list(tokens), salt, lora)
        self._extend_hashes(r)
        k = 0 if skip_reading else self._hit_blocks(r)
        hits = [self.map[h][0] for h in r.hashes[:k]]
        new = -(-len(r.tokens) // self.block_size) - k
        free_hits = sum(1 for b in hits if self.ref[b] == 0)
        if new + free_hits > self.num_free:
            return None
        for b in hits:
            if self.ref[b] == 0:
                self._unlink(b)
            self.ref[b] += 1
        r.blocks = hits
        self._allocate(new, r.blocks)
        r.num_cached = k
        self._cache_full(r)
        self.reqs[rid] = r
        self.requests += 1
        self.queries += len(r.tokens)
        self.hits += k * self.block_size
        return k * self.block_size, list(r.blocks)

    def _need(self, r: _Req, extra: int) -> int:
        return -(-(len(r.tokens) + extra) // self.block_size) - len(r.blocks)

    def append(self, rid: int, tokens: Sequence[int]) -> bool:
        r = self.reqs[rid]
        need = self._need(r, len(tokens))
        if need > self.num_free:
            return False
        r.tokens.extend(tokens)
        self._allocate(need, r.blocks)
        self._extend_hashes(r)
        self._cache_full(r)
        return True

    def append_batch(self, rids: Sequence[int], tokens: Sequence[Sequence[int]]) -> bool:
        assert len(set(rids)) == len(rids)
        need = sum(self._need(self.reqs[rid], len(t)) for rid, t in zip(rids, tokens, strict=True))
        if need > self.num_free:
            return False
        for rid, t in zip(rids, tokens, strict=True):
            assert self.append(rid, t)
        return True

    def free(self, rid: int) -> None:
        r = self.reqs.pop(rid)
        unhashed: list[int] = []
        for b in reversed(r.blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash[b] is None:
                    unhashed.append(b)
                else:
                    self._link_before(self.tail, b)
        at = self.next[self.head]
        for b in unhashed:
            self._link_before(at, b)

    def evict_blocks(self, ids: Sequence[int]) -> int:
        assert all(1 <= b < self.num_blocks and self.ref[b] == 0 for b in ids)
        n = 0
        for b in ids:
            h = self.hash[b]
            if h is not None:
                self.map[h].remove(b)
                if not self.map[h]:
                    del self.map[h]
                self.hash[b] = None
                n += 1
        self.evictions += n
        return n

    def reset(self) -> None:
        assert not self.reqs
        self.map.clear()
        self.hash = [None] * self.num_blocks
