"""Argument checks shared by the kernel launchers (host side, no device syncs)."""

from __future__ import annotations

import math

import torch

from kvindex.exceptions import DTypeError, InvalidArgumentError

#: Query / new K/V dtypes the kernels accept (the output has the query's dtype).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The one quantised cache dtype: fp8 e4m3 with per-tensor scales.
FP8_DTYPE = torch.float8_e4m3fn
#: Head dims: multiples of ``HEAD_DIM_MULTIPLE`` in ``MIN_HEAD_DIM..MAX_HEAD_DIM`` (32, 64,
#: 80, 96, 112, 120, 128, 192, 256 ...), run in a power-of-two tile with a mask.
MIN_HEAD_DIM, MAX_HEAD_DIM, HEAD_DIM_MULTIPLE = 32, 256, 8
#: Page sizes: any value in ``1..MAX_BLOCK_SIZE``, the caches' own rule (``HashChainCache``
#: and ``RadixTree`` accept page sizes 1..=2**20); powers of two or not.
MAX_BLOCK_SIZE = 2**20


def head_dim_supported(head_dim: int) -> bool:
    return MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim % HEAD_DIM_MULTIPLE == 0


def check_tensor(
    name: str,
    t: object,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    *,
    contiguous_last: bool = True,
) -> torch.Tensor:
    """Checks type, rank, dtype and a contiguous last dim; returns ``t`` as a tensor."""
    if not isinstance(t, torch.Tensor):
        raise DTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise DTypeError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise DTypeError(f"{name} must have dtype in ({allowed}), got {t.dtype}")
    if contiguous_last and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise DTypeError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
    return t


def check_same_device(device: torch.device, interpreted: bool, **tensors: torch.Tensor) -> None:
    """All tensors on ``device``; CPU tensors only when the kernels run in the interpreter."""
    for name, t in tensors.items():
        if t.device != device:
            raise InvalidArgumentError(f"{name} is on {t.device}, expected {device}")
    if device.type == "cpu" and not interpreted:
        raise InvalidArgumentError(
            "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
            "kvindex.kernels is first imported"
        )


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    """Validates the paged K/V caches; returns ``(block_size, num_kv_heads, head_dim)``."""
    dtypes = (*FLOAT_DTYPES, FP8_DTYPE)
    check_tensor("k_cache", k_cache, 4, dtypes)
    check_tensor("v_cache", v_cache, 4, dtypes)
    if k_cache.shape != v_cache.shape:
        raise InvalidArgumentError(
            f"k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise DTypeError(f"k_cache and v_cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if block_size < 1 or block_size > MAX_BLOCK_SIZE:
        raise InvalidArgumentError(
            f"block_size (k_cache.shape[1]) must be in 1..{MAX_BLOCK_SIZE}, got {block_size}"
        )
    if not head_dim_supported(head_dim):
        raise InvalidArgumentError(
            f"head_dim must be a multiple of {HEAD_DIM_MULTIPLE} in "
            f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}, got {head_dim}"
        )
    if num_kv_heads < 1:
        raise InvalidArgumentError("caches must have at least one KV head")
    return block_size, num_kv_heads, head_dim


def check_query_vs_cache(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    """Head counts and dtypes of the queries against the cache (``q`` is ``[n, Hq, D]``)."""
    _, _, num_kv_heads, head_dim = k_cache.shape
    if q.shape[2] != head_dim:
        raise InvalidArgumentError(f"q head_dim {q.shape[2]} != cache head_dim {head_dim}")
    if q.shape[1] == 0 or q.shape[1] % num_kv_heads:
        raise InvalidArgumentError(
            f"num_q_heads ({q.shape[1]}) must be a positive multiple of num_kv_heads "
            f"({num_kv_heads})"
        )
    if k_cache.dtype not in (q.dtype, FP8_DTYPE):
        raise DTypeError(f"cache dtype {k_cache.dtype} must be q's ({q.dtype}) or {FP8_DTYPE}")


def check_scales(cache_dtype: torch.dtype, k_scale: object, v_scale: object) -> None:
    """Per-tensor scales: positive finite floats, and 1.0 unless the cache is fp8."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DTypeError(
                f"{name} must be a Python float (a tensor would need a host sync), "
                f"got {type(value).__name__}"
            )
        if not math.isfinite(value) or value <= 0:
            raise InvalidArgumentError(f"{name} must be a positive finite float, got {value}")
        if cache_dtype != FP8_DTYPE and value != 1.0:
            raise InvalidArgumentError(f"{name} applies to an fp8 cache only, got {value}")


def check_attention_options(sliding_window: object, softcap: object, scale: object) -> None:
    """``sliding_window`` a non-negative int, ``softcap`` a non-negative float, ``scale`` > 0."""
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
        raise DTypeError(f"sliding_window must be an int, got {type(sliding_window).__name__}")
    if sliding_window < 0 or sliding_window >= 2**31:
        raise InvalidArgumentError(f"sliding_window must be in [0, 2**31), got {sliding_window}")
    for name, value in (("softcap", softcap), ("scale", scale)):
        if value is None and name == "scale":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DTypeError(f"{name} must be a float, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0 or (name == "scale" and value == 0):
            raise InvalidArgumentError(f"{name} must be a finite float > 0, got {value}")


def check_out(
    out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    """A caller-provided ``out`` must match exactly (it is written, never reallocated)."""
    if out is None:
        return
    check_tensor("out", out, len(shape), (dtype,))
    if tuple(out.shape) != shape:
        raise InvalidArgumentError(f"out must have shape {shape}, got {tuple(out.shape)}")
    if out.device != device:
        raise InvalidArgumentError(f"out is on {out.device}, expected {device}")
