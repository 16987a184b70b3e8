"""Reports: a summary that fits the terminal, the full table (aligned text, Markdown or CSV),
the worked examples, and the JSON file."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvindex.simulate.ledger import HitTally
from kvindex.simulate.scheduler import RunResult
from kvindex.simulate.seeds import COLUMNS, EXAMPLES

__all__ = [
    "DEFAULT_WIDTH",
    "FORMATS",
    "JSON_SCHEMA_VERSION",
    "LEGEND",
    "SimulationReport",
    "chunk_semantics",
    "format_full",
    "format_seeds",
    "format_summary",
    "format_table",
    "format_us",
    "markdown_table",
    "plural",
    "text_table",
    "write_json",
]

#: Versions of the JSON layout ``--json`` writes (bumped when a field changes meaning).
JSON_SCHEMA_VERSION = 1
#: Terminal width assumed when it cannot be read.
DEFAULT_WIDTH = 120
#: ``--format`` values: the full table as aligned text, Markdown or CSV.
FORMATS: tuple[str, ...] = ("table", "markdown", "csv")

#: What the columns mean (wrapped to the terminal when printed).
LEGEND = (
    "hit rate: prompt tokens found in the cache / prompt tokens (first admissions). "
    "at inf: the same design and block size with an infinite pool, one request at a time. "
    "prefill: prompt tokens computed, recomputation after preemption included. "
    "lost (% of prompt tokens): tokens of the exact match that were not hit — partial block: "
    "in a block that only partly matches; last block: the block of the last prompt token, "
    "which is always recomputed (full-hit rule); evicted: evicted or not cached yet. "
    "evicted blocks: cached blocks dropped. waits: steps the queue head waited for free "
    "blocks. preempted: requests pushed back to the queue. peak blocks: most blocks held by "
    "running requests. index µs: the index's own time per request (median over requests: "
    "admission, failed attempts that could have passed included, prefill chunks, preempt, "
    "free, checkpoint) and per decode step (append_batch); "
    "measured, so it varies between runs."
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
            "schema_version": JSON_SCHEMA_VERSION,
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


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.2f}%" if total else "-"


def format_us(us: float) -> str:
    """A measured time in µs with the precision it has (two significant digits)."""
    if us <= 0:
        return "0"
    if us < 10:
        return f"{us:.1f}"
    digits = len(str(int(us))) - 2
    return f"{round(us, -digits):.0f}"


@dataclass(frozen=True)
class Column:
    """A table column: header (``\n`` splits it over lines), cell function, alignment,
    and priority (lower is dropped last when the terminal is narrow)."""

    header: str
    cell: Callable[[RunResult, HitTally | None], str]
    align: str = "r"
    priority: int = 0


def _design(r: RunResult, _c: HitTally | None) -> str:
    return r.spec.design


def _pool(r: RunResult) -> str:
    """The capacity as given; memory and block counts also in tokens."""
    cap = r.spec.capacity
    if cap.kind in ("tokens", "inf"):
        return cap.label
    return f"{cap.label} = {r.capacity_tokens:,} tok"


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("design", _design, "l", 0),
    Column("block", lambda r, c: str(r.spec.block_size), "r", 0),
    Column("pool", lambda r, c: _pool(r), "l", 0),
    Column("hit\nrate", lambda r, c: f"{r.tally.hit_rate:.4f}", "r", 0),
    Column("at\ninf", lambda r, c: f"{c.hit_rate:.4f}" if c else "-", "r", 1),
    Column(
        "lost:\npartial block",
        lambda r, c: _pct(r.tally.lost_granularity, r.tally.prompt_tokens),
        "r",
        2,
    ),
    Column(
        "lost:\nlast block",
        lambda r, c: _pct(r.tally.lost_full_hit, r.tally.prompt_tokens),
        "r",
        2,
    ),
    Column("lost:\nevicted", lambda r, c: _pct(r.tally.not_cached, r.tally.prompt_tokens), "r", 2),
    Column("evicted\nblocks", lambda r, c: f"{r.evicted_blocks:,}", "r", 4),
    Column("waits", lambda r, c: f"{r.waits:,}", "r", 5),
    Column("pre-\nempted", lambda r, c: f"{r.preemptions:,}", "r", 6),
    Column(
        "index µs\nper request",
        lambda r, c: format_us(r.timing.as_dict(r.tally.requests)["index_us_per_request_median"]),
        "r",
        3,
    ),
)

FULL_COLUMNS: tuple[tuple[str, Callable[[RunResult, HitTally | None], Any]], ...] = (
    ("design", lambda r, c: r.spec.design),
    ("block size", lambda r, c: r.spec.block_size),
    ("capacity", lambda r, c: r.spec.capacity.label),
    ("pool tokens", lambda r, c: r.capacity_tokens),
    ("prompt tokens", lambda r, c: r.tally.prompt_tokens),
    ("hit tokens", lambda r, c: r.tally.hit_tokens),
    ("hit rate", lambda r, c: round(r.tally.hit_rate, 4)),
    ("hit rate at inf", lambda r, c: round(c.hit_rate, 4) if c else None),
    ("prefill tokens", lambda r, c: r.prefill_tokens),
    ("lost: partial block", lambda r, c: r.tally.lost_granularity),
    ("lost: last block", lambda r, c: r.tally.lost_full_hit),
    ("lost: evicted", lambda r, c: r.tally.not_cached),
    ("evicted blocks", lambda r, c: r.evicted_blocks),
    ("waits", lambda r, c: r.waits),
    ("preempted", lambda r, c: r.preemptions),
    ("peak blocks", lambda r, c: r.peak_blocks),
    (
        "index µs per request (median)",
        lambda r, c: float(
            format_us(r.timing.as_dict(r.tally.requests)["index_us_per_request_median"])
        ),
    ),
    (
        "index µs per request (mean)",
        lambda r, c: float(format_us(r.timing.as_dict(r.tally.requests)["index_us_per_request"])),
    ),
    (
        "index µs per step (median)",
        lambda r, c: float(
            format_us(r.timing.as_dict(r.tally.requests)["index_us_per_step_median"])
        ),
    ),
)


def text_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str, gap: int = 2
) -> list[str]:
    """Aligned plain-text lines; a header cell may span several lines (split on ``\\n``)."""
    split = [h.split("\n") for h in header]
    depth = max(len(h) for h in split)
    split = [[""] * (depth - len(h)) + h for h in split]
    widths = [
        max(max(len(x) for x in h), *(len(r[i]) for r in rows)) if rows else max(map(len, h))
        for i, h in enumerate(split)
    ]
    sep = " " * gap

    def line(cells: Sequence[str]) -> str:
        return sep.join(
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ).rstrip()

    out = [line([h[k] for h in split]) for k in range(depth)]
    out.append(sep.join("-" * w for w in widths))
    out += [line(r) for r in rows]
    return out


def chunk_semantics(radix_insert: str) -> str:
    """The report header's line saying when each design caches a prompt's blocks."""
    if radix_insert == "schedule":
        return (
            "chunk semantics (both designs, vLLM's): a prefill chunk's full blocks are "
            "cacheable from the step that schedules them"
        )
    when = "its prefill completes" if radix_insert == "prefill" else "the request finishes"
    return (
        f"alternative model (--radix-insert {radix_insert}): whole-prompt admission; the "
        f"hash chain caches the whole prompt at admission, the radix tree inserts it when "
        f"{when}"
    )


def _heading(rep: SimulationReport, width: int) -> list[str]:
    w = rep.workload
    sch = rep.scheduler
    lines = [
        f"kvindex simulate: workload {w['name']} ({plural(w['requests'], 'request')}, "
        f"{plural(w['prompt_tokens'], 'prompt token')} + "
        f"{plural(w['output_tokens'], 'output token')})",
        f"scheduler: at most {sch['max_running']} running, "
        f"{plural(sch['max_batched_tokens'], 'token')} per step; radix evicts by "
        f"{sch['policy']}; hash {sch['hash_algo']}",
        chunk_semantics(sch["radix_insert"]),
    ]
    if rep.model_shape is not None:
        lines.append(f"model shape {rep.model_shape}: {rep.bytes_per_token:,} KV bytes per token")
    lines.append(
        "theoretical maximum hit rate (token-exact, infinite pool, one request at a time): "
        f"{rep.theoretical_max:.4f}"
    )
    out: list[str] = []
    for ln in lines:
        out += textwrap.wrap(ln, width, subsequent_indent="  ") or [""]
    return out


def plural(n: int, word: str) -> str:
    """``1 token``, ``2 tokens``, ``12,031 requests``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def format_summary(rep: SimulationReport, width: int = DEFAULT_WIDTH) -> str:
    """The default report: heading, the columns that fit in ``width``, the wrapped legend."""
    cols = list(SUMMARY_COLUMNS)
    rows_of = [(r, rep.ceilings.get((r.spec.design, r.spec.block_size))) for r in rep.runs]
    dropped = 0
    while True:
        header = [c.header for c in cols]
        rows = [[c.cell(r, ceil) for c in cols] for r, ceil in rows_of]
        table = text_table(header, rows, "".join(c.align for c in cols))
        if max(len(x) for x in table) <= width or all(c.priority == 0 for c in cols):
            break
        worst = max(range(len(cols)), key=lambda i: (cols[i].priority, i))
        del cols[worst]
        dropped += 1
    lines = [*_heading(rep, width), "", *table, ""]
    legend = LEGEND
    if dropped:
        legend += f" ({plural(dropped, 'column')} left out to fit {width} columns: --format table)"
    else:
        legend += " Every column and the peak blocks: --format table|markdown|csv, or --json."
    lines += textwrap.wrap(legend, width)
    return "\n".join(lines)


def format_full(rep: SimulationReport, fmt: str) -> str:
    """Every column, one row per run: ``table`` (aligned text, with the heading and legend),
    ``markdown`` or ``csv`` (the rows only)."""
    rows_raw = [
        [f(r, rep.ceilings.get((r.spec.design, r.spec.block_size))) for _, f in FULL_COLUMNS]
        for r in rep.runs
    ]
    header = [h for h, _ in FULL_COLUMNS]
    if fmt == "csv":
        buf = io.StringIO()
        wr = csv.writer(buf, lineterminator="\n")
        wr.writerow(header)
        for row in rows_raw:
            wr.writerow(["" if v is None else v for v in row])
        return buf.getvalue().rstrip("\n")

    def show(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool) or not isinstance(v, int | float):
            return str(v)
        if isinstance(v, float):
            return f"{v:g}" if v < 10 else f"{v:,.0f}"
        return f"{v:,}"

    rows = [[show(v) for v in row] for row in rows_raw]
    align = "lrl" + "r" * (len(header) - 3)
    if fmt == "markdown":
        return markdown_table(header, rows, align)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return "\n".join([*_heading(rep, 10**6), "", *text_table(header, rows, align), "", LEGEND])


def format_table(rep: SimulationReport) -> str:
    """The full report as Markdown (heading, table, legend)."""
    return "\n".join([*_heading(rep, 10**6), "", format_full(rep, "markdown"), "", LEGEND])


def _cell(c: dict[str, Any]) -> str:
    parts = [f"{c['hit']:,}"]
    for key, name in (
        ("lost_granularity", "partial block"),
        ("lost_full_hit", "last block"),
        ("not_cached", "evicted"),
    ):
        if c[key]:
            parts.append(f"-{c[key]} {name}")
    mark = "" if c["hit"] == c["expected"] else f" (notes: {c['expected']})"
    return " ".join(parts) + mark


def format_seeds(rows: list[dict[str, Any]], width: int = DEFAULT_WIDTH) -> str:
    """The worked examples: what each design hits on the last request of each."""
    header = ["example", "B", *(label for label, _, _ in COLUMNS)]
    body = [
        [r["key"], str(r["block_size"]), *(_cell(r["results"][lab]) for lab, _, _ in COLUMNS)]
        for r in rows
    ]
    intro = (
        f"kvindex simulate --workload seeds: the {len(EXAMPLES)} worked examples of the vLLM "
        "hash-chain and radix-tree design notes; tokens hit by the last request of each. "
        "hash_chain@B: block size B; radix@1: token-exact tree; radix@B: pages of B; "
        "-N partial block / last block / evicted: tokens of the exact match not hit, and why."
    )
    lines = textwrap.wrap(intro, width)
    lines += ["", *text_table(header, body, "lr" + "r" * len(COLUMNS)), ""]
    for r in rows:
        lines += textwrap.wrap(
            f"{r['key']}: {r['title']} — {r['note']}", width, subsequent_indent="    "
        )
    return "\n".join(lines)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Writes ``data`` as indented JSON (keys in insertion order, newline at the end)."""
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
