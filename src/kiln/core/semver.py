"""Semantic versions (semver.org 2.0.0): what a release's version must be and how two compare.

Both the release version a build takes (kiln.core.release_version) and the releases `kiln release
push` publishes (kiln.installer.release) are read here, so they accept exactly the same texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kiln.core.errors import InputError

_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
SEMVER = re.compile(
    rf"(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)\.(?P<patch>0|[1-9][0-9]*)"
    rf"(?:-(?P<pre>{_ID}(?:\.{_ID})*))?(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


@dataclass(frozen=True)
class SemVer:
    """A semantic version (semver.org 2.0.0): X.Y.Z, an optional -prerelease and +build."""

    text: str
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, what: str = "version") -> SemVer:
        match = SEMVER.fullmatch(text)
        if not match:
            raise InputError(
                f"{what} {text!r} is not a semantic version: expected MAJOR.MINOR.PATCH with an optional "
                "-prerelease and +build (such as 1.4.0, 1.5.0-rc.1 or 1.5.0+g1234abc)"
            )
        pre = match.group("pre")
        return cls(
            text, int(match["major"]), int(match["minor"]), int(match["patch"]), tuple(pre.split(".")) if pre else ()
        )

    def key(self) -> tuple[Any, ...]:
        """Precedence: numbers, then a release above its prereleases, whose identifiers compare one by one
        (numeric ones as numbers and below alphanumeric ones); build metadata does not count."""
        pre = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if pre else 1, pre)

    def __lt__(self, other: SemVer) -> bool:
        return self.key() < other.key()

    def __le__(self, other: SemVer) -> bool:
        return self.key() <= other.key()

    def __str__(self) -> str:
        return self.text
