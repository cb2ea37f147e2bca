"""`kiln bootstrap`: the stage0 seed root made (debootstrap, or --from-tar PATH) and stored."""

from __future__ import annotations

import argparse

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)


def run(ctx: Context[Graph]) -> int:
    from kiln.build.session import Session

    session = Session.open(ctx.graph())
    key = session.bootstrap()
    print(f"stage0 {key}")
    return 0
