"""A tiny progress bar on stderr (no dependency): redrawn at most ten times a second."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``0:07``, ``1:05``, ``1:02:03``."""
    s = max(int(seconds + 0.5), 0)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """Counts work units toward ``total``; draws
    ``[####------]  42%  0:12 elapsed, 0:16 left  label`` on one line, cut to the terminal
    width.

    Disabled (draws nothing) when ``enabled`` is false; the CLI enables it unless
    ``--quiet`` or stderr is not a terminal. The estimate of the time left assumes the
    remaining units go at the average speed so far.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool,
        stream: TextIO | None = None,
        width: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.label = ""
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._columns = width if width is not None else _stderr_columns
        self._clock = clock
        self._start = clock()
        self._last = -1.0
        self._drawn = 0

    def set_label(self, label: str) -> None:
        """Names the current part of the work."""
        if label != self.label:
            self.label = label
            self._draw(force=True)

    def advance(self, n: int = 1) -> None:
        """Marks ``n`` more units done."""
        self.done += n
        self._draw()

    def line(self) -> str:
        """The text of the bar now, cut to the terminal width."""
        now = self._clock()
        frac = min(self.done / self.total, 1.0)
        elapsed = now - self._start
        filled = int(frac * 20)
        eta = "left ?"
        if frac > 0.005 and elapsed > 0.5:
            eta = f"{format_duration(elapsed * (1 - frac) / frac)} left"
        text = (
            f"[{'#' * filled}{'-' * (20 - filled)}] {100 * frac:3.0f}%  "
            f"{format_duration(elapsed)} elapsed, {eta}  {self.label}"
        )
        cols = max(self._columns() - 1, 10)  # the last column would wrap on some terminals
        return text if len(text) <= cols else text[: cols - 1] + "…"

    def _draw(self, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self._clock()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        text = self.line()
        pad = max(self._drawn - len(text), 0)
        self._drawn = len(text)
        self._stream.write("\r" + text + " " * pad)
        self._stream.flush()

    def close(self) -> None:
        """Erases the bar."""
        if self.enabled and self._drawn:
            self._stream.write("\r" + " " * self._drawn + "\r")
            self._stream.flush()
            self._drawn = 0


def _stderr_columns() -> int:
    return shutil.get_terminal_size((80, 24)).columns
