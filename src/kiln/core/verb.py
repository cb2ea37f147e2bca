"""What a verb gets: every command module has `add_arguments(parser)` and `run(ctx) -> int`.

`kiln.cli` parses the command line, finds the project and makes one `Context` for the verb's
`run`. The package graph is loaded only when a verb asks for it (`ctx.graph()`), for the platform it
names or else --platform's; a verb that reads no package tree never pays for loading one. The graph
type is a parameter because `core` knows no room above it: tree verbs take a `Context[Graph]`, the
others a `Context[object]`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kiln.core.project import Project

G = TypeVar("G", covariant=True)


@dataclass(frozen=True)
class Context(Generic[G]):
    """The parsed options, the project they were completed from, the graph loader and the whole parser."""

    args: argparse.Namespace
    project: Project
    loader: Callable[[str | None], G]
    parser: argparse.ArgumentParser  # what `kiln completion` makes its scripts from

    def graph(self, platform: str | None = None) -> G:
        """The package graph for `platform` (a platform such as linux/arm64), else --platform's, else the
        default platform: every tree of --pkgs, --set's variables, the release version, --from-tar's seed."""
        return self.loader(platform)


def generate_action(
    parser: argparse.ArgumentParser, dest: str, text: str, doc: str, dir_help: str
) -> tuple[argparse._SubParsersAction[argparse.ArgumentParser], argparse.ArgumentParser]:
    """The ACTION subcommands of a verb that makes secrets into a directory, and their first,
    `generate DIR`: `kiln keys` and `kiln secrets` take the same shape, so their help reads alike."""
    actions = parser.add_subparsers(dest=dest, metavar="ACTION", required=True)
    generate = actions.add_parser("generate", help=text, description=f"{text} ({doc})")
    generate.add_argument("dir", metavar="DIR", help=dir_help)
    return actions, generate
