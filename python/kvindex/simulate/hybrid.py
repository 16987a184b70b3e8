"""``kvindex simulate --model PRESET``: a workload through a hybrid model's KV cache groups.

Each request of the workload, in arrival (request id) order, goes through one engine's
cache with nothing evicted (``kvindex._core._GroupReplay``): it hits what earlier requests
left cached — the core's hybrid fixed point over the model's groups (full attention bounds
the hit, a sliding window needs its last blocks, chunked local attention its chunk, Mamba a
state at or below the bound) — then leaves its prompt and output cached as vLLM 0.33
would (its prompt prefilled from the hit in chunks of ``--max-batched-tokens``; Mamba
states where a chunk ended and at every decode block boundary). Beside it the same model
with every group as full attention (the full-attention figures: the hit without any
group's rule, the memory without any window or state).

Figures: hit rate (hit tokens / prompt tokens); memory per cached token (bytes of every
cached block of every group, from each group's ``token_bytes`` and layers, over the prompt
tokens full attention holds); and per spec set the loss its rule causes (the tokens full
attention would reuse that the set's rule alone does not), as a share of prompt tokens.

Designs: the hash chain through the core groups. The radix design runs when
``make_cache("radix", groups=...)`` is available (the radix tree's groups); otherwise it is
reported as pending.

Costs: O(tokens) hashing plus O(blocks x spec sets) per request.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from kvindex._core import ClusterIndex, _GroupReplay
from kvindex.layouts import Group, Layout, load_layout
from kvindex.simulate.workloads import Workload

__all__ = ["run_model", "simulate_model"]


def _full_twin(layout: Layout) -> Layout:
    """The model with every group as full attention, at the full groups' bytes per token."""
    fulls = [g for g in layout.groups if g.kind in ("full_attention", "mla_attention")]
    tb = fulls[0].token_bytes if fulls else 0
    groups = tuple(
        g
        if g in fulls
        else replace(
            g, kind="full_attention", window=None, chunk=None, mamba_cache_mode=None, token_bytes=tb
        )
        for g in layout.groups
    )
    return Layout(f"{layout.name} (all full attention)", groups, layout.source)


def _block_bytes(g: Group) -> int:
    """Bytes one block of group ``g`` takes over its layers (a Mamba block: one state)."""
    per = g.token_bytes if g.kind == "mamba" else g.token_bytes * g.block_size
    return per * g.layers


def _replay(layout: Layout, workload: Workload, algo: str, chunk: int | None) -> dict[str, Any]:
    # vLLM turns prefix caching off for a Mamba group outside "align" mode: nothing hits.
    on = not any(g.kind == "mamba" and g.mamba_cache_mode != "align" for g in layout.groups)
    rep = _GroupReplay([g.core_tuple() for g in layout.groups], enable_caching=on)
    hb = rep.hash_block_size
    hasher = ClusterIndex(hb, algo=algo)
    sets = rep.sets
    full_set = next(
        (k for k, s in enumerate(sets) if s[0] in ("full_attention", "mla_attention")), None
    )
    prompt = hit = 0
    loss = [0] * len(sets)
    for rid in range(len(workload)):
        p = workload.prompt(rid)
        toks = np.concatenate([p, workload.output(rid)]).astype(np.int64)
        hashes = hasher.hashes(toks)
        h, set_hits = rep.request(hashes, len(p), len(toks), chunk)
        prompt += len(p)
        hit += h
        if full_set is not None:
            for k, sh in enumerate(set_hits):
                loss[k] += max(set_hits[full_set] - sh, 0)
    cached = rep.cached_blocks
    mem = sum(
        c * sum(_block_bytes(layout.groups[g]) for g in s[2])
        for c, s in zip(cached, sets, strict=True)
    )
    held = cached[full_set] * sets[full_set][1] if full_set is not None else 0
    return {
        "layout": layout.name,
        "hash_block_size": hb,
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": hit / prompt if prompt else 0.0,
        "cached_blocks": cached,
        "memory_bytes": mem,
        "cached_prefix_tokens": held,
        "bytes_per_cached_token": mem / held if held and mem else None,
        "sets": [
            {
                "kind": s[0],
                "block_size": s[1],
                "group_ids": s[2],
                "loss_tokens": loss[k],
                "loss_share": loss[k] / prompt if prompt else 0.0,
            }
            for k, s in enumerate(sets)
        ],
    }


def _radix_available() -> bool:
    import inspect

    from kvindex import make_cache

    return "groups" in inspect.signature(make_cache).parameters


def simulate_model(
    layout: Layout, workload: Workload, *, algo: str = "xxh3_128", chunk: int | None = None
) -> dict[str, Any]:
    """Both designs' figures for ``layout`` on ``workload`` (module header), JSON-ready."""
    return {
        "model": layout.name,
        "source": layout.source,
        "groups": [dict(g.to_json(), group_idx=i) for i, g in enumerate(layout.groups)],
        "workload": workload.summary(),
        "chunk": chunk,
        "hash_chain": {
            "layout": _replay(layout, workload, algo, chunk),
            "full_attention": _replay(_full_twin(layout), workload, algo, chunk),
        },
        "radix": "pending: the radix design's groups (make_cache('radix', groups=...)) are "
        "not in this build"
        if not _radix_available()
        else "not run: use the hash chain's "
        "figures (the radix tree's groups follow SGLang's unified cache, not reported here yet)",
    }


def _mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 1024:.1f} KiB"


def format_model(r: dict[str, Any]) -> str:
    """The report as text."""
    w = r["workload"]
    lines = [
        f"model {r['model']}: {len(r['groups'])} KV cache groups; workload {w['name']}: "
        f"{w['requests']} requests, {w['prompt_tokens']} prompt tokens; prefill chunk "
        f"{r['chunk'] if r['chunk'] else 'whole prompt'}; nothing evicted (a window's blocks "
        "outside it stay cached, freed to the prefix cache as vLLM keeps them)",
        f"{'design':<11} {'groups':<34} {'hit rate':>9} {'memory / cached token':>22}",
    ]
    for name, key in (("layout", r["model"]), ("full_attention", "all full attention")):
        x = r["hash_chain"][name]
        mem = _mib(x["bytes_per_cached_token"])
        lines.append(f"{'hash_chain':<11} {key[:34]:<34} {x['hit_rate']:>8.1%} {mem:>22}")
    lines.append("loss each group's rule causes (tokens full attention would reuse, the rule not):")
    for s in r["hash_chain"]["layout"]["sets"]:
        lines.append(
            f"  {s['kind']} (block {s['block_size']}, groups {s['group_ids']}): "
            f"{s['loss_tokens']} tokens ({s['loss_share']:.1%} of prompt tokens)"
        )
    lines.append(f"radix: {r['radix']}")
    return "\n".join(lines)


def run_model(args: argparse.Namespace, workload: Workload, header: dict[str, Any]) -> int:
    """Runs ``kvindex simulate --model`` for parsed ``args`` on ``workload``; ``header``
    opens the JSON output."""
    layout = load_layout(args.model)
    if getattr(args, "mamba_cache_mode", None):
        layout = layout.with_mamba_cache_mode(args.mamba_cache_mode)
    r = simulate_model(layout, workload, algo=args.hash, chunk=args.max_batched_tokens)
    print(format_model(r))
    if args.json:
        from kvindex.simulate.report import write_json

        write_json(args.json, {**header, **r})
    return 0
