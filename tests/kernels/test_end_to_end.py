"""End-to-end: prefix reuse through kvindex's caches is exact.

A small seeded 2-layer attention model (RoPE, GQA, MLP; fp32) runs requests that share
prefixes through a real prefix cache: ``admit`` finds the cached prefix, only the uncached
tokens are computed (prefill with prefix, then decode steps), their K/V go into the paged
caches through ``slot_mapping`` and attention reads them back through ``block_tables``.
Every computed logit must equal the same model run densely over the whole sequence, with
no cache, for hit lengths 0, partial and full, after evictions reuse blocks, for page
sizes 16 and 1. Unwritten cache slots are NaN, so reading one shows up in the logits.

To cover another cache design, add a factory to ``CACHES``: it gets ``(num_blocks,
block_size)`` and returns an object with the ``kvindex.protocol.PrefixCache`` calls used
here (``admit``, ``append_batch``, ``slot_mapping``, ``block_tables``, ``num_tokens``,
``free``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from paged_testlib import DEVICE

import kvindex
from kvindex.kernels import paged_decode_attention, paged_prefill_attention, store_kv
from kvindex.kernels.reference import dense_causal_attention

CACHES: list[Any] = [
    pytest.param(lambda num_blocks, block_size: kvindex.HashChainCache(num_blocks, block_size),
                 id="hash_chain"),
    pytest.param(lambda num_blocks, block_size: kvindex.RadixPrefixCache(num_blocks, block_size),
                 id="radix"),
]  # fmt: skip

VOCAB, DIM, HQ, HKV, HEAD_DIM, LAYERS = 50, 64, 2, 1, 64, 2
POOL_TOKENS = 160  # small enough that phase 3 evicts


class TinyModel:
    """Pre-norm transformer blocks: RMSNorm -> attention (RoPE, GQA) -> MLP; tied nothing."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) / shape[0] ** 0.5).to(DEVICE)

        self.embed = w(VOCAB, DIM) * 8
        self.layers = [
            {
                "wq": w(DIM, HQ * HEAD_DIM),
                "wk": w(DIM, HKV * HEAD_DIM),
                "wv": w(DIM, HKV * HEAD_DIM),
                "wo": w(HQ * HEAD_DIM, DIM),
                "w1": w(DIM, 2 * DIM),
                "w2": w(2 * DIM, DIM),
            }
            for _ in range(LAYERS)
        ]
        self.unembed = w(DIM, VOCAB)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        self.inv_freq = inv_freq.to(DEVICE)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        angles = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(
        self,
        tokens: torch.Tensor,
        pos: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Logits of ``tokens`` at positions ``pos``; ``attend(layer, q, k, v)`` does attention."""
        x = self.embed[tokens]
        for i, p in enumerate(self.layers):
            h = self._norm(x)
            q = self._rope((h @ p["wq"]).view(-1, HQ, HEAD_DIM), pos)
            k = self._rope((h @ p["wk"]).view(-1, HKV, HEAD_DIM), pos)
            v = (h @ p["wv"]).view(-1, HKV, HEAD_DIM)
            x = x + attend(i, q, k, v).reshape(-1, HQ * HEAD_DIM) @ p["wo"]
            x = x + torch.nn.functional.gelu(self._norm(x) @ p["w1"]) @ p["w2"]
        return self._norm(x) @ self.unembed

    def dense_logits(self, tokens: list[int]) -> torch.Tensor:
        """The no-cache reference: the whole sequence at once, causal attention."""
        t = torch.tensor(tokens, device=DEVICE)
        pos = torch.arange(len(tokens), device=DEVICE)
        return self.forward(t, pos, lambda _, q, k, v: dense_causal_attention(q, k, v))


class PagedRunner:
    """Drives the model through a prefix cache and the paged kernels; checks every logit."""

    def __init__(self, model: TinyModel, cache: Any, num_blocks: int, block_size: int) -> None:
        self.model, self.cache = model, cache
        shape = (num_blocks, block_size, HKV, HEAD_DIM)
        self.kv = [
            (torch.full(shape, float("nan"), device=DEVICE),
             torch.full(shape, float("nan"), device=DEVICE))
            for _ in range(LAYERS)
        ]  # fmt: skip
        self.tokens: dict[int, list[int]] = {}
        self.hits: list[tuple[int, int]] = []  # (num_cached_tokens, prompt length)

    def _ids(self, rids: list[int]) -> np.ndarray:
        return np.asarray(rids, dtype=np.int64)

    def _run(self, rids: list[int], new: list[list[int]], decode: bool) -> None:
        seq_lens = [self.cache.num_tokens(r) for r in rids]
        assert seq_lens == [len(self.tokens[r]) for r in rids]
        q_lens = [len(n) for n in new]
        slots = self.cache.slot_mapping(self._ids(rids), np.asarray(q_lens, dtype=np.int64))
        tables = self.cache.block_tables(self._ids(rids))
        slots_t = torch.from_numpy(slots).to(DEVICE)
        tables_t = torch.from_numpy(tables).to(DEVICE)
        lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
        qsl = torch.tensor(np.cumsum([0, *q_lens]), dtype=torch.int32, device=DEVICE)
        pos = torch.cat([torch.arange(s - q, s) for s, q in zip(seq_lens, q_lens, strict=True)])
        tokens = torch.tensor([t for n in new for t in n], device=DEVICE)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self.kv[layer]
            store_kv(k.contiguous(), v.contiguous(), k_cache, v_cache, slots_t)
            if decode:
                return paged_decode_attention(q, k_cache, v_cache, tables_t, lens_t, num_splits=2)
            return paged_prefill_attention(q, k_cache, v_cache, tables_t, lens_t, qsl, max(q_lens))

        logits = self.model.forward(tokens, pos.to(DEVICE), attend)
        start = 0
        for r, s, q in zip(rids, seq_lens, q_lens, strict=True):
            want = self.model.dense_logits(self.tokens[r])[s - q :]
            torch.testing.assert_close(logits[start : start + q], want, atol=2e-4, rtol=2e-4)
            start += q

    def prefill(self, requests: dict[int, list[int]]) -> list[int]:
        hits = []
        for rid, prompt in requests.items():
            adm = self.cache.admit(rid, np.asarray(prompt, dtype=np.int64))
            assert adm is not None, "pool too small for the scenario"
            self.tokens[rid] = list(prompt)
            hits.append(adm.num_cached_tokens)
            self.hits.append((adm.num_cached_tokens, len(prompt)))
        rids = list(requests)
        self._run(rids, [requests[r][h:] for r, h in zip(rids, hits, strict=True)], decode=False)
        return hits

    def decode(self, rids: list[int], gen: torch.Generator) -> None:
        toks = torch.randint(0, VOCAB, (len(rids),), generator=gen).tolist()
        assert self.cache.append_batch(self._ids(rids), np.asarray(toks, dtype=np.int64))
        for r, t in zip(rids, toks, strict=True):
            self.tokens[r].append(t)
        self._run(rids, [[t] for t in toks], decode=True)

    def free(self, rids: list[int]) -> None:
        for r in rids:
            self.cache.free(r)
            del self.tokens[r]


@pytest.mark.parametrize("block_size", [16, 1])
@pytest.mark.parametrize("make_cache", CACHES)
def test_prefix_cached_model_equals_dense_model(
    make_cache: Callable[[int, int], Any], block_size: int
) -> None:
    gen = torch.Generator().manual_seed(1234)
    num_blocks = POOL_TOKENS // block_size + 1  # + the null block
    runner = PagedRunner(TinyModel(seed=7), make_cache(num_blocks, block_size), num_blocks,
                         block_size)  # fmt: skip

    def tokens(n: int) -> list[int]:
        return torch.randint(0, VOCAB, (n,), generator=gen).tolist()

    # 1. Cold: a 40-token prompt, nothing cached; then decode steps. Finished.
    prompt = tokens(40)
    assert runner.prefill({1: prompt}) == [0]
    runner.decode([1], gen)
    runner.decode([1], gen)
    finished = list(runner.tokens[1])
    runner.free([1])

    # 2. One batch: a partial hit (shares 20 tokens), the finished sequence plus new tokens,
    #    and the same prompt again (full hit: everything but the last token, page-aligned).
    full = (len(prompt) - 1) // block_size * block_size
    hits = runner.prefill({2: prompt[:20] + tokens(15), 3: finished + tokens(4), 4: prompt})
    assert 0 < hits[0] < full and hits[2] == full and hits[1] >= full
    runner.decode([2, 3, 4], gen)
    runner.decode([2, 3, 4], gen)
    runner.free([2, 3, 4])

    # 3. Evictions: an unrelated long request takes most of the pool, so most of the
    #    prompt's blocks are handed out again; re-running the prompt hits less (7 shares
    #    the prefix 6 is computing in the same batch) and the reused blocks hold new K/V.
    assert runner.prefill({5: tokens(150)}) == [0]
    runner.decode([5], gen)
    runner.free([5])
    again = runner.prefill({6: prompt, 7: prompt[:20] + tokens(5)})
    assert again[0] < full
    runner.decode([6, 7], gen)
    runner.free([6, 7])

    kinds = {"zero" if h == 0 else "full" if h == (n - 1) // block_size * block_size
             else "partial" for h, n in runner.hits}  # fmt: skip
    assert kinds == {"zero", "partial", "full"}
