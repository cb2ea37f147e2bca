"""Load a pkgs/ tree: find pkg.yaml files, render, parse, validate, check references.

All errors of a tree are collected and raised together, so a user fixes them in
one pass instead of one run per mistake.

Several trees load as one (`--pkgs STOCK --pkgs MINE`): an extension author's tree beside the
stock one. Each package keeps its own tree for its local sources and per-directory vars; a
package name or a vars.yaml variable defined by two trees is an error naming both places, and
only the first tree may define the seed (stage0.yaml).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.yamlfile import parse_text, read_text_file
from kiln.pkg.model import Package
from kiln.pkg.stage0 import Stage0, load_stage0
from kiln.pkg.template import Rendered, render
from kiln.pkg.variables import Platform, builtins, host_platform, load_vars_file

PKG_FILE = "pkg.yaml"
VARS_FILE = "vars.yaml"
STAGE0_FILE = "stage0.yaml"


@dataclass
class Tree:
    """Every package of a pkgs/ directory, rendered for one platform."""

    root: Path
    platform: Platform
    variables: dict[str, Any]
    overrides: dict[str, str] = field(default_factory=dict)
    packages: dict[str, Package] = field(default_factory=dict)
    stage0: Stage0 = field(default_factory=Stage0)
    build_platform: Platform | None = None  # the machine that builds; None: the target itself (native)
    native: Tree | None = None  # a cross tree with tool packages: the build machine's own tree, for them
    extra_roots: list[Path] = field(default_factory=list)  # the trees after the first, in --pkgs order

    @property
    def roots(self) -> list[Path]:
        """Every package tree, in --pkgs order."""
        return [self.root, *self.extra_roots]

    def root_of(self, package: Package) -> Path:
        """The tree that holds the package's pkg.yaml (trees never nest, so there is one)."""
        return next((root for root in self.extra_roots if package.file.is_relative_to(root)), self.root)

    def project_root_of(self, package: Package) -> Path:
        """Where the package's local sources are resolved: the directory holding its tree."""
        return self.root_of(package).parent

    @property
    def builder_platform(self) -> Platform:
        """The platform build roots run as: the target's own, or the host's for a cross build."""
        return self.build_platform or self.platform

    @property
    def cross(self) -> bool:
        return self.builder_platform != self.platform

    def tools(self) -> list[str]:
        """Packages that run on the build machine (`tool: true`): a cross build takes their native builds."""
        return [name for name, package in self.packages.items() if package.spec.get("tool") is True]

    def native_tool(self, name: str) -> bool:
        """Is `name` a tool that this (cross) tree takes from the build machine's native tree?"""
        return self.native is not None and name in self.native.packages and name in self.tools()

    @property
    def project_root(self) -> Path:
        """Where local sources are resolved: the directory holding pkgs/."""
        return self.root.parent

    @property
    def toolchain(self) -> str:
        """Name of the package `variant: toolchain` packages build with."""
        return str(self.variables.get("toolchain", "toolchain"))

    def package_context(self, package: Package) -> dict[str, Any]:
        """The variables a package's template saw."""
        return package_variables(self.root_of(package), package.directory, self.variables, self.overrides)


def find_package_files(root: Path) -> list[Path]:
    """Every pkg.yaml under root, skipping hidden directories, in a stable order."""
    found = []
    pending = [str(root)]
    while pending:  # iterative: a hostile tree may nest directories deeper than Python's recursion limit
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # as os.walk: an unreadable directory holds no packages
        for entry in entries:
            if entry.name == PKG_FILE and not entry.is_dir(follow_symlinks=False):
                found.append(Path(entry.path))
            elif not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return sorted(found)


def package_variables(
    root: Path, directory: Path, tree_vars: dict[str, Any], overrides: dict[str, str]
) -> dict[str, Any]:
    """Tree variables, overlaid by the package directory's vars.yaml; --set wins over both."""
    local = directory / VARS_FILE
    if directory == root or not os.path.lexists(local):
        return tree_vars
    return {**tree_vars, **load_vars_file(local, within=root), **overrides}


def load_package(file: Path, context: dict[str, Any], root: Path | None = None) -> Package:
    """Render, parse and schema-check one pkg.yaml; raises InputError(s).

    With `root`, a pkg.yaml that links outside the tree is refused.
    """
    source = read_text_file(file, what=PKG_FILE, within=root)
    rendered: Rendered = render(source, file, context)
    where = str(file)
    positioned = parse_text(rendered.text, where, rendered.template_line)
    spec = positioned.value
    if not isinstance(spec, dict):
        raise InputError("pkg.yaml must be a mapping with at least 'name'", Location(where, 1))
    problems = schema.validate(spec)
    if problems:
        raise InputErrors(
            [InputError(msg, Location(where, rendered.template_line(positioned.line(path)))) for path, msg in problems]
        )
    package = Package.from_spec(spec, file, positioned, rendered.template_line)
    if package.steps and not package.finalize:
        raise InputError(
            f"package '{package.name}' has steps but no finalize: say what its output is",
            Location(where, package.line(("steps",))),
        )
    return package


def load_tree(
    root: Path | Sequence[Path],
    platform: Platform,
    overrides: dict[str, str] | None = None,
    stage0_tar: Path | None = None,
    build: Platform | None = None,
) -> Tree:
    """Load and check a whole tree (or several, in order, as one); raises InputErrors listing every problem.

    `stage0_tar` (--from-tar) replaces the seed definition with a user's root tarball.
    `build` is the machine that builds (default: this host); when it is not `platform`,
    the tree is a cross build: its seed runs as `build` and compiles for `platform`.
    """
    roots = _checked_roots([root] if isinstance(root, Path) else list(root))
    root = roots[0]
    overrides = overrides or {}
    errors: list[KilnError] = []
    build = build or host_platform()
    variables: dict[str, Any] = builtins(platform, build)
    errors.extend(_load_tree_vars(roots, variables))
    variables.update(overrides)
    tree = Tree(root, platform, variables, dict(overrides), build_platform=build, extra_roots=roots[1:])
    try:
        tree.stage0 = load_stage0(root / STAGE0_FILE, stage0_tar)
    except InputErrors as exc:
        errors.extend(exc.errors)
    except KilnError as exc:
        errors.append(exc)
    errors.extend(
        InputError(
            f"only the first package tree ({root}) may define the seed; this one is tree {index + 2}",
            Location(str(extra / STAGE0_FILE), 1),
        )
        for index, extra in enumerate(roots[1:])
        if os.path.lexists(extra / STAGE0_FILE)
    )
    files = [(tree_root, file) for tree_root in roots for file in find_package_files(tree_root)]
    if not files:
        raise InputError(f"no {PKG_FILE} found under {', '.join(repr(str(r)) for r in roots)}")
    first_seen: dict[str, Package] = {}
    broken: set[str] = set()
    for tree_root, file in files:
        try:
            context = package_variables(tree_root, file.parent, variables, tree.overrides)
            package = load_package(file, context, tree_root)
        except KilnError as exc:
            errors.extend(exc.errors if isinstance(exc, InputErrors) else [exc])
            broken.update(_readable_name(file))
            continue
        if package.name in first_seen:
            other = first_seen[package.name]
            errors.append(
                InputError(
                    f"duplicate package name '{package.name}' (also defined at "
                    f"{Location(str(other.file), other.line(('name',)))})"
                    + ("" if tree.root_of(other) == tree_root else "; each name may be defined by one package tree"),
                    Location(str(file), package.line(("name",))),
                )
            )
            continue
        first_seen[package.name] = package
    tree.packages = dict(sorted(first_seen.items()))
    errors.extend(check_references(tree, broken))
    if errors:
        raise InputErrors(errors)
    if tree.cross:
        _prepare_cross(tree, stage0_tar)
    return tree


def _checked_roots(roots: list[Path]) -> list[Path]:
    """The trees, resolved: each a directory, none twice, none inside another."""
    if not roots:
        raise InputError("no package tree given (use --pkgs DIR)")
    resolved: list[Path] = []
    for given in roots:
        path = given.resolve()
        if not path.is_dir():
            raise InputError(f"package tree {str(given)!r} is not a directory (use --pkgs DIR)")
        for earlier in resolved:
            if path == earlier or path.is_relative_to(earlier) or earlier.is_relative_to(path):
                raise InputError(f"package trees {str(earlier)!r} and {str(path)!r} overlap: give each tree once")
        resolved.append(path)
    return resolved


def _load_tree_vars(roots: list[Path], variables: dict[str, Any]) -> list[KilnError]:
    """Each tree's vars.yaml into `variables`; a later tree may add variables, not change one."""
    errors: list[KilnError] = []
    set_by: dict[str, Path] = {}
    for root in roots:
        file = root / VARS_FILE
        try:
            loaded = load_vars_file(file, within=root) if os.path.lexists(file) else {}
        except KilnError as exc:
            errors.append(exc)
            continue
        for name, value in loaded.items():
            if name in set_by:
                errors.append(
                    InputError(
                        f"variable '{name}' is already set by {set_by[name]}; a later package tree may add "
                        "variables but not change one (use --set to override it)",
                        Location(str(file), _line_of(file, name)),
                    )
                )
                continue
            set_by[name] = file
            variables[name] = value
    return errors


def _line_of(file: Path, name: str) -> int:
    """The line where a top-level key is set in a YAML file (1 when not found as a plain key)."""
    pattern = re.compile(rf"^['\"]?{re.escape(name)}['\"]?[ \t]*:", re.MULTILINE)
    match = pattern.search(file.read_text(errors="replace"))
    return match.string.count("\n", 0, match.start()) + 1 if match else 1


def _prepare_cross(tree: Tree, stage0_tar: Path | None) -> None:
    """A cross tree: refuse what cannot be cross-built; load the build machine's tree for the tools."""
    refused = refuse_cross(tree)
    if refused:
        raise InputErrors(refused)
    if tree.tools():
        build = tree.builder_platform
        tree.native = load_tree(tree.roots, build, tree.overrides, stage0_tar, build=build)


def refuse_cross(tree: Tree) -> list[KilnError]:
    """Packages that say `cross: false` cannot be built for another arch than the build machine's."""
    return [
        InputError(
            f"package '{package.name}' cannot be cross-built (cross: false): build {tree.platform} on a "
            f"{tree.platform.arch} machine, not on this {tree.builder_platform.arch} one",
            Location(str(package.file), package.line(("cross",))),
        )
        for package in tree.packages.values()
        if package.spec.get("cross") is False
    ]


_NAME_LINE = re.compile(r"^name:[ \t]*(['\"]?)([a-z0-9][a-z0-9._+-]*)\1[ \t]*(?:#.*)?$", re.MULTILINE)


def _readable_name(file: Path) -> set[str]:
    """The name a package that failed to load declares, when a plain `name:` line gives it.

    Its dependents then get no second, misleading 'unknown dependency' error.
    """
    try:
        source = read_text_file(file, what=PKG_FILE, within=file.parent)
    except KilnError:
        return set()
    match = _NAME_LINE.search(source)
    return {match.group(2)} if match else set()


def check_references(tree: Tree, broken: set[str] | None = None) -> list[KilnError]:
    """Unknown dependencies and a missing toolchain package.

    Names in `broken` belong to packages that exist but failed to load: their own
    errors are reported, so dependents are not told the package is unknown.
    """
    errors: list[KilnError] = []
    names = set(tree.packages)
    known = names | (broken or set())
    for package in tree.packages.values():
        for index, dep in enumerate(package.dependencies):
            if dep.stage not in known:
                errors.append(
                    InputError(
                        f"unknown dependency '{dep.stage}'{schema.suggest(dep.stage, names)}",
                        Location(str(package.file), package.line(("dependencies", index, "stage"))),
                    )
                )
        if package.variant == "toolchain" and tree.toolchain not in known:
            errors.append(
                InputError(
                    f"variant 'toolchain' builds on package '{tree.toolchain}' (the 'toolchain' variable), "
                    "which is not in the tree; add it or use variant stage0 or scratch",
                    Location(str(package.file), package.line(("variant",)) if "variant" in package.spec else 1),
                )
            )
        if package.name == tree.toolchain and package.variant == "toolchain":
            errors.append(
                InputError(
                    f"the toolchain package '{package.name}' cannot build on itself: use variant stage0",
                    Location(str(package.file), package.line(("variant",)) if "variant" in package.spec else 1),
                )
            )
    return errors
