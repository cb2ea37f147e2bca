"""Where Kiln keeps its state on the host, and how a pkg.yaml path may be joined onto a host path.

A path from a pkg.yaml (a dependency's `from` and `to`, a finalize path, a source's
destination) names something inside a tree: a store entry, a build root, an output.
Kiln runs as root, so such a path must never reach a host path by plain joining:
`join_inside` refuses control characters and `..`, and resolves symlinks as if the
tree were `/` (like chroot), so the result always lies inside the tree.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kiln.core.errors import BuildError

MAX_SYMLINKS = 40  # as Linux's path walk allows


class PathEscape(BuildError):
    """A pkg.yaml path that could lead out of the tree it names, or cannot be resolved inside it."""


def cache_dir() -> Path:
    """The store and every other cache: $KILN_CACHE, else ~/.cache/kiln."""
    configured = os.environ.get("KILN_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kiln"


def spec_parts(spec_path: str, what: str = "path") -> list[str]:
    """The components of a pkg.yaml path; refuses control characters and `..`.

    Control characters (a newline above all) hide a `..` from whoever reads the spec or a
    log, and break every line- or option-based format a path may reach later (mount
    options, Dockerfiles, logs). Empty and `.` components are dropped, so `/a//./b/` is `a`, `b`.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in spec_path):
        raise PathEscape(f"{what} {spec_path!r} has a control character")
    parts = [p for p in spec_path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(f"{what} {spec_path!r} has a '..' component")
    return parts


def join_inside(root: Path, spec_path: str, *, follow_last: bool = True, what: str = "path") -> Path:
    """`root`/`spec_path` with every symlink resolved inside `root`, as chroot would.

    An absolute link target restarts at `root`, a `..` stops at it, so the result never
    leaves `root` and holds no symlink (but the last component when `follow_last` is
    false). Components that do not exist are kept as written. The tree must not change
    while this runs: callers use it on store entries and on roots no process runs in.
    """
    parts = spec_parts(spec_path, what)
    resolved: list[str] = []
    pending = list(reversed(parts))
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":  # only from a link target
            if resolved:
                resolved.pop()
            continue
        last = all(p in ("", ".") for p in pending)
        try:
            mode = os.lstat(root.joinpath(*resolved, name)).st_mode
        except (FileNotFoundError, NotADirectoryError):
            resolved.append(name)
            continue
        if stat.S_ISLNK(mode) and (follow_last or not last):
            links += 1
            if links > MAX_SYMLINKS:
                raise PathEscape(f"{what} {spec_path!r}: too many levels of symbolic links")
            target = os.readlink(root.joinpath(*resolved, name))
            if target.startswith("/"):
                resolved = []
            pending.extend(reversed(target.split("/")))
            continue
        resolved.append(name)
    return root.joinpath(*resolved)
