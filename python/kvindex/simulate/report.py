"""Reports: Markdown tables for the terminal (paste-able into RESULTS.md) and the JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvindex.simulate.ledger import HitTally
from kvindex.simulate.scheduler import RunResult, RunSpec
from kvindex.simulate.seeds import COLUMNS, EXAMPLES

__all__ = [
    "LEGEND",
    "SimulationReport",
    "format_seeds",
    "format_table",
    "markdown_table",
    "write_json",
]

#: What the columns of :func:`format_table` mean.
LEGEND = (
    "hit rate: hit tokens / prompt tokens (first admissions). ceiling: the same design and "
    "block size with infinite capacity, one request at a time. prefill: prompt tokens "
    "computed, recomputation after preemption included. lost: tokens of the exact match not "
    "hit — granularity: in a partly matching block; full-hit: the block of the last prompt "
    "token, always recomputed; not cached: evicted or not inserted yet (% of prompt tokens). "
    "evicted: cached blocks dropped. waits: steps the queue head waited for blocks. "
    "peak: most blocks held by running requests. µs: measured index time per request "
    "(admit incl. failed attempts, free, checkpoint) and per decode step (append_batch)."
)


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """An aligned Markdown table; ``align`` has an ``l`` or ``r`` per column (default: the
    first column left, the others right)."""
    al = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, al, strict=True)
        ]
        return "| " + " | ".join(out) + " |"

    rule = "|".join(
        (":" + "-" * (w + 1)) if a == "l" else ("-" * (w + 1) + ":")
        for w, a in zip(widths, al, strict=True)
    )
    return "\n".join([line(header), f"|{rule}|", *(line(r) for r in rows)])


def _share(n: int, total: int) -> str:
    return f"{n:,} ({100 * n / total:.2f}%)" if total else f"{n:,}"


@dataclass(frozen=True)
class SimulationReport:
    """Everything one ``kvindex simulate`` invocation computed."""

    workload: dict[str, Any]
    scheduler: dict[str, Any]
    theoretical_max: float
    ceilings: dict[tuple[str, int], HitTally]
    runs: list[RunResult]
    model_shape: str | None = None
    bytes_per_token: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every figure (measured times under each run's ``"timing"``)."""
        from kvindex import __version__

        return {
            "kvindex_version": __version__,
            "workload": self.workload,
            "scheduler": self.scheduler,
            "model_shape": self.model_shape,
            "bytes_per_token": self.bytes_per_token,
            "theoretical_max_hit_rate": self.theoretical_max,
            "ceilings": [
                {"design": d, "block_size": b, **t.as_dict()} for (d, b), t in self.ceilings.items()
            ],
            "runs": [r.as_dict() for r in self.runs],
        }


def _row(r: RunResult, ceiling: HitTally | None) -> list[str]:
    s: RunSpec = r.spec
    t = r.tally
    tm = r.timing.as_dict(t.requests)
    return [
        s.design,
        str(s.block_size),
        s.capacity.label,
        f"{r.capacity_tokens:,}",
        f"{t.hit_rate:.4f}",
        f"{ceiling.hit_rate:.4f}" if ceiling is not None else "-",
        f"{r.prefill_tokens:,}",
        _share(t.lost_granularity, t.prompt_tokens),
        _share(t.lost_full_hit, t.prompt_tokens),
        _share(t.not_cached, t.prompt_tokens),
        f"{r.evicted_blocks:,}",
        f"{r.waits:,}",
        f"{r.preemptions:,}",
        f"{r.peak_blocks:,}",
        f"{tm['index_us_per_request']:.1f}",
        f"{tm['index_us_per_step']:.1f}",
    ]


def format_table(rep: SimulationReport) -> str:
    """The report: a header, one row per (design, block size, capacity), the legend."""
    w = rep.workload
    sch = rep.scheduler
    lines = [
        f"kvindex simulate: workload {w['name']} ({w['requests']:,} requests, "
        f"{w['prompt_tokens']:,} prompt + {w['output_tokens']:,} output tokens)",
        f"scheduler: at most {sch['max_running']} running, {sch['max_batched_tokens']:,} "
        f"tokens per step; radix inserts at {sch['radix_insert']}, evicts by "
        f"{sch['policy']}; hash {sch['hash_algo']}",
    ]
    if rep.model_shape is not None:
        lines.append(f"model shape {rep.model_shape}: {rep.bytes_per_token:,} KV bytes per token")
    lines.append(
        "theoretical maximum hit rate (token-exact, infinite capacity, one request at a "
        f"time): {rep.theoretical_max:.4f}"
    )
    lines.append("")
    header = [
        "design",
        "bs",
        "capacity",
        "pool tokens",
        "hit rate",
        "ceiling",
        "prefill",
        "lost: granularity",
        "lost: full-hit",
        "not cached",
        "evicted",
        "waits",
        "preempted",
        "peak blocks",
        "µs/req",
        "µs/step",
    ]
    rows = [_row(r, rep.ceilings.get((r.spec.design, r.spec.block_size))) for r in rep.runs]
    lines.append(markdown_table(header, rows, "lrl" + "r" * 13))
    lines.append("")
    lines.append(LEGEND)
    return "\n".join(lines)


def _cell(c: dict[str, Any]) -> str:
    parts = [f"{c['hit']:,}"]
    for key, name in (
        ("lost_granularity", "granularity"),
        ("lost_full_hit", "full-hit"),
        ("not_cached", "evicted"),
    ):
        if c[key]:
            parts.append(f"-{c[key]} {name}")
    mark = "" if c["hit"] == c["expected"] else f" (notes: {c['expected']})"
    return " ".join(parts) + mark


def format_seeds(rows: list[dict[str, Any]]) -> str:
    """The worked examples: what each design hits on the last request of each."""
    header = ["example", "B", *(label for label, _, _ in COLUMNS), "from the notes"]
    body = [
        [r["title"], str(r["block_size"]), *(_cell(r["results"][lab]) for lab, _, _ in COLUMNS)]
        + [r["note"]]
        for r in rows
    ]
    return "\n".join(
        [
            "kvindex simulate --workload seeds: the seed notes' worked examples "
            f"({len(EXAMPLES)}), tokens hit by the last request",
            "(hash_chain@B: block size B; radix@1: token-exact tree; radix@B: pages of B; "
            "-N: tokens of the exact match not hit, and why)",
            "",
            markdown_table(header, body, "lr" + "r" * len(COLUMNS) + "l"),
        ]
    )


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Writes ``data`` as indented JSON (keys in insertion order, newline at the end)."""
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
