# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Jit code that writes new tokens' K/V into the paged cache at their slots.

Only ``@triton.jit`` functions live here; :mod:`kvindex.kernels.attention` launches them.
One program stores ``BLOCK_T`` tokens of one KV head. ``slot = block * block_size +
offset`` (any page size); a negative slot (padding) is skipped. An fp8 (e4m3) cache stores
``clamp(x / scale, -448, 448)`` rounded to nearest (ties to even).
"""

import triton
import triton.language as tl

FP8_E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def _round_to_e4m3(x):
    """Rounds fp32 ``x`` (|x| <= 448) to the nearest e4m3 value, ties to even, in fp32.

    Adding ``2**(e + 20)`` (``e`` = the exponent of ``|x|``, at least e4m3's -6) leaves
    three mantissa bits, rounded by the fp32 adder; subtracting it back is exact. Used
    under the interpreter, whose own fp32 -> fp8 cast rounds wrongly at binade edges.
    """
    ax = tl.abs(x)
    exponent = tl.maximum(((ax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    magic = ((exponent + 20 + 127) << 23).to(tl.float32, bitcast=True)
    rounded = (ax + magic) - magic
    return tl.where(x < 0, -rounded, rounded)


@triton.jit(do_not_specialize=["num_tokens"])
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    num_tokens,
    head_dim,
    block_size,
    k_scale,
    v_scale,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    ROUND_FP8_IN_FP32: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1).to(tl.int64)
    t_ok = offs_t < num_tokens
    slot = tl.load(slot_mapping_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    ok = t_ok & (slot >= 0)
    page = slot // block_size
    in_page = slot - page * block_size
    toks = offs_t.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (offs_d < head_dim)[None, :]

    key = tl.load(
        key_ptr + toks[:, None] * stride_key_tok + head * stride_key_head + offs_d[None, :],
        mask=mask,
    )
    value = tl.load(
        value_ptr + toks[:, None] * stride_value_tok + head * stride_value_head + offs_d[None, :],
        mask=mask,
    )
    if FP8_CACHE:
        key = tl.clamp(key.to(tl.float32) / k_scale, -FP8_E4M3_MAX, FP8_E4M3_MAX)
        value = tl.clamp(value.to(tl.float32) / v_scale, -FP8_E4M3_MAX, FP8_E4M3_MAX)
        if ROUND_FP8_IN_FP32:
            key = _round_to_e4m3(key)
            value = _round_to_e4m3(value)
    k_off = page * stride_k_block + in_page * stride_k_slot + head * stride_k_head
    v_off = page * stride_v_block + in_page * stride_v_slot + head * stride_v_head
    tl.store(
        k_cache_ptr + k_off[:, None] + offs_d[None, :],
        key.to(k_cache_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        v_cache_ptr + v_off[:, None] + offs_d[None, :],
        value.to(v_cache_ptr.dtype.element_ty),
        mask=mask,
    )
