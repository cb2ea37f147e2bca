"""Output helpers: rich on a terminal, plain text when not (CI, pipes)."""

from __future__ import annotations

import sys


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


def error(message: str) -> None:
    print(message, file=sys.stderr)
