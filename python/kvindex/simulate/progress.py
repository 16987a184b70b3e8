"""A tiny progress bar on stderr (no dependency): redrawn at most ten times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Counts work units toward ``total``; draws ``[####----]  42%  label`` on one line.

    Disabled (draws nothing) when ``enabled`` is false; the CLI enables it unless
    ``--quiet`` or stderr is not a terminal.
    """

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.label = ""
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._last = 0.0
        self._width = 0

    def set_label(self, label: str) -> None:
        """Names the current part of the work."""
        self.label = label
        self._draw(force=True)

    def advance(self, n: int = 1) -> None:
        """Marks ``n`` more units done."""
        self.done += n
        self._draw()

    def _draw(self, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = min(self.done / self.total, 1.0)
        filled = int(frac * 24)
        text = f"[{'#' * filled}{'-' * (24 - filled)}] {100 * frac:3.0f}%  {self.label}"
        pad = max(self._width - len(text), 0)
        self._width = len(text)
        self._stream.write("\r" + text + " " * pad)
        self._stream.flush()

    def close(self) -> None:
        """Erases the bar."""
        if self.enabled and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0
