"""``kvindex explain`` / :func:`kvindex.explain`: what a model's KV cache groups can hit,
and why not.

:func:`explain` takes a group layout (a preset name of :mod:`kvindex.layouts`, a JSON
layout file, or a :class:`~kvindex.layouts.Layout`) and a prompt length, or a Mooncake
trace, and reports, computed by the core's group rules (``kvindex._core.explain_layout``):

- the hash block size (gcd of the group block sizes), the scheduler block size (lcm) and
  the alignment every hit lands on; the shortest prompt whose repeat hits at all;
- per spec set (groups of one spec, looked up together): what its rule needs — a sliding
  window's ``ceil((W-1)/B)`` blocks ending at the hit, chunked local attention's blocks
  from the chunk start, a Mamba state at or below the bound — and the hit its rule alone
  allows, so the loss each group's rule causes is the full-attention hit minus that;
- the longest hit of a repeated prompt of that length (the first time prefilled in chunks
  of ``chunk`` tokens, default at once; the repeat bounded at ``n - 1`` as vLLM bounds it);
- the field's common causes of a 0% hit rate, checked: block-size alignment (prompts
  shorter than the alignment, tokens lost to it), Mamba caching off
  (``mamba_cache_mode="none"``), a group 0 that is not full attention, and routers that
  drop (or mix) the events of non-full groups.

With a trace, each request's reusable prefix is the run of its leading hash ids an
earlier request had; the layout's hit for it is an upper bound (as if the earlier
request's prefill had ended at the shared prefix: Mamba states exist only where an
earlier prefill chunk ended, which ``kvindex simulate --model`` follows request by request).

Output: :func:`format_text` (human) or the dict itself (``--json``).
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvindex import _core
from kvindex.exceptions import InvalidArgumentError, KvIndexError
from kvindex.layouts import PRESETS, Layout, load_layout

__all__ = ["explain", "format_text", "main"]


def _layout(model: str | Path | Layout, mamba_cache_mode: str | None) -> Layout:
    layout = model if isinstance(model, Layout) else load_layout(model)
    if mamba_cache_mode is not None:
        layout = layout.with_mamba_cache_mode(mamba_cache_mode)
    return layout


def _check(name: str, status: str, message: str) -> dict[str, str]:
    return {"check": name, "status": status, "message": message}


def _checks(layout: Layout, core: dict[str, Any] | None, n: int | None) -> list[dict[str, str]]:
    """The common 0%-hit causes, checked against this layout and prompt length (None: a
    trace, whose alignment loss the caller reports)."""
    out: list[dict[str, str]] = []
    groups = layout.groups
    mamba_off = [
        i for i, g in enumerate(groups) if g.kind == "mamba" and g.mamba_cache_mode != "align"
    ]
    if mamba_off:
        out.append(
            _check(
                "mamba_cache_mode",
                "fail",
                f"Mamba group(s) {mamba_off} have mamba_cache_mode='none': no state is cached, so "
                "no prefix can hit (0%). vLLM 0.33 sets 'align' when enable_prefix_caching is on; "
                "older releases need mamba_cache_mode='align' explicitly.",
            )
        )
    elif any(g.kind == "mamba" for g in groups):
        out.append(
            _check(
                "mamba_cache_mode",
                "ok",
                "mamba_cache_mode='align': a state is cached at the block boundary where each "
                "prefill chunk ends; a hit reuses the latest one at or below the bound, so a "
                "prompt shared only in part hits only where an earlier request's chunk ended.",
            )
        )
    if core is not None and n is not None:
        a = core["alignment"]
        sizes = sorted({g.block_size for g in groups})
        lost = (n - 1) % a if n > 0 else 0
        if n - 1 < a:
            out.append(
                _check(
                    "block_size_alignment",
                    "fail",
                    f"hits land on multiples of {a} tokens (the lcm of block sizes {sizes}); a "
                    f"prompt of {n} tokens is bounded at {max(n - 1, 0)} and can never hit.",
                )
            )
        else:
            out.append(
                _check(
                    "block_size_alignment",
                    "warn" if lost * 20 > n - 1 else "ok",
                    f"hits land on multiples of {a} tokens (block sizes {sizes}); the last {lost} "
                    f"of the {n - 1} reusable tokens fall outside the alignment.",
                )
            )
    non_full = [
        i for i, g in enumerate(groups) if g.kind not in ("full_attention", "mla_attention")
    ]
    if non_full:
        first = groups[0].kind
        status = "warn"
        msg = (
            f"groups {non_full} are not full attention: a router that drops events with a "
            "group_idx (or of kinds other than full_attention), or keys every group's hashes "
            "together, scores these workers by full-attention blocks alone and overstates "
            "their hits. kvindex's ClusterIndex keeps each group apart: declare the layout "
            "with ClusterIndex.set_worker_layout."
        )
        if first not in ("full_attention", "mla_attention"):
            msg += (
                f" Group 0 is {first}: a router that treats group 0 as the prefix reads the "
                f"{first} group's blocks as if they were full attention."
            )
        out.append(_check("router_events", status, msg))
    if core is not None:
        hbs = core["hash_block_size"]
        wide = [
            i
            for i, g in enumerate(groups)
            if g.kind in ("full_attention", "mla_attention") and g.block_size > hbs
        ]
        if wide:
            out.append(
                _check(
                    "partial_block_entries",
                    "ok",
                    f"full-attention groups {wide} have blocks larger than the hash block "
                    f"({hbs} tokens): vLLM also keys a prompt's last {hbs}-token boundary inside "
                    f"a block (a partial-block prefix entry, published as a BlockStored of "
                    f"block_size {hbs} with one hash and that group_idx). Hits stay aligned to "
                    f"{core['alignment']} tokens; a router must accept these events rather than "
                    "count them malformed (kvindex's ClusterIndex does).",
                )
            )
    if core is not None and len(groups) > 1:
        out.append(
            _check(
                "hash_block_size",
                "ok",
                f"requests are hashed in blocks of {core['hash_block_size']} tokens: a router "
                f"must hash prompts at that size "
                f"(ClusterIndex(block_size={core['hash_block_size']})).",
            )
        )
    return out


def _set_rows(layout: Layout, core: dict[str, Any]) -> list[dict[str, Any]]:
    """Per spec set: the rule's need and the hit it allows, with the loss against full."""
    full_hit = max(
        (s["hit"] for s in core["sets"] if s["kind"] in ("full_attention", "mla_attention")),
        default=None,
    )
    rows = []
    for s in core["sets"]:
        g = layout.groups[s["group_ids"][0]]
        kind = s["kind"]
        if kind == "sliding_window":
            need = f"the {s['window_blocks']} blocks ending at the hit (window {g.window})"
        elif kind == "chunked_local_attention":
            need = f"the blocks from the hit's chunk start (chunk {g.chunk})"
        elif kind == "mamba":
            need = "a cached state at or below the bound"
        else:
            need = "every block up to the hit"
        row = dict(s)
        row["needs"] = need
        row["loss"] = (full_hit - s["hit"]) if full_hit is not None else 0
        rows.append(row)
    return rows


def _one(layout: Layout, n: int, chunk: int | None) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return _core.explain_layout([g.core_tuple() for g in layout.groups], n, chunk=chunk), None
    except InvalidArgumentError as e:
        return None, str(e)


def explain(
    model: str | Path | Layout,
    prompt_tokens: int | None = None,
    *,
    trace: str | Path | None = None,
    chunk: int | None = None,
    mamba_cache_mode: str | None = None,
    trace_limit: int | None = None,
) -> dict[str, Any]:
    """What ``model``'s layout can hit (module header); a JSON-ready dict.

    Exactly one of ``prompt_tokens`` and ``trace`` is given. Raises
    :class:`~kvindex.InvalidArgumentError` for an unknown preset, a bad layout, a bad length
    or both/neither of ``prompt_tokens`` and ``trace``."""
    if (prompt_tokens is None) == (trace is None):
        raise InvalidArgumentError("give exactly one of prompt_tokens and trace")
    layout = _layout(model, mamba_cache_mode)
    if trace is not None:
        return _explain_trace(layout, Path(trace), chunk, trace_limit)
    assert prompt_tokens is not None  # given exactly one of the two (checked above)
    try:
        n = -1 if isinstance(prompt_tokens, bool) else operator.index(prompt_tokens)
    except TypeError:
        n = -1
    if n < 1:
        raise InvalidArgumentError(f"prompt_tokens must be a positive int, got {prompt_tokens!r}")
    prompt_tokens = n
    core, why = _one(layout, prompt_tokens, chunk)
    report: dict[str, Any] = {
        "model": layout.name,
        "source": layout.source,
        "groups": [dict(g.to_json(), group_idx=i) for i, g in enumerate(layout.groups)],
        "prompt_tokens": prompt_tokens,
        "chunk": chunk,
        "layout_error": why,
        "hash_block_size": core["hash_block_size"] if core else None,
        "scheduler_block_size": core["scheduler_block_size"] if core else None,
        "alignment": core["alignment"] if core else None,
        "min_prompt": core["min_prompt"] if core else None,
        "hit_tokens": core["hit"] if core else 0,
        "sets": _set_rows(layout, core) if core else [],
        "checks": _checks(layout, core, prompt_tokens),
    }
    full = [s["hit"] for s in report["sets"] if s["kind"] in ("full_attention", "mla_attention")]
    report["full_attention_hit_tokens"] = max(full) if full else None
    return report


def _explain_trace(
    layout: Layout, path: Path, chunk: int | None, limit: int | None
) -> dict[str, Any]:
    from kvindex.simulate.trace import read_mooncake_trace

    wl = read_mooncake_trace(path, limit=limit)
    seen: set[int] = set()
    memo: dict[int, tuple[int, int]] = {}
    total = shared = hit = full = zero = lost = 0
    why: str | None = None
    core0: dict[str, Any] | None = None
    for r, ids in zip(wl.requests, wl.hash_ids, strict=True):
        j = 0
        while j < len(ids) and ids[j] in seen:
            j += 1
        seen.update(ids)
        p = min(j * wl.tokens_per_hash, r.prompt_len - 1)
        total += r.prompt_len
        shared += max(p, 0)
        if p <= 0:
            zero += 1
            continue
        if p not in memo:
            core, why = _one(layout, p + 1, chunk)
            core0 = core0 or core
            if core is None:
                memo[p] = (0, 0)
            else:
                fh = [
                    s["hit"]
                    for s in core["sets"]
                    if s["kind"] in ("full_attention", "mla_attention")
                ]
                memo[p] = (core["hit"], max(fh) if fh else core["hit"])
        h, f = memo[p]
        if core0 is not None:
            lost += p % core0["alignment"]
        hit += h
        full += f
        zero += h == 0
    n = len(wl.requests)
    return {
        "model": layout.name,
        "source": layout.source,
        "groups": [dict(g.to_json(), group_idx=i) for i, g in enumerate(layout.groups)],
        "trace": str(path),
        "requests": n,
        "chunk": chunk,
        "layout_error": why,
        "prompt_tokens": total,
        "shared_prefix_tokens": shared,
        "hit_tokens_upper_bound": hit,
        "full_attention_hit_tokens": full,
        "hit_rate_upper_bound": hit / total if total else 0.0,
        "full_attention_hit_rate": full / total if total else 0.0,
        "zero_hit_requests": zero,
        "hash_block_size": core0["hash_block_size"] if core0 else None,
        "alignment": core0["alignment"] if core0 else None,
        "alignment_lost_tokens": lost,
        "checks": _checks(layout, core0, None),
    }


def format_text(report: dict[str, Any]) -> str:
    """The report as text for people."""
    lines = [f"model {report['model']}: {len(report['groups'])} KV cache groups"]
    if report.get("source"):
        lines.append(f"  from {report['source']}")
    for g in report["groups"]:
        extra = "".join(f", {k} {g[k]}" for k in ("window", "chunk", "mamba_cache_mode") if k in g)
        lines.append(
            f"  group {g['group_idx']}: {g['kind']}, block {g['block_size']}{extra}, "
            f"{g['layers']} layers"
        )
    if report.get("layout_error"):
        lines.append(f"layout cannot cache: {report['layout_error']}")
    if report.get("hash_block_size") is not None:
        lines.append(
            f"hash block {report['hash_block_size']} tokens; "
            f"hits aligned to {report['alignment']} tokens"
            + (
                f"; scheduler block {report['scheduler_block_size']}"
                if "scheduler_block_size" in report
                else ""
            )
        )
    if "trace" in report:
        lines.append(
            f"trace {report['trace']}: {report['requests']} requests, "
            f"{report['prompt_tokens']} prompt tokens, "
            f"{report['shared_prefix_tokens']} in prefixes an earlier request had"
        )
        lines.append(
            f"hit rate at most {report['hit_rate_upper_bound']:.1%} "
            f"(full attention alone: {report['full_attention_hit_rate']:.1%}); "
            f"{report['zero_hit_requests']} requests can hit nothing; "
            f"{report['alignment_lost_tokens']} shared tokens lost to the alignment"
        )
    else:
        n = report["prompt_tokens"]
        mp = report.get("min_prompt")
        lines.append(
            f"shortest prompt whose repeat hits: {mp if mp is not None else 'none'} tokens"
        )
        fa = report["full_attention_hit_tokens"]
        lines.append(
            f"a repeated prompt of {n} tokens reuses {report['hit_tokens']} "
            f"(full attention alone: {fa if fa is not None else 'n/a'})"
        )
        for s in report["sets"]:
            lines.append(
                f"  {s['kind']} (block {s['block_size']}, groups {s['group_ids']}): "
                f"needs {s['needs']}; its rule allows {s['hit']} tokens (loss {s['loss']}); "
                f"hit keeps {s['reused']} blocks, "
                f"{s['nulls']} null"
            )
    lines.append("checks:")
    for c in report["checks"]:
        lines.append(f"  [{c['status']}] {c['check']}: {c['message']}")
    return "\n".join(lines)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``kvindex explain`` options (into ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="kvindex explain", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("model", help=f"a preset ({', '.join(PRESETS)}) or a JSON layout file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-tokens", type=int, help="length of the prompt seen twice")
    src.add_argument("--trace", help="a Mooncake JSONL trace")
    p.add_argument(
        "--chunk", type=int, default=None, help="prefill chunk (tokens); default: at once"
    )
    p.add_argument("--mamba-cache-mode", choices=["none", "align"], default=None)
    p.add_argument("--limit", type=int, default=None, help="trace: first N requests only")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    """Runs a parsed ``kvindex explain``; 2 on a caller error (printed to stderr)."""
    try:
        report = explain(
            args.model,
            args.prompt_tokens,
            trace=args.trace,
            chunk=args.chunk,
            mamba_cache_mode=args.mamba_cache_mode,
            trace_limit=args.limit,
        )
    except (KvIndexError, OSError) as e:  # a trace format error is a KvIndexError
        print(f"kvindex explain: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``kvindex explain`` as a function."""
    return run(build_parser().parse_args(argv))
