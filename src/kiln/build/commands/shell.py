"""`kiln shell TARGET [COMMAND...]`: a shell (or COMMAND) in TARGET's build root, changes discarded on exit."""

from __future__ import annotations

import argparse

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("--runner", choices=["sandbox", "docker"], help="where the root is made (default sandbox)")
    parser.add_argument("target", metavar="TARGET")
    parser.add_argument("command", nargs="*", metavar="COMMAND", help="run this instead of an interactive bash")


def run(ctx: Context[Graph]) -> int:
    from kiln.build.session import Session, shell

    args = ctx.args
    graph = ctx.graph()
    graph.closure([args.target])
    return shell(Session.open(graph, args.runner), args.target, args.command or ["/bin/bash", "-i"])
