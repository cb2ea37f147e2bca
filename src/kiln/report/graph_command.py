"""`kiln graph [TARGET...]`: the dependency graph in build order, as text (kiln.pkg.show) or as a picture."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.build.cache_keys import compute_keys
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_selection_arguments, selected_packages
from kiln.pkg.show import GRAPH_FORMATS, render_graph
from kiln.report.graph import PICTURE_FORMATS, draw_graph
from kiln.report.output import write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser, "limit to these packages and their needs")
    parser.add_argument(
        "--format",
        choices=GRAPH_FORMATS + PICTURE_FORMATS,
        default="dot",
        help="output format (default: dot); svg and png are drawn by Graphviz's dot",
    )
    parser.add_argument("-o", "--out", metavar="FILE", help="write to FILE instead of stdout (a png must go to a file)")
    parser.add_argument("--json", action="store_const", dest="format", const="json", help="the same as --format json")
    parser.add_argument("--keys", action="store_true", help="label nodes with their cache keys")


def run(ctx: Context[Graph]) -> int:
    args = ctx.args
    graph, names = selected_packages(ctx)
    keys = compute_keys(graph) if args.keys else None
    out = Path(args.out) if args.out else None
    if args.format in PICTURE_FORMATS:
        write(draw_graph(graph, names, args.format, keys), out, args.format)
    elif out is not None:
        out.write_text(render_graph(graph, names, args.format, keys) + "\n")
    else:
        print(render_graph(graph, names, args.format, keys))
    return 0
