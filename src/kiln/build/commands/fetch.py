"""`kiln fetch [TARGET...]`: the sources of TARGETs' closure (default: every package) downloaded and verified."""

from __future__ import annotations

import argparse
import json

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_selection_arguments, selected_packages


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable summary")


def run(ctx: Context[Graph]) -> int:
    from kiln.build.session import Session

    graph, names = selected_packages(ctx)
    fetched = Session.open(graph).fetch(names)
    if ctx.args.json:
        print(json.dumps({"fetched": fetched, "packages": names}, indent=2))
    else:
        print(f"fetched {fetched} source(s) for {len(names)} package(s)")
    return 0
