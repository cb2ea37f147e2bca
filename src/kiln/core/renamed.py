"""Options that changed their name: the old spelling still works, says the new one, and may not be
given beside it (`kiln image --output` -> `--kind`, `kiln boot --disk` -> `--blank-disk`, ...).

A rename is declared once, as a `Renamed` beside the option in the verb's add_arguments (`add_to`
adds the old spelling, hidden from --help); the verb reads the option through it (`value`) when it
needs it, so the word on stderr comes where the option is used."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, TypeVar

from kiln.core import console
from kiln.core.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Renamed:
    """`old` (as the word on stderr shows it, e.g. "--disk SIZE") is now `new`; argparse keeps the old
    spelling's value in `dest`."""

    verb: str
    old: str
    new: str
    dest: str
    why: str = ""

    def add_to(self, parser: argparse.ArgumentParser, **kwargs: Any) -> None:
        """The old spelling as an option of its own, hidden from --help (kwargs as add_argument's)."""
        parser.add_argument(self.old.split()[0], dest=self.dest, help=argparse.SUPPRESS, **kwargs)

    def value(self, args: argparse.Namespace, new_value: T | None) -> T | None:
        """The option's value: the old spelling's (with a word on stderr) when given, else `new_value`. A
        flag's old spelling not given is False, which counts as not given."""
        old_value = getattr(args, self.dest)
        return renamed(self.verb, self.old, self.new, None if old_value is False else old_value, new_value, self.why)


def renamed(verb: str, old: str, new: str, old_value: T | None, new_value: T | None, why: str = "") -> T | None:
    """The option's value: the old name's (with a word on stderr) when given, else the new name's."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise InputError(f"{old.split()[0]} is the old name of {new.split()[0]}: give one of them")
    console.warning(f"kiln {verb}: {old} is now {new}{f' ({why})' if why else ''}")
    return old_value
