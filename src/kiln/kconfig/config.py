"""Kernel config files: parse `.config`/defconfig/fragment text, merge, and check what survived.

Kconfig writes three kinds of lines that matter: `CONFIG_X=value`, `# CONFIG_X is not set`
and comments. A fragment (or a defconfig) lists a subset; after `make olddefconfig` every
option a fragment asked for must still have the value it asked for, or Kconfig dropped it
(an unmet dependency, a typo, an option this kernel does not have).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import InputError

_SET = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_UNSET = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")

NOT_SET = "n"


def parse(text: str) -> dict[str, str]:
    """Option name -> value ('y', 'm', 'n' for "is not set", or the literal, quotes kept)."""
    options: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if match := _SET.match(line):
            options[match.group(1)] = match.group(2)
        elif match := _UNSET.match(line):
            options[match.group(1)] = NOT_SET
    return options


def parse_file(path: Path) -> dict[str, str]:
    return parse(path.read_text())


def merge(layers: Iterable[dict[str, str]]) -> dict[str, str]:
    """What a chain of fragments asks for: later layers win (as merge_config.sh does)."""
    wanted: dict[str, str] = {}
    for layer in layers:
        wanted.update(layer)
    return wanted


@dataclass(frozen=True)
class Dropped:
    option: str
    wanted: str
    got: str

    def __str__(self) -> str:
        got = "is not set" if self.got == NOT_SET else f"={self.got}"
        wanted = "is not set" if self.wanted == NOT_SET else f"={self.wanted}"
        return f"{self.option}: asked for {wanted}, final .config has {got}"


def dropped(wanted: dict[str, str], final: dict[str, str]) -> list[Dropped]:
    """Options whose final value differs from what was asked (an absent option counts as not set)."""
    out = []
    for option, value in sorted(wanted.items()):
        got = final.get(option, NOT_SET)
        if got != value:
            out.append(Dropped(option, value, got))
    return out


def fragment_names(value: str) -> list[str]:
    """The `kernel_fragments` variable: comma-separated names, blanks ignored."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise InputError(f"kernel_fragments: {name!r} is not a fragment name (letters, digits, . _ -)")
    return names


def header(text: str) -> str:
    """The leading comment block of a config file (kept when `kiln kernel` rewrites it)."""
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if (line.startswith("#") and not _UNSET.match(line.strip())) or (not line.strip() and lines):
            lines.append(line)
        else:
            break
    return "".join(lines)
