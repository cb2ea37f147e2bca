"""`kiln schematic id FILE`: a schematic checked and named, without building anything.

The ID is what `kiln image --schematic` records and what a factory serves images under, so a
release engineer can compute it (and see the canonical form it hashes) before anything is built.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.core.verb import Context
from kiln.image import schematic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "check a schematic (extensions, kernel arguments, machine config; docs/factory.md) and print its ID, "
        "the sha256 of its canonical form"
    )
    parser.add_argument("action", choices=("id",), help="id: check FILE and print its ID")
    parser.add_argument("file", type=Path, metavar="FILE", help="the schematic (YAML or JSON); - for standard input")
    parser.add_argument("--json", action="store_true", help="the ID and the canonical form, as JSON")


def run(ctx: Context[object]) -> int:
    args = ctx.args
    if str(args.file) == "-":
        loaded = schematic.parse(sys.stdin.read(schematic.MAX_BYTES + 1), "<stdin>")
    else:
        loaded = schematic.load(args.file)
    if args.json:
        print(json.dumps({"id": loaded.id, "schematic": loaded.fields}, indent=2, sort_keys=True))
    else:
        print(loaded.id)
    return 0
