"""``--plot``: hit rate against capacity, one line per design and block size (matplotlib)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvindex.simulate.errors import SimulationError
from kvindex.simulate.report import SimulationReport

__all__ = ["plot_available", "plot_hit_rate", "token_label"]

_MISSING = "--plot needs matplotlib: pip install 'kvindex[plot]' (or pip install matplotlib)"
# One colour per design, one marker per block size (both cycle): readable in print too.
_COLOURS = {"hash_chain": "tab:blue", "radix": "tab:orange"}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_LINES = {"hash_chain": "-", "radix": "--"}


def plot_available() -> None:
    """Raises :class:`SimulationError` with install advice if matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SimulationError(_MISSING)


def token_label(n: float) -> str:
    """``512``, ``32k``, ``1.5M``: a pool size in tokens for an axis tick."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def plot_hit_rate(rep: SimulationReport, path: str | Path) -> None:
    """Draws hit rate vs pool tokens (log axis, a tick per pool size); ``inf`` runs sit at
    the right edge under a tick labelled ``inf``, the theoretical maximum is a dashed line.
    Writes ``path`` (format from its suffix)."""
    plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    finite = sorted({r.capacity_tokens for r in rep.runs if not r.spec.capacity.infinite})
    top = max(finite, default=1)
    has_inf = any(r.spec.capacity.infinite for r in rep.runs)
    x_inf = top * 4 if finite else 1
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rep.runs:
        x = float(x_inf if r.spec.capacity.infinite else r.capacity_tokens)
        series.setdefault((r.spec.design, r.spec.block_size), []).append((x, r.tally.hit_rate))
    sizes = sorted({bs for _, bs in series})
    for i, ((design, bs), pts) in enumerate(series.items()):
        pts.sort()
        # Sizes shrink and faces alternate so that equal points of two series stay visible.
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker=_MARKERS[sizes.index(bs) % len(_MARKERS)],
            linestyle=_LINES.get(design, ":"),
            color=_COLOURS.get(design),
            markersize=max(10 - 1.5 * i, 4),
            markerfacecolor="none" if sizes.index(bs) % 2 else None,
            label=f"{design}, block {bs}",
        )
    ax.axhline(rep.theoretical_max, linestyle=":", color="grey", label="theoretical maximum")
    ax.set_xscale("log")
    ticks = [float(x) for x in finite] + ([float(x_inf)] if has_inf else [])
    labels = [token_label(x) for x in finite] + (["inf"] if has_inf else [])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, labels)
    if has_inf and finite:
        ax.axvline(x_inf, linestyle=":", color="lightgrey")
    if ticks:
        ax.set_xlim(min(ticks) / 1.6, max(ticks) * 1.6)
    ax.set_xlabel("KV pool (tokens; inf = every request fits at once)")
    ax.set_ylabel("token hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"kvindex simulate: {rep.workload['name']}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(True, axis="x", which="major", alpha=0.2)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
