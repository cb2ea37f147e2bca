"""`kiln eval TARGET TEMPLATE`: a Jinja2 template rendered with TARGET's variables, as its pkg.yaml sees them."""

from __future__ import annotations

import argparse

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options
from kiln.pkg.template import render_string


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("target", metavar="TARGET")
    parser.add_argument("template", metavar="TEMPLATE")


def run(ctx: Context[Graph]) -> int:
    args = ctx.args
    graph = ctx.graph()
    if args.target not in graph.tree.packages:
        graph.closure([args.target])  # raises with a suggestion
    context = graph.tree.package_context(graph.tree.packages[args.target])
    print(render_string(args.template, context))
    return 0
