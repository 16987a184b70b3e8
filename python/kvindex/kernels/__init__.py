"""Triton paged-attention kernels driven by kvindex's block tables and slot mappings.

Needs torch and triton (``pip install 'kvindex[kernels]'``); ``import kvindex`` alone never
imports this package. On a CPU-only machine set ``TRITON_INTERPRET=1`` before the first
import to run the kernels in Triton's interpreter (slow; for tests).

- :func:`store_kv` writes new tokens' K/V into the paged cache through ``slot_mapping``;
- :func:`paged_decode_attention`: one new token per sequence, split-KV;
- :func:`paged_prefill_attention`: varlen new tokens after cached prefixes (split-KV for
  short queries such as speculative-decode verification);
- :mod:`kvindex.kernels.reference`: the torch fp32 oracle used by tests and benchmarks.

The layouts and rules are in :mod:`kvindex.kernels.attention` and ``kernels/CONTRACT.md``.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kvindex.kernels needs torch and triton: pip install 'kvindex[kernels]'"
    ) from exc

from kvindex.kernels.attention import paged_decode_attention, paged_prefill_attention, store_kv

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv"]
