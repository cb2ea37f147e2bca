"""`kiln log TARGET`: TARGET's last build log, as the builder kept it."""

from __future__ import annotations

import argparse
import sys

from kiln.core.errors import InputError
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("target", metavar="TARGET")


def run(ctx: Context[Graph]) -> int:
    from kiln.build.builder import logs_dir
    from kiln.build.store import Store
    from kiln.core.paths import cache_dir

    target = ctx.args.target
    last = logs_dir(Store(cache_dir())) / target / "last.log"
    if not last.exists():
        raise InputError(f"no build log for '{target}' (build it first)")
    sys.stdout.write(last.read_text(errors="replace"))
    return 0
