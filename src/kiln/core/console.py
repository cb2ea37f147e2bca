"""Output helpers: rich on a terminal, plain text when not (CI, pipes)."""

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
    """A progress line on stderr, written in one call so work done in parallel threads (profiles in
    `kiln image`) never shares a line: print() writes the text and its newline separately, and another
    thread's line can land between."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def error(message: str) -> None:
    print(message, file=sys.stderr)
