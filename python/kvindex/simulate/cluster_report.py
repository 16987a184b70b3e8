"""The cluster simulation's figures: :class:`ClusterResult`, one routing policy's run, and
the report's text, one table per engine design and block size."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ClusterResult", "cluster_report", "faults_report"]


@dataclass
class ClusterResult:
    """One policy's run (each figure is described in :mod:`kvindex.simulate.cluster`)."""

    route: str
    workers: int
    design: str = "hash_chain"
    block_size: int = 16
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    imbalance_running: float = 0.0
    imbalance_queued: float = 0.0
    mean_queue_delay: float = 0.0
    index_ns_per_event: float = 0.0
    route_ns_per_decision: float = 0.0
    block_events: int = 0
    batches: int = 0
    repaired: int = 0
    lost: int = 0
    flagged_decisions: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens hit / prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``hit_rate``."""
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


def cluster_report(results: list[ClusterResult], workers: int, kw: dict[str, Any]) -> str:
    """One section per (design, block size), in run order."""
    sections: dict[tuple[str, int], list[ClusterResult]] = {}
    for r in results:
        sections.setdefault((r.design, r.block_size), []).append(r)
    return "\n\n".join(
        _table(rows, workers, kw, design, bs) for (design, bs), rows in sections.items()
    )


def _table(
    results: list[ClusterResult], workers: int, kw: dict[str, Any], design: str, bs: int
) -> str:
    what = f"hash_chain ({kw['algo']})" if design == "hash_chain" else f"radix ({kw['policy']})"
    head = (
        f"{what}: cluster of {workers} engines, {kw['blocks']} blocks of {bs} tokens each "
        f"(global: one engine with {workers}x pool, running limit and budget)"
    )
    w = max(14, *(len(r.route) for r in results))
    cols = (
        f"{'route':{w}s} hit rate  prefill tok  run max/mean  queue max/mean  delay  "
        "ns/event  us/route  repaired  lost  wall s"
    )
    rows = [head, cols]
    for r in results:
        rows.append(
            f"{r.route:{w}s} {r.hit_rate:8.3f}  {r.prefill_tokens:11d}  "
            f"{r.imbalance_running:12.2f}  "
            f"{r.imbalance_queued:14.2f}  {r.mean_queue_delay:5.1f}  {r.index_ns_per_event:8.0f}  "
            f"{r.route_ns_per_decision / 1000:8.1f}  {r.repaired:8d}  {r.lost:4d}  {r.wall_s:6.1f}"
        )
    return "\n".join(rows)


def faults_report(results: list[ClusterResult], faults: Any) -> str:
    """Routing quality under injected faults, with and without recovery: hit rate, the
    share of (engine, sample) pairs on which the index differed from the engine's cache
    and the mean blocks they differed by, snapshots restored, batches given up, workers
    degraded at the end, and what the proxy injected."""
    head = f"faults: {', '.join(f'{k}={v}' for k, v in vars(faults).items())}"
    w = max(18, *(len(r.route) for r in results))
    cols = (
        f"design@bs      {'route':{w}s} hit rate  index wrong  blocks off  snapshots  "
        "lost  degraded  injected (drop/corrupt/dup/bad/replay)"
    )
    rows = [head, cols]
    for r in results:
        if "stale_share" not in r.extra:
            continue
        inj = r.extra.get("injected", {})
        injected = "/".join(
            str(inj.get(k, 0))
            for k in ("dropped", "corrupted", "duplicated", "bad_messages", "replay_faults")
        )
        rows.append(
            f"{r.design + '@' + str(r.block_size):14s} {r.route:{w}s} {r.hit_rate:8.3f}  "
            f"{r.extra['stale_share']:11.3f}  {r.extra['stale_blocks']:10.1f}  "
            f"{r.extra.get('snapshots', 0):9d}  {r.lost:4d}  {r.extra.get('degraded_at_end', 0):8d}"
            f"  {injected}"
        )
    return "\n".join(rows)
