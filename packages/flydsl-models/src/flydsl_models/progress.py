"""Progress of an evaluation: rich bars on a terminal, one line per phase in a log.

``Progress(console, mode)``: ``mode`` is ``"bars"`` (rich's live progress bars: a
terminal), ``"lines"`` (stdout is a pipe or a file: CI, ``tee``, a log; each phase
prints one line when it ends, with its own time and the time since the start, and
flushes, so a log shows where a run is) or ``"off"`` (``--no-progress``, and the
ranks other than 0 under tensor parallelism). ``phase(name, total)`` is a context
manager; ``advance()`` on what it returns moves a bar.
"""

from __future__ import annotations

import contextlib
import time


def mode_for(console, quiet: bool) -> str:
    if quiet:
        return "off"
    return "bars" if console.is_terminal else "lines"


class _Phase:
    def __init__(self, bar=None, task=None):
        self.bar, self.task = bar, task

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, n)


class Progress:
    def __init__(self, console, mode: str):
        self.console = console
        self.mode = mode
        self.start = time.perf_counter()
        self.bars = None

    def __enter__(self):
        if self.mode == "bars":
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import (
                Progress as Bars,
            )

            self.bars = Bars(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bars is not None:
            self.bars.__exit__(*exc)
            self.bars = None

    def line(self, text: str) -> None:
        """One line in ``lines`` mode (a note outside any phase), nothing otherwise."""
        if self.mode == "lines":
            f = self.console.file
            f.write(f"[{time.perf_counter() - self.start:7.1f} s] {text}\n")
            f.flush()

    @contextlib.contextmanager
    def phase(self, name: str, total: int = 1):
        t0 = time.perf_counter()
        if self.bars is not None:
            task = self.bars.add_task(name, total=total)
            ph = _Phase(self.bars, task)
            yield ph
            self.bars.update(task, completed=total)
            return
        ok = False
        try:
            yield _Phase()
            ok = True
        finally:
            if self.mode == "lines":
                took = time.perf_counter() - t0
                self.line(f"{name}: {'done' if ok else 'FAILED'} in {took:.1f} s")
