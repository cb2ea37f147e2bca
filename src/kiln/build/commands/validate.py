"""`kiln validate`: every pkg.yaml of the tree checked, all errors at once as file:line: message."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kiln.build.cache_keys import compute_keys
from kiln.core.errors import InputErrors, KilnError
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("--json", action="store_true", help="the result, or every error, as JSON")


def run(ctx: Context[Graph]) -> int:
    args = ctx.args
    try:
        graph = ctx.graph()
        compute_keys(graph)
    except KilnError as exc:
        if not args.json:
            raise
        errors = exc.errors if isinstance(exc, InputErrors) else [exc]
        print(json.dumps({"ok": False, "errors": [error_json(e) for e in errors]}, indent=2))
        return exc.exit_code
    if args.json:
        print(json.dumps({"ok": True, "platform": str(graph.tree.platform), "packages": len(graph.order)}, indent=2))
    else:
        print(f"ok: {len(graph.order)} packages valid for {graph.tree.platform}")
    return 0


def error_json(error: KilnError) -> dict[str, Any]:
    """One error as `--json` prints it: the file and line apart from the message."""
    where = error.location
    return {
        "file": where.file if where else None,
        "line": where.line if where and where.line else None,
        "message": error.message,
    }
