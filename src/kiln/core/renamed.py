"""Options that changed their name: the old spelling still works, says the new one, and may not be
given beside it (`kiln image --output` -> `--kind`, `kiln boot --disk` -> `--blank-disk`, ...)."""

from __future__ import annotations

import sys
from typing import TypeVar

from kiln.core.errors import InputError

T = TypeVar("T")


def renamed(verb: str, old: str, new: str, old_value: T | None, new_value: T | None, why: str = "") -> T | None:
    """The option's value: the old name's (with a word on stderr) when given, else the new name's."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise InputError(f"{old.split()[0]} is the old name of {new.split()[0]}: give one of them")
    print(f"kiln {verb}: {old} is now {new}{f' ({why})' if why else ''}", file=sys.stderr)
    return old_value
