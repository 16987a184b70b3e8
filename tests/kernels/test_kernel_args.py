"""The launchers reject bad arguments with kvindex's exception classes, before launching."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from paged_testlib import DEVICE, FP8

from kvindex.exceptions import DTypeError, InvalidArgumentError, KvIndexError
from kvindex.kernels import paged_decode_attention, paged_prefill_attention, store_kv

I32, I64 = torch.int32, torch.int64


def _decode_args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "q": torch.zeros(2, 4, 64, device=DEVICE),
        "k_cache": torch.zeros(5, 16, 2, 64, device=DEVICE),
        "v_cache": torch.zeros(5, 16, 2, 64, device=DEVICE),
        "block_tables": torch.zeros(2, 3, dtype=I32, device=DEVICE),
        "seq_lens": torch.ones(2, dtype=I32, device=DEVICE),
    }
    args.update(over)
    return args


def _prefill_args(**over: Any) -> dict[str, Any]:
    args = _decode_args()
    args["q"] = torch.zeros(3, 4, 64, device=DEVICE)
    args["query_start_loc"] = torch.tensor([0, 1, 3], dtype=I32, device=DEVICE)
    args["max_query_len"] = 2
    args.update(over)
    return args


def _store_args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "key": torch.zeros(3, 2, 64, device=DEVICE),
        "value": torch.zeros(3, 2, 64, device=DEVICE),
        "k_cache": torch.zeros(5, 16, 2, 64, device=DEVICE),
        "v_cache": torch.zeros(5, 16, 2, 64, device=DEVICE),
        "slot_mapping": torch.zeros(3, dtype=I64, device=DEVICE),
    }
    args.update(over)
    return args


CASES: list[tuple[str, Callable[..., Any], dict[str, Any], type[Exception]]] = [
    ("q not a tensor", paged_decode_attention, _decode_args(q=[[0.0]]), DTypeError),
    ("q int", paged_decode_attention, _decode_args(q=torch.zeros(2, 4, 64, dtype=I32)), DTypeError),
    ("q 2-D", paged_decode_attention, _decode_args(q=torch.zeros(2, 256)), DTypeError),
    ("q last dim strided", paged_decode_attention,
     _decode_args(q=torch.zeros(2, 4, 128, device=DEVICE)[..., ::2]), DTypeError),
    ("Hq not multiple of Hkv", paged_decode_attention,
     _decode_args(q=torch.zeros(2, 3, 64)), InvalidArgumentError),
    ("head_dim mismatch", paged_decode_attention,
     _decode_args(q=torch.zeros(2, 4, 80)), InvalidArgumentError),
    ("head_dim not a multiple of 8", paged_decode_attention,
     _decode_args(q=torch.zeros(2, 4, 44), k_cache=torch.zeros(5, 16, 2, 44),
                  v_cache=torch.zeros(5, 16, 2, 44)), InvalidArgumentError),
    ("head_dim above 256", paged_decode_attention,
     _decode_args(q=torch.zeros(2, 4, 264), k_cache=torch.zeros(5, 16, 2, 264),
                  v_cache=torch.zeros(5, 16, 2, 264)), InvalidArgumentError),
    ("block size 0", paged_decode_attention,
     _decode_args(k_cache=torch.zeros(5, 0, 2, 64), v_cache=torch.zeros(5, 0, 2, 64)),
     InvalidArgumentError),
    # A page size the caches refuse too (they accept 1..2**20); a stride-0 view, no memory.
    ("block size 2**20 + 1", paged_decode_attention,
     _decode_args(k_cache=torch.zeros(2, 1, 2, 64, device=DEVICE).expand(2, 2**20 + 1, 2, 64),
                  v_cache=torch.zeros(2, 1, 2, 64, device=DEVICE).expand(2, 2**20 + 1, 2, 64)),
     InvalidArgumentError),
    ("k/v shapes differ", paged_decode_attention,
     _decode_args(v_cache=torch.zeros(6, 16, 2, 64)), InvalidArgumentError),
    ("cache dtype differs from q", paged_decode_attention,
     _decode_args(k_cache=torch.zeros(5, 16, 2, 64, dtype=torch.float16),
                  v_cache=torch.zeros(5, 16, 2, 64, dtype=torch.float16)), DTypeError),
    ("block_tables int64", paged_decode_attention,
     _decode_args(block_tables=torch.zeros(2, 3, dtype=I64)), DTypeError),
    ("seq_lens int64", paged_decode_attention,
     _decode_args(seq_lens=torch.ones(2, dtype=I64)), DTypeError),
    ("block_tables rows", paged_decode_attention,
     _decode_args(block_tables=torch.zeros(3, 3, dtype=I32)), InvalidArgumentError),
    ("num_splits 0", paged_decode_attention, {**_decode_args(), "num_splits": 0},
     InvalidArgumentError),
    ("num_splits 1000", paged_decode_attention, {**_decode_args(), "num_splits": 1000},
     InvalidArgumentError),
    ("negative window", paged_decode_attention, {**_decode_args(), "sliding_window": -1},
     InvalidArgumentError),
    ("float window", paged_decode_attention, {**_decode_args(), "sliding_window": 2.5},
     DTypeError),
    ("negative softcap", paged_decode_attention, {**_decode_args(), "softcap": -1.0},
     InvalidArgumentError),
    ("zero scale", paged_decode_attention, {**_decode_args(), "scale": 0.0},
     InvalidArgumentError),
    ("k_scale without fp8", paged_decode_attention, {**_decode_args(), "k_scale": 2.0},
     InvalidArgumentError),
    ("tensor v_scale", paged_decode_attention,
     {**_decode_args(k_cache=torch.zeros(5, 16, 2, 64).to(FP8),
                     v_cache=torch.zeros(5, 16, 2, 64).to(FP8)),
      "v_scale": torch.ones(())}, DTypeError),
    ("out wrong shape", paged_decode_attention, {**_decode_args(), "out": torch.zeros(2, 4, 32)},
     InvalidArgumentError),
    ("out wrong dtype", paged_decode_attention,
     {**_decode_args(), "out": torch.zeros(2, 4, 64, dtype=torch.float16)}, DTypeError),
    ("tables on another device", paged_decode_attention,
     _decode_args(block_tables=torch.zeros(2, 3, dtype=I32, device="meta")),
     InvalidArgumentError),
    ("query_start_loc length", paged_prefill_attention,
     _prefill_args(query_start_loc=torch.tensor([0, 3], dtype=I32)), InvalidArgumentError),
    ("query_start_loc int64", paged_prefill_attention,
     _prefill_args(query_start_loc=torch.tensor([0, 1, 3], dtype=I64)), DTypeError),
    ("max_query_len 0 with tokens", paged_prefill_attention,
     _prefill_args(max_query_len=0), InvalidArgumentError),
    ("slot_mapping int32", store_kv, _store_args(slot_mapping=torch.zeros(3, dtype=I32)),
     DTypeError),
    ("slot_mapping length", store_kv, _store_args(slot_mapping=torch.zeros(4, dtype=I64)),
     InvalidArgumentError),
    ("key heads", store_kv,
     _store_args(key=torch.zeros(3, 1, 64), value=torch.zeros(3, 1, 64)), InvalidArgumentError),
    ("key/value dtypes differ", store_kv,
     _store_args(value=torch.zeros(3, 2, 64, dtype=torch.float16)), InvalidArgumentError),
    ("fp16 key into fp32 cache", store_kv,
     _store_args(key=torch.zeros(3, 2, 64, dtype=torch.float16),
                 value=torch.zeros(3, 2, 64, dtype=torch.float16)), DTypeError),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "kwargs", "exc"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_arguments_raise(
    fn: Callable[..., Any], kwargs: dict[str, Any], exc: type[Exception]
) -> None:
    with pytest.raises(exc) as info:
        fn(**{k: v.to(DEVICE) if _movable(v) else v for k, v in kwargs.items()})
    assert isinstance(info.value, KvIndexError)
    base = TypeError if exc is DTypeError else ValueError
    assert isinstance(info.value, base)


def _movable(v: object) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type not in ("meta", DEVICE.type)


def test_kernels_accept_exactly_the_page_sizes_the_caches_accept() -> None:
    from kvindex import HashChainCache
    from kvindex.kernels._checks import MAX_BLOCK_SIZE

    HashChainCache(2, MAX_BLOCK_SIZE)
    with pytest.raises(InvalidArgumentError):
        HashChainCache(2, MAX_BLOCK_SIZE + 1)


def test_errors_leave_out_untouched() -> None:
    out = torch.full((2, 4, 64), 7.0, device=DEVICE)
    with pytest.raises(InvalidArgumentError):
        paged_decode_attention(**_decode_args(), out=out, num_splits=99)
    assert (out == 7.0).all()
