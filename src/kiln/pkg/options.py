"""The options of every verb that reads the package tree, and the graph they name.

The root parser holds them with their defaults, so they may come before the verb (`kiln --pkgs DIR
build`); each verb that reads the tree adds them again with no default (`add_tree_options(parser)`
first in its add_arguments, or on each action that reads it), so one given after the verb wins and
one given before it is not reset.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.core.console import PROGRESS_ENV, PROGRESS_MODES
from kiln.core.project import Project
from kiln.core.release_version import VERSION_ENV, VERSION_VARIABLE, release_version
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.variables import DEFAULT_PLATFORM, Platform, parse_overrides


def add_jobs_option(parser: argparse.ArgumentParser) -> None:
    """--jobs/-j of every verb that builds packages (kiln.core.project.fill_options gives its default)."""
    parser.add_argument(
        "--jobs", "-j", type=int, metavar="N", help="packages built at once (default 2, or the project's jobs:)"
    )


def add_profiles_dir_option(parser: argparse.ArgumentParser) -> None:
    """--profiles-dir of every verb that takes profile names (fill_options gives the project's)."""
    parser.add_argument(
        "--profiles-dir", metavar="DIR", help="where profile names are looked up (default: the project's profiles/)"
    )


def add_keys_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--keys DIR of every verb that signs with a key directory (kiln keys generate makes one)."""
    parser.add_argument("--keys", type=Path, metavar="DIR", help=help)


def add_schematic_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--schematic FILE of every verb that customises profiles with a schematic (kiln.image.schematic)."""
    parser.add_argument("--schematic", type=Path, metavar="FILE", help=help)


def add_tree_options(parser: argparse.ArgumentParser, *, defaults: bool = False) -> None:
    """--pkgs, --platform, --set, --release-version, --progress and --from-tar: with their defaults on the
    root parser, with none (argparse.SUPPRESS) on a verb."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--pkgs",
        action="append",
        default=default(None),
        metavar="DIR",
        help="package tree (default: the project's `pkgs` setting, else its pkgs/; the project is the nearest "
        "directory up holding kiln-project.yaml, else pkgs/); repeat it to load several trees as one, the "
        "stock tree first (an extension author's tree after it)",
    )
    parser.add_argument(
        "--platform",
        default=default(None),
        help="target platform: linux/amd64 (default; for kiln image, the profiles' arch) or linux/arm64; "
        "kiln image and kiln release push take a comma-separated list (linux/amd64,linux/arm64)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=default([]),
        metavar="KEY=VALUE",
        help="override a template variable (string value); repeatable, wins over vars.yaml",
    )
    parser.add_argument(
        "--release-version",
        default=default(None),
        metavar="VERSION",
        help=f"the release's one version (os-release, machined, manifests, SBOMs, installer tag, ISO label); "
        f"default ${VERSION_ENV}, the project's version:, else the git describe of the project",
    )
    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default=default(None),
        help=f"how builds show progress: auto (a live view on a terminal, else lines; default, or ${PROGRESS_ENV}), "
        "plain (lines) or tty (the live view even into a pipe)",
    )
    parser.add_argument(
        "--from-tar",
        default=default(None),
        metavar="PATH",
        help="use this root tarball or OCI archive as stage0 instead of debootstrap",
    )


def add_selection_arguments(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The tree options and an optional TARGET... of a verb that reads part of the tree (Graph.selected)."""
    add_tree_options(parser)
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=help)


def selected_packages(ctx: Context[Graph]) -> tuple[Graph, list[str]]:
    """The graph and the packages the TARGET... of add_selection_arguments names, read where that
    argument is made, for the verbs that take it."""
    graph = ctx.graph()
    return graph, graph.selected(ctx.args.targets)


def package_trees(args: argparse.Namespace) -> list[Path]:
    """The --pkgs trees in order (kiln.cli.apply_project has filled in the project's)."""
    return [Path(tree) for tree in args.pkgs]


def overrides(args: argparse.Namespace, project: Project) -> dict[str, str]:
    """--set's variables, with kiln_version set to the release's one version (core.release_version)."""
    values = parse_overrides(args.set)
    values[VERSION_VARIABLE] = release_version(
        project.root, args.release_version, values, project.version, project.location("version")
    )
    return values


def load_graph(args: argparse.Namespace, project: Project, platform: str | None) -> Graph:
    """The graph of the --pkgs trees for `platform`, else --platform's, else the default platform."""
    from_tar = Path(args.from_tar) if args.from_tar else None
    target = Platform.parse(platform or args.platform or DEFAULT_PLATFORM)
    tree: Tree = load_tree(package_trees(args), target, overrides(args, project), from_tar)
    return Graph(tree)
