"""A progress bar on standard error for work that takes a while (`triage eval`): only on a terminal, only after 2 s."""

from __future__ import annotations

import sys
import threading
from typing import IO

SHOW_AFTER_S = 2.0  # shorter work finishes before a bar would be worth drawing


class ProgressBar:
    """Counts finished items; draws a transient rich bar once the work has run `delay` seconds on a terminal.

    Thread-safe: `advance` may be called from worker threads. Nothing is drawn when the stream is not a
    terminal (a pipe, a CI log), so output stays the same there.
    """

    def __init__(
        self, total: int, description: str, stream: IO[str] | None = None, delay: float = SHOW_AFTER_S
    ) -> None:
        self.total = total
        self.description = description
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self.done = 0
        self._label = ""
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._bar = None
        self._task = None
        self._closed = False

    def __enter__(self) -> ProgressBar:
        if self.total > 0 and _isatty(self.stream):
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def advance(self, label: str = "") -> None:
        """One more item finished; `label` names it (shown beside the bar)."""
        with self._lock:
            self.done += 1
            self._label = label
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done, item=label)

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._closed:
                return
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[item]}", style="dim", markup=False),
                console=Console(file=self.stream, force_jupyter=False), transient=True,
            )  # fmt: skip
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done, item=self._label)
            self._bar.start()

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
