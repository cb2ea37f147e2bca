"""Command line: argument parsing and dispatch only."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from kiln import __version__, console
from kiln.build.keys import compute_keys
from kiln.errors import InputErrors, KilnError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.show import GRAPH_FORMATS, dump_yaml, render_graph
from kiln.pkg.template import render_string
from kiln.pkg.variables import Platform, parse_overrides

Handler = Callable[[argparse.Namespace], int]


def _load(args: argparse.Namespace) -> Graph:
    tree: Tree = load_tree(Path(args.pkgs), Platform.parse(args.platform), parse_overrides(args.set))
    return Graph(tree)


def cmd_validate(args: argparse.Namespace) -> int:
    graph = _load(args)
    compute_keys(graph)
    print(f"ok: {len(graph.order)} packages valid for {graph.tree.platform}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    graph = _load(args)
    keys = compute_keys(graph)
    packages = graph.tree.packages
    if args.json:
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


def cmd_graph(args: argparse.Namespace) -> int:
    graph = _load(args)
    names = graph.closure(args.targets) if args.targets else graph.order
    keys = compute_keys(graph) if args.keys else None
    print(render_graph(graph, names, args.format, keys))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    graph = _load(args)
    if args.target not in graph.tree.packages:
        graph.closure([args.target])  # raises with a suggestion
    context = graph.tree.package_context(graph.tree.packages[args.target])
    print(render_string(args.template, context))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    graph = _load(args)
    names = graph.closure(args.targets) if args.targets else graph.order
    data = {name: graph.tree.packages[name].canonical() for name in names}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(dump_yaml(data), end="")
    return 0


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--pkgs", default="pkgs", metavar="DIR", help="package tree (default: ./pkgs)")
    common.add_argument(
        "--platform", default="linux/amd64", help="target platform: linux/amd64 (default) or linux/arm64"
    )
    common.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a template variable (string value); repeatable, wins over vars.yaml",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln",
        description="Build minimal, immutable Linux images from a declarative package graph.",
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    common = _common()

    def verb(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    verb("validate", cmd_validate, "check every pkg.yaml of the tree; print all errors as file:line: message")
    ls = verb("ls", cmd_ls, "list packages with variant, version, what they need and their cache key")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    graph = verb("graph", cmd_graph, "print the dependency graph (build order), optionally of TARGETs only")
    graph.add_argument("targets", nargs="*", metavar="TARGET", help="limit to these packages and their needs")
    graph.add_argument("--format", choices=GRAPH_FORMATS, default="dot", help="output format (default: dot)")
    graph.add_argument("--keys", action="store_true", help="label nodes with their cache keys")
    ev = verb("eval", cmd_eval, "render a Jinja2 template with TARGET's variables, e.g. kiln eval musl '{{ target }}'")
    ev.add_argument("target", metavar="TARGET")
    ev.add_argument("template", metavar="TEMPLATE")
    dump = verb("dump", cmd_dump, "print the rendered, canonical spec of every package (or of TARGETs)")
    dump.add_argument("targets", nargs="*", metavar="TARGET")
    dump.add_argument("--json", action="store_true", help="JSON instead of YAML")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except InputErrors as exc:
        for err in exc.errors:
            console.error(str(err))
        console.error(f"{len(exc.errors)} error(s)")
        return exc.exit_code
    except KilnError as exc:
        console.error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        console.error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
