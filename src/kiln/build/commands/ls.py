"""`kiln ls`: the packages with their variant, version, what they need and their cache key."""

from __future__ import annotations

import argparse
import json

from kiln.build.cache_keys import compute_keys
from kiln.core import console
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(ctx: Context[Graph]) -> int:
    graph = ctx.graph()
    keys = compute_keys(graph)
    packages = graph.tree.packages
    if ctx.args.json:
        data = {
            name: {"variant": p.variant, "version": p.version, "needs": graph.edges[name], "key": keys[name]}
            for name, p in packages.items()
        }
        print(json.dumps(data, indent=2))
        return 0
    rows = [
        [name, p.variant, p.version or "-", ",".join(graph.edges[name]) or "-", keys[name][:12]]
        for name, p in packages.items()
    ]
    console.print_table(f"packages ({graph.tree.platform})", ["name", "variant", "version", "needs", "key"], rows)
    return 0
