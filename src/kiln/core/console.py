"""Output helpers: rich on a terminal, plain text when not (CI, pipes).

Kiln's own lines on stderr, progress lines and notes (`say_line`), warnings (`warning`) and errors
(`error`), all go through one writer here. Only the build progress views (kiln.build.progress) draw
on stderr themselves, and the mount helper of a build step (kiln.build.runners.mounter), whose stderr
is the step's log and whose start must stay cheap, prints its one error line itself."""

from __future__ import annotations

import sys

# How builds show progress (kiln.build.progress draws it): --progress, else $KILN_PROGRESS, else auto.
PROGRESS_MODES = ("auto", "plain", "tty")
PROGRESS_ENV = "KILN_PROGRESS"


def is_terminal() -> bool:
    return sys.stdout.isatty()


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A rich table on a terminal; tab-separated lines otherwise, easy to grep and cut."""
    if is_terminal():
        from rich.console import Console  # only on a terminal: importing rich costs a noticeable start-up
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    print("\t".join(columns))
    for row in rows:
        print("\t".join(row))


def say_line(text: str) -> None:
    """A progress line (or a note) on stderr."""
    _stderr_line(text)


def warning(message: str) -> None:
    """A warning on stderr, in the caller's words (they start `kiln VERB:` or `kiln: warning:`)."""
    _stderr_line(message)


def error(message: str) -> None:
    """An error on stderr, as `kiln.cli` reports a KilnError: its text alone."""
    _stderr_line(message)


def _stderr_line(text: str) -> None:
    """Every line Kiln writes to stderr, written in one call so work done in parallel threads (profiles in
    `kiln image`) never shares a line: print() writes the text and its newline separately, and another
    thread's line can land between. Flushed, so a line is out before the process exits or execs."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()
