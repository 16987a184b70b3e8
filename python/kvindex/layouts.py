"""KV cache group layouts: the groups a hybrid model's layers form in vLLM 0.33.

A layout lists a model's KV cache groups in vLLM's ``kv_cache_groups`` order (the order
``group_idx`` in its KV events counts), each with its spec kind, block size (tokens per
block), window / chunk / Mamba cache mode, how many layers share its block table and the
bytes one token (one state, for Mamba) takes in one of those layers.

Presets (:data:`PRESETS`) are computed from the models' published configs with vLLM
0.33's grouping rules, written once here:

- layers are bucketed by spec in layer order; the group size is the smallest bucket's
  layer count (the largest one's when it is under 1.5 times the smallest), and a bucket of
  ``n`` layers becomes ``ceil(n / group size)`` groups, the last one padded
  (``kv_cache_planning._get_kv_cache_groups_uniform_page_size``);
- attention layers of one page size keep ``cache_config.block_size`` (16 by default; 64
  for FlashMLA); beside Mamba state the attention block is the smallest multiple of the
  backend's kernel block whose page holds one Mamba state
  (``Platform._align_hybrid_block_size``: ``16 * ceil(state_bytes / (16 * token_bytes))``),
  and in ``mamba_cache_mode="align"`` the Mamba group's block size is that block size;
- with ``mamba_cache_mode="none"`` (vLLM's default without prefix caching, and what
  releases before the align mode did) Mamba states are never cached, so no prefix of such
  a model can hit; vLLM 0.33 switches to ``"align"`` when prefix caching is on.

A custom layout is a small JSON document (:func:`load_layout`, :func:`parse_layout`)::

    {"name": "my-model",
     "groups": [{"kind": "full_attention", "block_size": 16, "layers": 12},
                {"kind": "sliding_window", "block_size": 16, "window": 1024,
                 "layers": 12}]}

Optional per group: ``token_bytes`` (bytes per token per layer; for ``mamba``, bytes per
state per layer) and ``mamba_cache_mode`` (``mamba`` only: ``"none"`` or ``"align"``;
default ``"align"``, what vLLM 0.33 sets when prefix caching is on). Every malformed
document raises :class:`~kvindex.InvalidArgumentError` naming the field.

Costs: building or validating a layout is O(groups); presets are built at import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvindex.exceptions import InvalidArgumentError

#: Spec kinds, spelled as vLLM 0.33's ``kv_cache_spec_kind`` event field spells them.
KINDS = ("full_attention", "mla_attention", "sliding_window", "chunked_local_attention", "mamba")
#: vLLM 0.33's ``mamba_cache_mode`` values (it sets ``"align"`` when prefix caching is on).
MAMBA_CACHE_MODES = ("none", "align")
_MAX_BLOCK = 1 << 20


@dataclass(frozen=True)
class Group:
    """One KV cache group: its spec kind and block size, and what the kind needs."""

    kind: str
    block_size: int
    layers: int = 1
    window: int | None = None
    chunk: int | None = None
    mamba_cache_mode: str | None = None
    token_bytes: int = 0

    def core_tuple(self) -> tuple[str, int, int, str]:
        """The group as the core takes it: ``(kind, block_size, window or chunk, mamba mode)``."""
        return (
            self.kind,
            self.block_size,
            self.window or self.chunk or 0,
            self.mamba_cache_mode or "",
        )

    def to_json(self) -> dict[str, Any]:
        """The group as the JSON layout format writes it (absent fields left out)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "block_size": self.block_size,
            "layers": self.layers,
        }
        for key in ("window", "chunk", "mamba_cache_mode"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.token_bytes:
            out["token_bytes"] = self.token_bytes
        return out


@dataclass(frozen=True)
class Layout:
    """A model's KV cache groups in vLLM's group order, and where the numbers come from."""

    name: str
    groups: tuple[Group, ...]
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        """The layout as a JSON-ready dict (:func:`parse_layout` reads it back)."""
        out: dict[str, Any] = {"name": self.name, "groups": [g.to_json() for g in self.groups]}
        if self.source:
            out["source"] = self.source
        return out

    def with_mamba_cache_mode(self, mode: str) -> Layout:
        """This layout with every Mamba group in ``mode`` (``"none"`` or ``"align"``)."""
        if mode not in MAMBA_CACHE_MODES:
            raise InvalidArgumentError(
                f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, got {mode!r}"
            )
        groups = tuple(
            replace(g, mamba_cache_mode=mode) if g.kind == "mamba" else g for g in self.groups
        )
        return replace(self, groups=groups)


def _int(d: Mapping[str, Any], key: str, where: str, *, lo: int = 1, hi: int = _MAX_BLOCK) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"{where}.{key} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{where}.{key} must be in {lo}..={hi}, got {v}")
    return v


_GROUP_KEYS = {"kind", "block_size", "layers", "window", "chunk", "mamba_cache_mode", "token_bytes"}
_NEEDS = {
    "sliding_window": "window",
    "chunked_local_attention": "chunk",
    "mamba": "mamba_cache_mode",
}


def _group(raw: Any, where: str) -> Group:
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _GROUP_KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown field(s) {unknown}; known: {sorted(_GROUP_KEYS)}"
        )
    for key in ("kind", "block_size"):
        if key not in raw:
            raise InvalidArgumentError(f"{where}.{key} is required")
    kind = raw["kind"]
    if kind not in KINDS:
        raise InvalidArgumentError(f"{where}.kind must be one of {KINDS}, got {kind!r}")
    need = _NEEDS.get(kind)
    for key in ("window", "chunk", "mamba_cache_mode"):
        if key in raw and key != need:
            raise InvalidArgumentError(f"{where}.{key} does not apply to kind {kind!r}")
    if need is not None and need not in raw and need != "mamba_cache_mode":
        raise InvalidArgumentError(f"{where}.{need} is required for kind {kind!r}")
    mode = raw.get("mamba_cache_mode", "align" if kind == "mamba" else None)
    if mode is not None and mode not in MAMBA_CACHE_MODES:
        raise InvalidArgumentError(
            f"{where}.mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, got {mode!r}"
        )
    return Group(
        kind=kind,
        block_size=_int(raw, "block_size", where),
        layers=_int(raw, "layers", where, hi=1 << 16) if "layers" in raw else 1,
        window=_int(raw, "window", where, hi=1 << 30) if kind == "sliding_window" else None,
        chunk=_int(raw, "chunk", where, hi=1 << 30) if kind == "chunked_local_attention" else None,
        mamba_cache_mode=mode,
        token_bytes=_int(raw, "token_bytes", where, lo=0, hi=1 << 40)
        if "token_bytes" in raw
        else 0,
    )


def parse_layout(doc: Any) -> Layout:
    """A :class:`Layout` from a parsed JSON document (see the module header).

    Raises :class:`~kvindex.InvalidArgumentError` naming the first bad field."""
    if not isinstance(doc, Mapping):
        raise InvalidArgumentError(f"a layout must be a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"name", "groups", "source"})
    if unknown:
        raise InvalidArgumentError(
            f"layout: unknown field(s) {unknown}; known: ['groups', 'name', 'source']"
        )
    groups = doc.get("groups")
    if not isinstance(groups, Sequence) or isinstance(groups, str | bytes) or not groups:
        raise InvalidArgumentError("layout.groups must be a non-empty list of groups")
    if len(groups) > 64:
        raise InvalidArgumentError(f"layout.groups: at most 64 groups, got {len(groups)}")
    name = doc.get("name", "custom")
    source = doc.get("source", "")
    if not isinstance(name, str) or not isinstance(source, str):
        raise InvalidArgumentError("layout.name and layout.source must be strings")
    return Layout(
        name, tuple(_group(g, f"layout.groups[{i}]") for i, g in enumerate(groups)), source
    )


def load_layout(spec: str | Path) -> Layout:
    """A preset by name (:data:`PRESETS`), or the layout of a JSON file at ``spec``."""
    if isinstance(spec, str) and spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InvalidArgumentError(
            f"{str(spec)!r} is neither a preset ({', '.join(PRESETS)}) nor a layout file"
        )
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArgumentError(f"cannot read layout {str(path)!r}: {e}") from None
    return parse_layout(doc)


# --- vLLM 0.33's grouping of a model's layers -------------------------------------------


def _grouped(buckets: Sequence[tuple[Group, int]]) -> tuple[Group, ...]:
    """The KV cache groups of layer buckets (spec, layer count) in layer order, as
    vLLM's uniform-page-size grouping splits them (module header)."""
    least, most = min(n for _, n in buckets), max(n for _, n in buckets)
    size = most if most < least * 1.5 else least
    out: list[Group] = []
    for g, n in buckets:
        out.extend(replace(g, layers=size) for _ in range(math.ceil(n / size)))
    return tuple(out)


def _attn_token_bytes(kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes per token per layer of a K+V attention layer."""
    return 2 * kv_heads * head_dim * dtype_bytes


def _mamba_block_size(state_bytes: int, token_bytes: int, kernel_block: int = 16) -> int:
    """The attention block size beside a Mamba state (``_align_hybrid_block_size``)."""
    return kernel_block * math.ceil(state_bytes / (kernel_block * token_bytes))


def _local_and_full(
    name: str, local: Group, local_layers: int, full_layers: int, source: str
) -> Layout:
    """A model of ``local_layers`` local-attention layers (``local``: its kind, block size,
    window or chunk and bytes per token) beside ``full_layers`` full-attention ones of the
    same block size and bytes per token."""
    full = Group("full_attention", local.block_size, token_bytes=local.token_bytes)
    return Layout(name, _grouped([(local, local_layers), (full, full_layers)]), source)


def _presets() -> dict[str, Layout]:
    p: dict[str, Layout] = {}
    # gpt-oss-120b (openai/gpt-oss-120b config.json): num_hidden_layers=36, layer_types
    # alternating "sliding_attention"/"full_attention" from layer 0, sliding_window=128,
    # num_key_value_heads=8, head_dim=64 (bf16).
    p["gpt-oss"] = _local_and_full(
        "gpt-oss",
        Group("sliding_window", 16, window=128, token_bytes=_attn_token_bytes(8, 64)),
        18,
        18,
        "openai/gpt-oss-120b config.json: num_hidden_layers=36, "
        "layer_types (sliding/full alternating), "
        "sliding_window=128, num_key_value_heads=8, head_dim=64; block_size 16",
    )
    # Gemma 3 27B (google/gemma-3-27b-it text_config): num_hidden_layers=62,
    # sliding_window=1024, sliding_window_pattern=6 (layer i global when (i+1) % 6 == 0:
    # 10 global, 52 local), num_key_value_heads=16, head_dim=128.
    p["gemma3"] = _local_and_full(
        "gemma3",
        Group("sliding_window", 16, window=1024, token_bytes=_attn_token_bytes(16, 128)),
        52,
        10,
        "google/gemma-3-27b-it text_config: num_hidden_layers=62, sliding_window=1024, "
        "sliding_window_pattern=6, num_key_value_heads=16, head_dim=128; block_size 16 (the 27B)",
    )
    # Gemma 3 1B (google/gemma-3-1b-it): num_hidden_layers=26, sliding_window=512,
    # sliding_window_pattern=6 (4 global, 22 local), num_key_value_heads=1, head_dim=256.
    p["gemma3-1b"] = _local_and_full(
        "gemma3-1b",
        Group("sliding_window", 16, window=512, token_bytes=_attn_token_bytes(1, 256)),
        22,
        4,
        "google/gemma-3-1b-it: num_hidden_layers=26, sliding_window=512, sliding_window_pattern=6, "
        "num_key_value_heads=1, head_dim=256; block_size 16",
    )
    # Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E text_config): num_hidden_layers=48,
    # attention_chunk_size=8192, no_rope_layers (every 4th layer global: 36 chunked local,
    # 12 global), num_key_value_heads=8, head_dim=128.
    p["llama4"] = _local_and_full(
        "llama4",
        Group("chunked_local_attention", 16, chunk=8192, token_bytes=_attn_token_bytes(8, 128)),
        36,
        12,
        "meta-llama/Llama-4-Scout-17B-16E text_config: num_hidden_layers=48, "
        "attention_chunk_size=8192, "
        "no_rope_layers (3 chunked : 1 global), num_key_value_heads=8, head_dim=128; block_size 16",
    )
    # Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct): num_hidden_layers=48,
    # full_attention_interval=4 (36 gated delta-net, 12 full), num_key_value_heads=2,
    # head_dim=256; linear_num_key_heads=16, linear_num_value_heads=32,
    # linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4.
    # Gated delta-net state (bf16, tp=1): conv (2*16*128 + 32*128) x 3 + temporal 32x128x128.
    tb = _attn_token_bytes(2, 256)
    state = 2 * ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128)
    bs = _mamba_block_size(state, tb)  # 544 with the Triton/FLA prefill (FlashInfer's: 576)
    p["qwen3-next"] = Layout(
        "qwen3-next",
        _grouped(
            [
                (Group("mamba", bs, mamba_cache_mode="align", token_bytes=state), 36),
                (Group("full_attention", bs, token_bytes=tb), 12),
            ]
        ),
        "Qwen/Qwen3-Next-80B-A3B-Instruct: num_hidden_layers=48, full_attention_interval=4, "
        "num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, "
        "linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4; "
        f"attention block {bs} = 16 * ceil({state} / (16 * {tb})) beside the bf16 state; "
        'mamba_cache_mode="align" (what vLLM 0.33 sets with prefix caching on)',
    )
    # DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2-Exp): num_hidden_layers=61, kv_lora_rank=512,
    # qk_rope_head_dim=64 (a 576-wide latent per token), index_head_dim=128 (the indexer's
    # fp8 key + one fp32 scale per 128: 132 bytes per token); FlashMLA's block size 64.
    p["deepseek-v3.2"] = Layout(
        "deepseek-v3.2",
        (
            Group("mla_attention", 64, layers=61, token_bytes=656),
            Group("mla_attention", 64, layers=61, token_bytes=132),
        ),
        "deepseek-ai/DeepSeek-V3.2-Exp: num_hidden_layers=61, kv_lora_rank=512, "
        "qk_rope_head_dim=64 "
        "(fp8_ds_mla: 656 bytes per token), index_head_dim=128 (indexer: 132 bytes per token); "
        "block_size 64; the indexer group caches the same tokens as the MLA group",
    )
    return p


#: Built-in layouts by name.
PRESETS: dict[str, Layout] = _presets()

__all__ = [
    "KINDS",
    "MAMBA_CACHE_MODES",
    "PRESETS",
    "Group",
    "Layout",
    "load_layout",
    "parse_layout",
]
