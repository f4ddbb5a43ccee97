"""A one-line progress bar on stderr (redrawn in a terminal, one line per step otherwise)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts steps out of ``total`` and shows the last step's note."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.started = time.monotonic()
        self._tty = self.stream.isatty()

    def line(self, note: str) -> str:
        """The bar as text, e.g. ``[######------] 3/6  40s  on turn 3 ...``."""
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.started
        return f"[{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {note}"

    def step(self, note: str) -> None:
        """Count one step and redraw."""
        self.done += 1
        self.show(note)

    def show(self, note: str) -> None:
        if self._tty:
            self.stream.write("\r\x1b[2K" + self.line(note))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(self.line(note) + "\n")
        self.stream.flush()
