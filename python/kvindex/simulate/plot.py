"""``--plot``: hit rate against capacity, one line per design and block size (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from kvindex.simulate.errors import SimulationError
from kvindex.simulate.report import SimulationReport

__all__ = ["plot_available", "plot_hit_rate"]

_MISSING = "--plot needs matplotlib: pip install 'kvindex[plot]' (or pip install matplotlib)"


def plot_available() -> None:
    """Raises :class:`SimulationError` with install advice if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SimulationError(_MISSING) from None


def plot_hit_rate(rep: SimulationReport, path: str | Path) -> None:
    """Draws hit rate vs pool tokens (log axis); ``inf`` runs sit at the right edge (marked inf),
    and the theoretical maximum is a dashed line. Writes ``path`` (format from its suffix)."""
    plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [r.capacity_tokens for r in rep.runs if not r.spec.capacity.infinite]
    top = max(finite, default=1)
    x_inf = top * 4 if finite else 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rep.runs:
        x = float(x_inf if r.spec.capacity.infinite else r.capacity_tokens)
        series.setdefault((r.spec.design, r.spec.block_size), []).append((x, r.tally.hit_rate))
    for (design, bs), pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{design} bs={bs}")
    ax.axhline(rep.theoretical_max, linestyle="--", color="grey", label="theoretical max")
    ax.set_xscale("log")
    if any(r.spec.capacity.infinite for r in rep.runs) and finite:
        ax.axvline(x_inf, linestyle=":", color="lightgrey")
        ax.text(x_inf, 0.03, " inf", ha="left", va="bottom", color="dimgrey")
    ax.set_xlabel("KV pool (tokens)")
    ax.set_ylabel("token hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"kvindex simulate: {rep.workload['name']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
