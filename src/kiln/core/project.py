"""The project: its root (found by walking up, as cargo does) and its file, kiln-project.yaml.

The file holds a project's defaults, so a team writes them once instead of in every command:
`version` (the release version), `jobs`, `runner`, `cache_from`, `cache_to`, `profiles` (what
`kiln image` builds when it names none), `pkgs` (the package trees, in order, relative to the
project: an extension's project names the stock tree and its own) and `mirrors` (read by
kiln.build.sources.mirrors). A flag
given on the command line wins over the file; the environment wins where it has a variable
(KILN_VERSION, KILN_MIRRORS).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core import console
from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.schema import suggest
from kiln.core.yamlfile import Positioned, read_yaml_file

PROJECT_FILE = "kiln-project.yaml"
# its name before machines' config files took "kiln.yaml" (docs/machine-config.md); still read
LEGACY_PROJECT_FILE = "kiln.yaml"
PACKAGE_TREE = "pkgs"
PROFILES_DIR = "profiles"
RUNNERS = ("sandbox", "docker", "buildkit")
# What a flag left unset takes when the project file does not say either.
BUILTIN_DEFAULTS: dict[str, object] = {"jobs": 2, "runner": "sandbox", "cache_from": None, "cache_to": None}


def find_root(start: Path) -> Path:
    """The nearest directory at or above `start` holding kiln-project.yaml, else one holding pkgs/;
    `start` itself when neither is found (so a missing tree is reported where the user stands)."""
    start = start.resolve()
    candidates = [start, *start.parents]
    for directory in candidates:
        if (directory / PROJECT_FILE).is_file():
            return directory
    for directory in candidates:
        if (directory / PACKAGE_TREE).is_dir():
            return directory
    return start


def project_file(root: Path) -> Path | None:
    """kiln-project.yaml in root, else the legacy kiln.yaml (with a word on stderr), else None."""
    path = root / PROJECT_FILE
    if path.is_file():
        return path
    legacy = root / LEGACY_PROJECT_FILE
    if legacy.is_file():
        console.warning(
            f"kiln: {legacy} is read as the project file; rename it {PROJECT_FILE} "
            f"({LEGACY_PROJECT_FILE} is the name of a machine's config)"
        )
        return legacy
    return None


@dataclass(frozen=True)
class Project:
    """A project's root and the settings its file gives (None: not set there)."""

    root: Path
    file: Path | None = None
    version: str | None = None
    jobs: int | None = None
    runner: str | None = None
    cache_from: str | None = None
    cache_to: str | None = None
    profiles: tuple[str, ...] = ()
    pkgs: tuple[str, ...] = ()
    positions: Positioned = field(default_factory=lambda: Positioned({}, {}), compare=False, repr=False)

    def location(self, key: str) -> Location | None:
        return Location(str(self.file), self.positions.line((key,))) if self.file else None


_CHECKS: dict[str, tuple[type, str]] = {
    "version": (str, "a string such as 1.4.0"),
    "jobs": (int, "a number of packages built at once"),
    "runner": (str, f"one of {', '.join(RUNNERS)}"),
    "cache_from": (str, "a registry reference such as oci://HOST/REPO"),
    "cache_to": (str, "a registry reference such as oci://HOST/REPO"),
    "profiles": (list, "a list of profile names"),
    "pkgs": (list, "a list of package tree directories, relative to the project, the stock tree first"),
    "mirrors": (list, "a list of mirrors (or null for none)"),
}


def _problem(key: object, value: object) -> str | None:
    """What is wrong with one setting, or None."""
    if key not in _CHECKS:
        return f"unknown setting {key!r}{suggest(str(key), set(_CHECKS))}"
    kind, wanted = _CHECKS[str(key)]
    if value is None and key == "mirrors":
        return None  # null: no mirrors (kiln.build.sources.mirrors reads it)
    if not isinstance(value, kind) or isinstance(value, bool):
        return f"{key} must be {wanted}, not {value!r}"
    if key == "jobs" and isinstance(value, int) and value < 1:
        return f"jobs must be at least 1, not {value}"
    if key == "runner" and value not in RUNNERS:
        return f"runner must be {wanted}, not {value!r}"
    if key in ("profiles", "pkgs") and not all(isinstance(item, str) and item for item in value):  # type: ignore[attr-defined]
        return f"{key} must be {wanted}"
    return None


def load_project(root: Path) -> Project:
    """The project at root: its file's settings, each checked (all errors at once, at their lines)."""
    path = project_file(root)
    if path is None:
        return Project(root)
    positioned = read_yaml_file(path, what=path.name)
    data = positioned.value
    if data is None:
        return Project(root, path, positions=positioned)
    if not isinstance(data, dict):
        raise InputError(f"{path.name} must be a mapping (for example 'jobs: 2')", Location(str(path), 1))
    errors: list[KilnError] = []
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = Location(str(path), positioned.line((key,)))
        if key == "version" and isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # `version: 2` is meant as text; the release check says if it is not semver
        problem = _problem(key, value)
        if problem:
            errors.append(InputError(problem, where))
        elif value is not None:
            values[key] = value
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)
    values.pop("mirrors", None)
    values["profiles"] = tuple(values.get("profiles", ()))
    values["pkgs"] = tuple(values.get("pkgs", ()))
    return Project(root, path, positions=positioned, **values)


def current() -> Project:
    """The project around the working directory."""
    return load_project(find_root(Path(os.getcwd())))


def fill_options(args: argparse.Namespace, project: Project) -> None:
    """Fill what the command line left unset: from the project's file, then the built-in defaults. The
    package trees (--pkgs) and the profiles directory (--profiles-dir) are the project's."""
    if args.pkgs is None:
        args.pkgs = [str(project.root / tree) for tree in project.pkgs] or [str(project.root / PACKAGE_TREE)]
    if getattr(args, "profiles_dir", "") is None:
        args.profiles_dir = str(project.root / PROFILES_DIR)
    for name, builtin in BUILTIN_DEFAULTS.items():
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, getattr(project, name) or builtin)
