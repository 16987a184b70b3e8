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

Designs: the hash chain through the core groups, and the radix design
(``make_cache("radix", groups=...)``: SGLang's unified tree, one component per group kind)
over the same workload, also with nothing evicted: each request is admitted (its hit is
what the tree matches: full attention, the sliding window's live KV at the hit's end, a
Mamba state on the hit's node), decodes its output (its SWA pages leave its window as
SGLang frees them) and is inserted at its end (the part before its window a tombstone,
its Mamba state on the last node). Its figures: hit rate; memory per cached token (full
pages, live SWA pages and Mamba states in the tree, at each kind's bytes, over the tokens
the tree holds); and per group kind the loss its rule causes (the radix tree with every
group as full attention hits, with that kind alone it does not). A layout the radix design
cannot serve (chunked local attention, groups of several block sizes) reports why.
Prefill chunks are not modelled in the radix run (SGLang's per-chunk inserts would add
Mamba states at chunk ends; ``--max-batched-tokens`` applies to the hash chain only).

Costs: O(tokens) hashing plus O(blocks x spec sets) per request; the radix run O(tokens)
per request and design.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from kvindex._core import ClusterIndex, RadixPrefixCache, _GroupReplay
from kvindex.exceptions import InvalidArgumentError
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


_FULL_KINDS = ("full_attention", "mla_attention")


def _radix_run(layout: Layout, workload: Workload) -> dict[str, Any]:
    """The radix design's replay of ``workload`` for ``layout`` (module header): hit
    tokens and what the tree holds at the end, or ``refused`` naming why."""
    groups = [g.core_tuple() for g in layout.groups]
    bs = layout.groups[0].block_size
    pages = sum(
        -(-(workload.requests[r].prompt_len + workload.requests[r].output_len) // bs) + 1
        for r in range(len(workload))
    )
    try:
        c = RadixPrefixCache(pages + 2, bs, groups=groups)
    except InvalidArgumentError as e:
        return {"refused": str(e)}
    prompt = hit = 0
    for rid in range(len(workload)):
        p = np.asarray(workload.prompt(rid), dtype=np.int32)
        a = c.admit(rid, p)
        if a is None:  # the pool is sized for everything: never
            raise AssertionError("the radix replay's pool ran short")
        prompt += len(p)
        hit += a.num_cached_tokens
        out = workload.output(rid)
        # Decoding one token at a time frees the same SWA pages as the last step alone.
        if len(out) > 1:
            c.append(rid, out[:-1])
        if len(out):
            c.append(rid, out[-1:])
        c.free(rid)
    swa = sum(c.swa_sizes)
    states = sum(c.mamba_sizes)
    return {
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "cached_tokens": c.cached_tokens,
        "swa_tokens": swa if c.swa_blocks is not None else None,
        "mamba_states": states if c.mamba_states is not None else None,
    }


def _only(layout: Layout, kind: str) -> Layout:
    """``layout`` with every group but full attention and ``kind`` as full attention."""
    twin = _full_twin(layout).groups
    groups = tuple(g if g.kind == kind else t for g, t in zip(layout.groups, twin, strict=True))
    return Layout(f"{layout.name} ({kind} only)", groups, layout.source)


def _radix(layout: Layout, workload: Workload) -> dict[str, Any]:
    """The radix design's figures for ``layout`` beside its all-full-attention twin."""
    run = _radix_run(layout, workload)
    if "refused" in run:
        return {"layout": layout.name, "refused": run["refused"]}
    full = _radix_run(_full_twin(layout), workload)
    mem = 0
    for g in layout.groups:
        if g.kind in _FULL_KINDS:
            mem += run["cached_tokens"] * g.token_bytes * g.layers
        elif g.kind == "sliding_window":
            mem += (run["swa_tokens"] or 0) * g.token_bytes * g.layers
        elif g.kind == "mamba":
            mem += (run["mamba_states"] or 0) * g.token_bytes * g.layers
    prompt = run["prompt_tokens"]
    kinds = []
    for kind in dict.fromkeys(g.kind for g in layout.groups):
        if kind in _FULL_KINDS:
            loss = 0
        else:
            alone = _radix_run(_only(layout, kind), workload)
            loss = max(full["hit_tokens"] - alone["hit_tokens"], 0)
        kinds.append(
            {
                "kind": kind,
                "group_ids": [i for i, g in enumerate(layout.groups) if g.kind == kind],
                "loss_tokens": loss,
                "loss_share": loss / prompt if prompt else 0.0,
            }
        )
    held = run["cached_tokens"]

    def figures(r: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt_tokens": r["prompt_tokens"],
            "hit_tokens": r["hit_tokens"],
            "hit_rate": r["hit_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0,
        }

    full_mem = sum(
        full["cached_tokens"] * g.token_bytes * g.layers for g in _full_twin(layout).groups
    )
    return {
        "layout": {
            "layout": layout.name,
            **figures(run),
            "cached_tokens": held,
            "swa_live_tokens": run["swa_tokens"],
            "mamba_states": run["mamba_states"],
            "memory_bytes": mem,
            "bytes_per_cached_token": mem / held if held and mem else None,
            "kinds": kinds,
        },
        "full_attention": {
            "layout": f"{layout.name} (all full attention)",
            **figures(full),
            "cached_tokens": full["cached_tokens"],
            "memory_bytes": full_mem,
            "bytes_per_cached_token": full_mem / full["cached_tokens"]
            if full["cached_tokens"] and full_mem
            else None,
        },
    }


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
        "radix": _radix(layout, workload),
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
    rx = r["radix"]
    if "refused" in rx:
        lines.append(f"radix: not served: {rx['refused']}")
        return "\n".join(lines)
    for name, key in (("layout", r["model"]), ("full_attention", "all full attention")):
        x = rx[name]
        mem = _mib(x["bytes_per_cached_token"])
        lines.append(f"{'radix':<11} {key[:34]:<34} {x['hit_rate']:>8.1%} {mem:>22}")
    lines.append(
        "radix: loss each group kind's rule causes (tokens the all-full tree reuses, the kind not):"
    )
    for k in rx["layout"]["kinds"]:
        lines.append(
            f"  {k['kind']} (groups {k['group_ids']}): "
            f"{k['loss_tokens']} tokens ({k['loss_share']:.1%} of prompt tokens)"
        )
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
