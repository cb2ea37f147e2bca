"""The one version of a release: what os-release, machined, init, the manifest, the SBOMs, the installer
tag and the ISO label all say.

It is set once, first found of: `--release-version` (or `--set kiln_version=`, its older spelling),
$KILN_VERSION, the project file's `version:`, the git describe of the project, Kiln's own version
(a tree outside git). Every such value must be a semantic version, because machines compare
versions to choose upgrades; a describe is turned into one that orders after its tag
(v1.4.0-3-gabc1234 -> 1.4.1-dev.3.gabc1234), with no '+', so the installer's registry tag is the
version unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kiln import __version__
from kiln.core.errors import InputError, Location
from kiln.core.gitstate import git
from kiln.core.semver import SEMVER

VERSION_ENV = "KILN_VERSION"
VERSION_VARIABLE = "kiln_version"
_DESCRIBE = re.compile(r"v?(?P<tag>\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)-(?P<distance>\d+)-g(?P<commit>[0-9a-f]+)")


def check(version: str, where: str, location: Location | None = None) -> str:
    if not SEMVER.fullmatch(version):
        raise InputError(
            f"{where}: {version!r} is not a semantic version (MAJOR.MINOR.PATCH with an optional -prerelease, "
            "such as 1.4.0 or 1.5.0-rc.1)",
            location,
        )
    return version


def from_describe(describe: str, *, dirty: bool) -> str | None:
    """`git describe --tags --long` output as a semantic version, or None when it names no X.Y.Z tag.

    On the tag itself: the tag (without its 'v'). After it: the next patch's `dev` prerelease with
    the distance and the commit (so it sorts after the tag and before the next release).
    """
    match = _DESCRIBE.fullmatch(describe)
    if not match:
        return None
    tag, distance, commit = match["tag"], int(match["distance"]), match["commit"]
    suffix = ".dirty" if dirty else ""
    if distance == 0:
        return tag + (f"{'.' if '-' in tag else '-'}dirty" if dirty else "")
    if "-" in tag:  # a prerelease tag: stay in its line (1.5.0-rc.1 -> 1.5.0-rc.1.dev.3.gabc)
        return f"{tag}.dev.{distance}.g{commit}{suffix}"
    major, minor, patch = (int(part) for part in tag.split("."))
    return f"{major}.{minor}.{patch + 1}-dev.{distance}.g{commit}{suffix}"


def git_version(root: Path) -> str | None:
    """The project's version from git: its newest X.Y.Z tag, or 0.0.0-dev.<commits>.g<commit> without
    one; None outside a git work tree (or without git)."""
    commit = git(root, "rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    dirty = bool(git(root, "status", "--porcelain", "--untracked-files=no"))
    describe = git(root, "describe", "--tags", "--long", "--abbrev=12", "--match", "*[0-9].[0-9]*.[0-9]*")
    version = from_describe(describe, dirty=dirty) if describe else None
    if version is not None:
        return version
    count = git(root, "rev-list", "--count", "HEAD") or "0"
    return f"0.0.0-dev.{count}.g{commit}{'.dirty' if dirty else ''}"


def release_version(
    root: Path,
    flag: str | None = None,
    overrides: dict[str, str] | None = None,
    project_version: str | None = None,
    project_location: Location | None = None,
) -> str:
    """The release version, from the first source that gives one (see the module's docstring)."""
    overrides = overrides or {}
    given = overrides.get(VERSION_VARIABLE)
    if flag is not None and given is not None and flag != given:
        raise InputError(
            f"--release-version {flag} and --set {VERSION_VARIABLE}={given} disagree: a release has one version"
        )
    if flag is not None:
        return check(flag, "--release-version")
    if given is not None:
        return check(given, f"--set {VERSION_VARIABLE}")
    env = os.environ.get(VERSION_ENV)
    if env:
        return check(env, f"${VERSION_ENV}")
    if project_version is not None:
        return check(project_version, "version", project_location)
    return git_version(root) or __version__
