"""`kiln dump [TARGET...]`: the rendered, canonical spec of every package (or of TARGETs' closure)."""

from __future__ import annotations

import argparse
import json

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_selection_arguments, selected_packages
from kiln.pkg.show import dump_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="JSON instead of YAML")


def run(ctx: Context[Graph]) -> int:
    graph, names = selected_packages(ctx)
    data = {name: graph.tree.packages[name].canonical() for name in names}
    if ctx.args.json:
        print(json.dumps(data, indent=2))
    else:
        print(dump_yaml(data), end="")
    return 0
