"""Builders and tolerances for the kernel tests (imported by the test modules).

Every paged cache built here is NaN in every slot that no sequence owns (including the
null block 0 and the tail of each sequence's last page), so a kernel that reads a slot it
should mask turns its output into NaN and the comparison fails loudly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "1") not in ("", "0")
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
FP8 = torch.float8_e4m3fn

#: (atol, rtol) of a kernel output against the fp32 oracle, by query dtype. fp16/bf16 are
#: about two output ulps (P is also rounded to the query dtype before the PV dot); the
#: GPU path computes fp32 dots in IEEE fp32, not TF32.
TOLERANCES = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Kernel output vs oracle with the dtype's tolerance; NaN anywhere fails."""
    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def quantize(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """What a cache of ``cache_dtype`` holds for the real values ``x``."""
    if cache_dtype == FP8:
        return (x.float() / scale).clamp(-448.0, 448.0).to(FP8)
    return x.to(cache_dtype)


@dataclass
class PagedKV:
    """A paged K/V cache with block tables for a batch of sequences."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def scales(self) -> dict[str, float]:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


def make_paged_kv(
    seq_lens: list[int],
    *,
    gen: torch.Generator,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    cache_dtype: torch.dtype,
    shared_prefix_blocks: int = 0,
    spare_blocks: int = 3,
    extra_columns: int = 2,
    pad_id: int = 0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> PagedKV:
    """Random K/V for each sequence, placed in randomly permuted pages.

    Block 0 is the null block and is never owned. With ``shared_prefix_blocks = n`` every
    sequence longer than ``n`` pages shares its first ``n`` pages (same physical blocks, same
    K/V) with the others. Unused table columns hold ``pad_id`` (0 = the NaN null block; use
    an out-of-range id to check the page-id loads are masked too).
    """
    pages_needed = [-(-n // block_size) for n in seq_lens]
    shared = shared_prefix_blocks
    sharing = [n > shared * block_size and shared > 0 for n in seq_lens]
    owned = sum(p - (shared if s else 0) for p, s in zip(pages_needed, sharing, strict=True))
    num_blocks = 1 + shared + owned + spare_blocks
    max_blocks = max(pages_needed, default=1) + extra_columns
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), device=DEVICE).to(cache_dtype)
    v_cache = torch.full(shape, float("nan"), device=DEVICE).to(cache_dtype)
    tables = torch.full((len(seq_lens), max_blocks), pad_id, dtype=torch.int32)

    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    common = [free.pop() for _ in range(shared)]
    common_k = randn(gen, shared * block_size, num_kv_heads, head_dim)
    common_v = randn(gen, shared * block_size, num_kv_heads, head_dim)
    for i, (n, pages, shares) in enumerate(zip(seq_lens, pages_needed, sharing, strict=True)):
        k = randn(gen, n, num_kv_heads, head_dim)
        v = randn(gen, n, num_kv_heads, head_dim)
        row = common[:] if shares else []
        if shares:
            k[: len(common_k)] = common_k
            v[: len(common_v)] = common_v
        row += [free.pop() for _ in range(pages - len(row))]
        tables[i, :pages] = torch.tensor(row, dtype=torch.int32)
        for j, page in enumerate(row):
            lo, hi = j * block_size, min(n, (j + 1) * block_size)
            k_cache[page, : hi - lo] = quantize(k[lo:hi], cache_dtype, k_scale)
            v_cache[page, : hi - lo] = quantize(v[lo:hi], cache_dtype, v_scale)
    return PagedKV(
        k_cache,
        v_cache,
        tables.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        k_scale,
        v_scale,
    )


def query_start_loc(q_lens: list[int]) -> torch.Tensor:
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=DEVICE)
