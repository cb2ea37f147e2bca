"""Showing a build: a rich live view on a terminal, plain lines otherwise (CI, pipes).

`--progress` (or $KILN_PROGRESS) decides: auto (the live view when stderr is a terminal), plain
(lines, even on a terminal: a screen reader, a terminal recorder) or tty (the live view even into a
pipe: a CI system that renders terminal output).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from kiln.build.cancel import TOKEN
from kiln.build.scheduler import BUILT, CACHED, CANCELLED, FAILED, SKIPPED, Outcome
from kiln.core.console import PROGRESS_ENV, PROGRESS_MODES

if TYPE_CHECKING:  # rich is imported only for a terminal: plain runs (CI, no-op builds) skip its cost
    from rich.console import Console, Group
    from rich.table import Table


__all__ = [  # the --progress modes are the console's (kiln.core.console), read here as before
    "PROGRESS_ENV",
    "PROGRESS_MODES",
    "Cancellable",
    "DownloadBars",
    "DownloadLines",
    "LiveProgress",
    "PlainProgress",
    "counts",
    "download_progress",
    "live",
    "set_mode",
    "summary_table",
]

_mode = {"value": "auto"}


def set_mode(given: str | None) -> None:
    """--progress's value, else $KILN_PROGRESS's, else auto."""
    from kiln.core.errors import InputError

    mode = given or os.environ.get(PROGRESS_ENV) or "auto"
    if mode not in PROGRESS_MODES:
        raise InputError(f"${PROGRESS_ENV}={mode!r}: choose from {', '.join(PROGRESS_MODES)}")
    _mode["value"] = mode


def live() -> bool:
    """Draw the live view (a terminal's) rather than plain lines?"""
    mode = _mode["value"]
    return mode == "tty" or (mode == "auto" and sys.stderr.isatty())


def summary_table(outcomes: dict[str, Outcome]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="kiln build")
    for column in ("package", "status", "seconds", "key"):
        table.add_column(column)
    colours = {BUILT: "green", CACHED: "cyan", FAILED: "red", SKIPPED: "yellow", CANCELLED: "magenta"}
    for outcome in outcomes.values():
        table.add_row(
            outcome.name,
            Text(outcome.status, style=colours[outcome.status]),
            f"{outcome.seconds:.1f}",
            outcome.key[:12],
        )
    return table


def counts(outcomes: list[Outcome]) -> str:
    """Counts by status; cancelled ones only when a signal stopped the run."""
    by = {s: sum(1 for o in outcomes if o.status == s) for s in (BUILT, CACHED, FAILED, CANCELLED)}
    text = f"built {by[BUILT]}, cached {by[CACHED]}, failed {by[FAILED]}"
    return text + (f", cancelled {by[CANCELLED]}" if by[CANCELLED] else "")


class PlainProgress:
    """One line per event, flushed, with counts; readable in CI logs."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = 0
        self.finished: list[Outcome] = []
        self._last_phase: dict[str, str] = {}
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)

    def begin(self, names: list[str]) -> None:
        self.total = len(names)

    def started(self, name: str) -> None:
        self._say(f"[{len(self.finished)}/{self.total}] {name}: building")

    def phase(self, name: str, text: str) -> None:
        if self._last_phase.get(name) != text:  # one line per phase, not per snippet
            self._last_phase[name] = text
            self._say(f"[{len(self.finished)}/{self.total}] {name}: {text}")

    def done(self, outcome: Outcome) -> None:
        self.finished.append(outcome)
        timing = f" in {outcome.seconds:.1f} s" if outcome.status == BUILT else ""
        self._say(f"[{len(self.finished)}/{self.total}] {outcome.name}: {outcome.status}{timing}")

    def end(self, outcomes: dict[str, Outcome]) -> None:
        skipped = sum(1 for o in outcomes.values() if o.status == SKIPPED)
        stopped = any(o.status == CANCELLED for o in outcomes.values())
        self._say(f"{'stopped' if stopped else 'done'}: {counts(list(outcomes.values()))}, skipped {skipped}")


class LiveProgress:
    """A live table of running packages with their step and elapsed time, then a summary."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.total = 0
        self.finished: list[Outcome] = []
        self.running: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
        self.live.get_renderable = self._render  # type: ignore[method-assign]

    def _render(self) -> Group:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            table = Table.grid(padding=(0, 2))
            now = time.monotonic()
            for name, (text, since) in sorted(self.running.items()):
                table.add_row(Text(name, style="bold"), text, f"{now - since:5.0f} s")
            head = Text(f"[{len(self.finished)}/{self.total}] {counts(self.finished)}")
            return Group(head, table)

    def begin(self, names: list[str]) -> None:
        self.total = len(names)
        self.live.start()

    def started(self, name: str) -> None:
        with self._lock:
            self.running[name] = ("starting", time.monotonic())

    def phase(self, name: str, text: str) -> None:
        with self._lock:
            since = self.running.get(name, ("", time.monotonic()))[1]
            self.running[name] = (text, since)

    def done(self, outcome: Outcome) -> None:
        with self._lock:
            self.running.pop(outcome.name, None)
            self.finished.append(outcome)
        if outcome.status in (BUILT, FAILED, CANCELLED):
            self.console.print(f"{outcome.name}: {outcome.status} ({outcome.seconds:.1f} s)")

    def end(self, outcomes: dict[str, Outcome]) -> None:
        self.live.stop()
        self.console.print(summary_table(outcomes))


class DownloadLines:
    """Source downloads as plain lines: one when a download starts, one when it completes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, label: str, done: int, total: int | None) -> None:
        if done == 0:
            size = f" ({total / 1048576:.1f} MiB)" if total else ""
            with self._lock:
                print(f"fetch: {label}{size}", file=self.stream, flush=True)
        elif total is not None and done == total:
            with self._lock:
                print(f"fetch: {label}: done", file=self.stream, flush=True)


class DownloadBars:
    """Source downloads as rich progress bars on a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=console or Console(stderr=True),
            transient=True,
        )
        self.tasks: dict[str, object] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, done: int, total: int | None) -> None:
        with self._lock:
            if label not in self.tasks:
                if not self.tasks:
                    self.bars.start()
                self.tasks[label] = self.bars.add_task(label, total=total)
            task = self.tasks[label]
            self.bars.update(task, completed=done, total=total)  # type: ignore[arg-type]
            if total is not None and done >= total:
                self.bars.remove_task(task)  # type: ignore[arg-type]
                del self.tasks[label]
                if not self.tasks:
                    self.bars.stop()


class Cancellable:
    """Download progress that ends the download once the run is cancelled (the fetcher drops its partial file).

    Called for every chunk, so a signal stops a long download within a chunk, not at its end.
    """

    def __init__(self, inner: Callable[[str, int, int | None], None]) -> None:
        self.inner = inner

    def __call__(self, label: str, done: int, total: int | None) -> None:
        TOKEN.check(f"download of {label}")
        self.inner(label, done, total)


def download_progress() -> Cancellable:
    return Cancellable(DownloadBars() if live() else DownloadLines())
