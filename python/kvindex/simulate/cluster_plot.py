"""``simulate --cluster --plot``: hit rate and queueing delay per routing policy (matplotlib).

One panel pair per figure: bars of cluster hit rate (left) and mean queueing delay in
steps (right) per policy, one bar group per engine design and block size. The ``global``
pool (one engine with W times the pool: the upper bound) is a dashed line per design
rather than a bar, and the per-node ``random`` baseline (Mooncake's comparison) is
hatched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvindex.simulate.plot import plot_available

if TYPE_CHECKING:
    from kvindex.simulate.cluster_report import ClusterResult

__all__ = ["plot_cluster"]

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def _hit_rate(r: ClusterResult) -> float:
    return r.hit_rate


def _queue_delay(r: ClusterResult) -> float:
    return r.mean_queue_delay


def plot_cluster(
    results: list[ClusterResult], workers: int, path: str | Path, *, title: str = ""
) -> None:
    """Draws ``results`` (the runs of :func:`~kvindex.simulate.cluster.run_cluster`) and
    writes ``path`` (format from its suffix). Raises ``SimulationError`` without
    matplotlib."""
    plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: list[tuple[str, int]] = []
    for r in results:
        if (r.design, r.block_size) not in groups:
            groups.append((r.design, r.block_size))
    routes = [r.route for r in results if r.route != "global"]
    routes = list(dict.fromkeys(routes))
    by = {(r.design, r.block_size, r.route): r for r in results}
    fig, (ax_hit, ax_delay) = plt.subplots(1, 2, figsize=(11, 4.6))
    width = 0.8 / max(len(groups), 1)
    xs = range(len(routes))
    for g, (design, bs) in enumerate(groups):
        colour = _COLOURS[g % len(_COLOURS)]
        label = f"{design}, block {bs}"
        offs = [x - 0.4 + width * (g + 0.5) for x in xs]
        runs = [by.get((design, bs, route)) for route in routes]
        hatches = ["//" if route == "random" else "" for route in routes]
        for ax, value in ((ax_hit, _hit_rate), (ax_delay, _queue_delay)):
            heights = [value(r) if r is not None else 0.0 for r in runs]
            bars = ax.bar(offs, heights, width, color=colour, label=label)
            for bar, hatch in zip(bars, hatches, strict=True):
                bar.set_hatch(hatch)
            top = by.get((design, bs, "global"))
            if top is not None:
                ax.axhline(
                    value(top),
                    color=colour,
                    linestyle="--",
                    linewidth=1,
                    label=f"global pool ({design}, block {bs})",
                )
    for ax in (ax_hit, ax_delay):
        ax.set_xticks(list(xs), [f"{r}\n(baseline)" if r == "random" else r for r in routes])
        ax.grid(True, axis="y", alpha=0.3)
    ax_hit.set_ylabel("cluster token hit rate")
    ax_hit.set_ylim(0, 1.02)
    ax_hit.set_title("hit rate (dashed: one global pool, the upper bound)")
    ax_delay.set_ylabel("mean queueing delay (steps)")
    ax_delay.set_title("queueing delay (dashed: one global pool)")
    ax_hit.legend(loc="upper right", fontsize="x-small")
    fig.suptitle(f"kvindex simulate --cluster {workers}" + (f": {title}" if title else ""))
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
