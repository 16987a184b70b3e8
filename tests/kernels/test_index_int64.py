"""Caches with more than 2**31 elements: page ids and strides must be widened to int64.

The K and V caches here have 2**31 + 65536 fp16 elements each (4 GiB of address space) and
the sequences live in the last pages, so ``page * stride_k_block`` is above 2**31. On CPU
``torch.empty`` only reserves the address space; the few pages written are all that get
committed (the child process checks its peak RSS stays far below 4 GiB). An int32 overflow
in the kernels' index maths would read/write 4 GiB away from the right slots: under the
interpreter that is a segfault or garbage, so the test runs in a child process and checks
its exit code and its comparison with the oracle (store_kv, decode with splits, prefill).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, resource, sys, warnings
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch
    from kvindex.kernels import paged_decode_attention, paged_prefill_attention, store_kv
    from kvindex.kernels.reference import ref_paged_decode, ref_paged_prefill

    dev = torch.device("cpu" if os.environ.get("TRITON_INTERPRET", "1") != "0" else "cuda")
    bs, hkv, hq, d = 16, 1, 4, 64
    first = 2**31 // (bs * hkv * d)  # first page whose offset is >= 2**31 elements
    num_blocks = first + 64
    k_cache = torch.empty((num_blocks, bs, hkv, d), dtype=torch.float16, device=dev)
    v_cache = torch.empty_like(k_cache)
    assert k_cache.numel() > 2**31
    k_cache[first - 8 :] = float("nan")  # poison the neighbourhood of the used pages
    v_cache[first - 8 :] = float("nan")
    k_cache[:4] = float("nan")
    v_cache[:4] = float("nan")

    gen = torch.Generator().manual_seed(0)
    lens = [70, 33]
    tables = torch.tensor(
        [[first + 3, first + 9, first + 1, first + 60, 1], [2, first + 40, first + 5, 0, 0]],
        dtype=torch.int32,
    )
    slots, keys, values = [], [], []
    for i, n in enumerate(lens):
        for t in range(n):
            slots.append(int(tables[i, t // bs]) * bs + t % bs)
        keys.append(torch.randn(n, hkv, d, generator=gen, dtype=torch.float32))
        values.append(torch.randn(n, hkv, d, generator=gen, dtype=torch.float32))
    key = torch.cat(keys).half().to(dev)
    value = torch.cat(values).half().to(dev)
    store_kv(key, value, k_cache, v_cache, torch.tensor(slots, device=dev))
    tables, seq_lens = tables.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)

    q = torch.randn(2, hq, d, generator=gen).half().to(dev)
    out = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, num_splits=2)
    ref = ref_paged_decode(q, k_cache, v_cache, tables, seq_lens)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)

    q = torch.randn(9, hq, d, generator=gen).half().to(dev)
    qsl = torch.tensor([0, 5, 9], dtype=torch.int32, device=dev)
    out = paged_prefill_attention(q, k_cache, v_cache, tables, seq_lens, qsl, 5)
    ref = ref_paged_prefill(q, k_cache, v_cache, tables, seq_lens, qsl)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)

    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    assert dev.type == "cuda" or peak_gib < 2.0, f"peak RSS {peak_gib:.2f} GiB: not lazy"
    print("ok", round(peak_gib, 2))
    """
)


def test_cache_larger_than_2_pow_31_elements() -> None:
    env = dict(os.environ)
    env.setdefault("TRITON_INTERPRET", "1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.startswith("ok")
