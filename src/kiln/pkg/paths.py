"""Whole-string checks of the paths a pkg.yaml names, done in code as well as in the schema.

The schema's patterns are one line of defence; these checks are the other, on the
model Kiln builds from: every path-like field is refused if it holds a control
character (a newline hides a second path in a log or an argv), a `..` component,
the wrong kind of start (absolute or relative), or, for dependency mounts, ':' or
',' (they end up in overlayfs `lowerdir=` options, where they separate values).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from kiln.core.errors import InputError, Location

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(value: object, *, absolute: bool, mount: bool = False) -> str | None:
    """Why `value` is not an acceptable path, or None when it is."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if _CONTROL.search(value):
        return "must not contain control characters"
    if absolute != value.startswith("/"):
        return "must be an absolute path" if absolute else "must be a relative path"
    if ".." in value.split("/"):
        return "must not contain '..'"
    if mount and (":" in value or "," in value):
        return "must not contain ':' or ',' (it becomes an overlay mount option)"
    return None


def name_problem(value: object) -> str | None:
    """Package names become directory names and keys: no separators, dots-only or control characters."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if _CONTROL.search(value) or "/" in value or value in (".", ".."):
        return "must be a plain name without '/', control characters or dots only"
    return None


def check(value: object, field: str, location: Location, *, absolute: bool, mount: bool = False) -> None:
    """Raise InputError at `location` when `value` is not an acceptable path."""
    problem = path_problem(value, absolute=absolute, mount=mount)
    if problem:
        raise InputError(f"{field} {problem}, not {value!r}", location)


def contained(root: Path, relative: str) -> Path:
    """`root / relative`, refused unless it stays inside root (lexically, without following links)."""
    problem = path_problem(relative, absolute=False)
    if problem:
        raise InputError(f"path {problem}, not {relative!r}")
    joined = Path(os.path.normpath(root / PurePosixPath(relative)))
    base = Path(os.path.normpath(root))
    if joined != base and base not in joined.parents:
        raise InputError(f"path {relative!r} leaves {str(root)!r}")
    return joined
