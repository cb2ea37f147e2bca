"""Errors a user can act on.

Every error that comes from bad input carries a location so the CLI can print
`file:line: message` and exit 2; build failures exit 1.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Control characters escaped (\\x1b, \\n): file names and values from hostile input
    reach the terminal in messages, where raw escapes could rewrite what a user sees."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def display_path(path: Path | str) -> str:
    """Show a path relative to the working directory when it lies below it."""
    text = str(path)
    try:
        rel = os.path.relpath(text)
    except ValueError:
        return text
    return text if rel.startswith("..") else rel


@dataclass(frozen=True, order=True)
class Location:
    """A place in a user's file; line is 1-based, 0 when unknown."""

    file: str
    line: int = 0

    def __str__(self) -> str:
        shown = printable(display_path(self.file))
        return f"{shown}:{self.line}" if self.line else shown


class KilnError(Exception):
    """Base of all errors Kiln reports to the user without a traceback."""

    exit_code = 2

    def __init__(self, message: str, location: Location | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class InputError(KilnError):
    """Bad input: a pkg.yaml, vars.yaml, profile or command-line value; shown on one printable line."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        super().__init__(printable(message), location)


class SeveralErrors(KilnError):
    """Errors found in one pass, reported together: in file and line order, one a line, so a run
    shows the same list whatever order it found them in."""

    def __init__(self, errors: list[KilnError]) -> None:
        ordered = sorted(errors, key=lambda e: (e.location or Location(""), e.message))
        super().__init__("\n".join(str(e) for e in ordered))
        self.errors = ordered


class InputErrors(SeveralErrors):
    """Several input errors found in one pass; the CLI prints one line each."""


class BuildError(KilnError):
    """A build step failed; the input was fine."""

    exit_code = 1
