"""Checks of ``--json`` / ``--plot`` paths, made before anything is simulated.

A run can take minutes; an output path that cannot be written, or a plot format matplotlib
does not know, must fail at once (one line, exit status 2) rather than after the run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kvindex.simulate.errors import SimulationError

__all__ = ["PLOT_FORMATS", "check_output_path", "check_plot_path"]

#: File formats matplotlib's standard backends write (``savefig`` picks one by suffix).
PLOT_FORMATS: tuple[str, ...] = (
    "eps",
    "jpeg",
    "jpg",
    "pdf",
    "pgf",
    "png",
    "ps",
    "raw",
    "rgba",
    "svg",
    "svgz",
    "tif",
    "tiff",
    "webp",
)

_MISSING_MPL = "--plot needs matplotlib: pip install 'kvindex[plot]' (or pip install matplotlib)"


def check_output_path(option: str, path: str) -> Path:
    """Raises :class:`SimulationError` unless ``path`` can be created or overwritten."""
    p = Path(path)
    if not path.strip():
        raise SimulationError(f"{option}: empty path")
    if p.is_dir():
        raise SimulationError(f"{option} {path}: is a directory")
    parent = p.parent
    if not parent.exists():
        raise SimulationError(f"{option} {path}: directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise SimulationError(f"{option} {path}: {str(parent)!r} is not a directory")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise SimulationError(f"{option} {path}: file is not writable")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise SimulationError(f"{option} {path}: directory {str(parent)!r} is not writable")
    return p


def check_plot_path(path: str) -> Path:
    """:func:`check_output_path` plus a known image format and matplotlib installed."""
    p = check_output_path("--plot", path)
    fmt = p.suffix.lower().lstrip(".")
    if not fmt:
        raise SimulationError(
            f"--plot {path}: no file suffix to name the format (e.g. .png, .svg, .pdf)"
        )
    if fmt not in PLOT_FORMATS:
        raise SimulationError(
            f"--plot {path}: unknown image format {fmt!r}; expected one of "
            f"{', '.join(PLOT_FORMATS)}"
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise SimulationError(_MISSING_MPL)
    return p
