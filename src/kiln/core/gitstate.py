"""What git says about the project's checkout: one way to ask it, and the commit a build came from.

Used for the release version (kiln.core.release_version) and an image's provenance
(kiln.image.provenance). A tree outside git, or a host without git, answers None: neither is an error.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

TIMEOUT = 30  # seconds: a git asked about a network file system may hang; it never takes this long here


def git(root: Path, *args: str) -> str | None:
    """`git -C root ARGS...`'s output, stripped; None when git is missing, fails or times out."""
    try:
        result = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False, timeout=TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@dataclass(frozen=True)
class Head:
    """The commit checked out, and whether the work tree differs from it."""

    commit: str  # the full hex object name
    dirty: bool  # a tracked file changed, or a file git does not ignore was added


def head(root: Path) -> Head | None:
    """The checkout at `root`; None outside a git work tree.

    Dirty counts untracked files that are not ignored too: a new pkg.yaml changes what is built
    as much as an edited one does.
    """
    commit = git(root, "rev-parse", "--verify", "HEAD")
    if commit is None:
        return None
    status = git(root, "status", "--porcelain")
    return Head(commit, dirty=status is None or bool(status))
