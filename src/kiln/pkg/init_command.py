"""`kiln init --extension NAME DIR`: an extension project started (kiln.pkg.scaffold writes it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln import __version__
from kiln.core.console import say_line
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options, package_trees


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("directory", metavar="DIR", help="where to write the project (absent or empty)")
    parser.add_argument("--extension", required=True, metavar="NAME", help="the extension package's name")
    parser.add_argument(
        "--kind",
        choices=("service", "module"),
        default="service",
        help="service: a static program machined supervises (default); module: an out-of-tree kernel module",
    )
    parser.add_argument("--author", default="me", help="the extension's author, for its manifest")


def run(ctx: Context[Graph]) -> int:
    from kiln.pkg.scaffold import create_extension

    args = ctx.args
    directory = Path(args.directory)
    stock = package_trees(args)[0]
    written = create_extension(args.extension, directory, stock, args.kind, args.author, __version__)
    for path in written:
        print(path)
    say_line(
        f"kiln init: extension project {args.extension} in {directory}; next: cd {directory} && "
        f"kiln extension build {args.extension}"
    )
    return 0
