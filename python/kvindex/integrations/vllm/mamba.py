"""Mamba / linear-attention state groups (vLLM's ``MambaSpec``) in the hybrid drop-in.

kvindex's Rust manager implements vLLM 0.33's ``MambaManager`` in ``mamba_cache_mode``
``"align"`` (one running state block per request, null blocks before it, states cached at
block boundaries, a hit never taken in the step its state block was cached) and ``"none"``
(no prefix caching). This module turns a ``MambaSpec`` into the layout arguments and names
what kvindex does not implement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec

from .errors import UnsupportedVllmConfigError

__all__ = [
    "BoundaryStateOffloads",
    "align_groups",
    "prefill_checkpoints",
    "speculative_blocks",
    "has_mamba",
    "mamba_group_args",
]


def mamba_group_args(spec: MambaSpec) -> tuple[str, int, int, str]:
    """The layout arguments of a Mamba group: ``("mamba", block size, 0, mode)``; raises
    :class:`UnsupportedVllmConfigError` for a ``mamba_cache_mode`` other than the two."""
    mode = spec.mamba_cache_mode
    if mode not in ("align", "none"):
        raise UnsupportedVllmConfigError(
            f"kvindex's KVCacheManager supports mamba_cache_mode 'align' and 'none', not {mode!r}"
        )
    return ("mamba", spec.block_size, 0, mode)


def speculative_blocks(kv_cache_config: KVCacheConfig) -> list[int]:
    """Each group's ``num_speculative_blocks`` (0 outside Mamba groups)."""
    return [
        g.kv_cache_spec.num_speculative_blocks if isinstance(g.kv_cache_spec, MambaSpec) else 0
        for g in kv_cache_config.kv_cache_groups
    ]


def prefill_checkpoints(kv_cache_config: KVCacheConfig) -> list[int | None]:
    """Each group's ``prefill_checkpoint_alignment`` where an align-mode Mamba group has
    prefill checkpoint blocks, else None."""
    out: list[int | None] = []
    for g in kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        on = (
            isinstance(spec, MambaSpec)
            and spec.mamba_cache_mode == "align"
            and spec.num_prefill_checkpoint_blocks > 0
        )
        out.append(spec.prefill_checkpoint_alignment if on else None)
    return out


def has_mamba(kv_cache_config: KVCacheConfig) -> bool:
    """Whether a group of the config is a Mamba group."""
    return any(isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups)


def align_groups(kv_cache_config: KVCacheConfig, enable_caching: bool) -> frozenset[int]:
    """The groups whose cached states are offered to a KV connector: align-mode Mamba
    groups, when prefix caching is on."""
    if not enable_caching:
        return frozenset()
    return frozenset(
        g
        for g, group in enumerate(kv_cache_config.kv_cache_groups)
        if isinstance(group.kv_cache_spec, MambaSpec)
        and group.kv_cache_spec.mamba_cache_mode == "align"
    )


class BoundaryStateOffloads:
    """vLLM's pending boundary-state hand-offs: every state block an align-mode Mamba
    group caches, as ``(request, group, block id, boundary tokens)``, drained by
    ``take_boundary_state_offloads`` and dropped when the request is freed first."""

    def __init__(self, groups: frozenset[int], block_sizes: Sequence[int]) -> None:
        self.groups = groups
        self._sizes = list(block_sizes)
        self._pending: list[tuple[str, int, int, int]] = []

    def add_runs(
        self,
        request_id: str,
        runs: Iterable[tuple[int, int, int]],
        tables: Sequence[Sequence[int]],
        hash_tokens: Callable[[int], int | None],
    ) -> None:
        """Records the state blocks of the table entries ``runs`` (group, start, end)
        cached over of the request's ``tables`` that hold a hash after the caching call,
        each with the tokens it covers (``hash_tokens``: a prefill checkpoint re-keys its
        block, even one sparse retention left uncached; a transient one loses its key)."""
        for g, start, end in runs:
            if g not in self.groups:
                continue
            table = tables[g]
            for i in range(start, end):
                block = int(table[i])
                tokens = hash_tokens(block) if block else None
                if tokens is not None:
                    self._pending.append((request_id, g, block, tokens))

    def add_offer(self, request_id: str, group: int, block_id: int, tokens: int) -> None:
        """Records one hand-off: a prompt tail's copy (``block_id`` of ``group``,
        the state after ``tokens`` tokens)."""
        self._pending.append((request_id, group, block_id, tokens))

    def drop(self, request_id: str) -> None:
        """Forgets the request's hand-offs not yet taken (its blocks go back to the pool)."""
        if any(e[0] == request_id for e in self._pending):
            self._pending = [e for e in self._pending if e[0] != request_id]

    def take(self) -> dict[str, list[tuple[int, int, int]]]:
        """``{request_id: [(group_id, block_id, boundary_tokens), ...]}``, drained."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        for rid, g, block, tokens in self._pending:
            out.setdefault(rid, []).append((g, block, tokens))
        self._pending = []
        return out
