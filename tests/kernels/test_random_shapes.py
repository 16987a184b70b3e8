"""Seeded random cases (hypothesis, derandomized): page sizes, groups, lengths, windows."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged_testlib import assert_close, make_paged_kv, query_start_loc, randn

from kvindex.kernels import paged_decode_attention, paged_prefill_attention
from kvindex.kernels.reference import ref_paged_decode, ref_paged_prefill

CASE = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]),
        "kv_heads": st.sampled_from([1, 2]),
        "group": st.sampled_from([1, 2, 3, 5]),
        "prefixes": st.lists(st.integers(0, 150), min_size=1, max_size=3),
        "q_len": st.integers(0, 40),
        "window": st.sampled_from([0, 0, 1, 7, 40]),
        "softcap": st.sampled_from([0.0, 0.0, 4.0]),
        "splits": st.integers(1, 5),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=8, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(case=CASE)
def test_random_decode_and_prefill_match_oracle(case: dict[str, int | float | list[int]]) -> None:
    prefixes = case["prefixes"]
    assert isinstance(prefixes, list)
    q_lens = [int(case["q_len"]) if i % 2 == 0 else 1 for i in range(len(prefixes))]
    seq_lens = [max(p + q, 1) for p, q in zip(prefixes, q_lens, strict=True)]
    q_lens = [min(q, s) for q, s in zip(q_lens, seq_lens, strict=True)]
    gen = torch.Generator().manual_seed(int(case["seed"]))
    hkv = int(case["kv_heads"])
    hq = hkv * int(case["group"])
    kv = make_paged_kv(seq_lens, gen=gen, block_size=int(case["block_size"]), num_kv_heads=hkv,
                       head_dim=64, cache_dtype=torch.float16)  # fmt: skip
    opts = {"sliding_window": int(case["window"]), "softcap": float(case["softcap"])}
    tables = (kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens)

    q = randn(gen, len(seq_lens), hq, 64, dtype=torch.float16)
    out = paged_decode_attention(q, *tables, num_splits=int(case["splits"]), **opts)
    assert_close(out, ref_paged_decode(q, *tables, **opts), torch.float16)

    qsl = query_start_loc(q_lens)
    q = randn(gen, sum(q_lens), hq, 64, dtype=torch.float16)
    out = paged_prefill_attention(q, *tables, qsl, max(max(q_lens), 1), **opts)
    assert_close(out, ref_paged_prefill(q, *tables, qsl, **opts), torch.float16)
