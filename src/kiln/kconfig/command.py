"""`kiln kernel menuconfig|olddefconfig|savedefconfig`: the verb over kiln.kconfig.tool (arguments, output)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options
from kiln.pkg.variables import DEFAULT_PLATFORM, Platform, host_platform

ACTIONS = (
    ("menuconfig", "edit pkgs/kernel/config-ARCH interactively, then save it in savedefconfig form"),
    ("olddefconfig", "resolve config-ARCH (+ kernel_fragments) against the kernel source; write it back"),
    ("savedefconfig", "rewrite config-ARCH in minimal (savedefconfig) form"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="kernel_verb", metavar="ACTION", required=True)
    for action, text in ACTIONS:
        sub = actions.add_parser(action, help=text, description=text)
        add_tree_options(sub)
        sub.add_argument("--arch", choices=["amd64", "arm64"], help="which config (default: --platform's arch)")
        sub.add_argument("--output", metavar="FILE", help="also write the full resolved .config here")
        sub.add_argument("--json", action="store_true", help="what was written, as JSON")


def run(ctx: Context[Graph]) -> int:
    from kiln.build.session import Session
    from kiln.kconfig import tool

    args = ctx.args
    arch = args.arch or Platform.parse(args.platform or DEFAULT_PLATFORM).arch
    graph = ctx.graph(str(host_platform()))  # Kconfig is a host program: configured in the host's build root
    output = Path(args.output) if args.output else None
    result = tool.run(Session.open(graph), args.kernel_verb, arch, output)
    if args.json:
        written = str(result.written) if result.written is not None else None
        fields = {
            "arch": arch,
            "written": written,
            "changed": result.changed,
            "output": str(output) if output else None,
        }
        print(json.dumps(fields, indent=2))
        return 0
    if result.written is None:
        print("kernel_fragments is set: the main config was left as it is (fragments stay separate)")
    else:
        print(f"{'wrote' if result.changed else 'unchanged:'} {result.written}")
    if output is not None:
        print(f"full .config written to {output}")
    return 0
