"""`kiln build TARGET...|--all`: TARGETs and what they need, built in parallel, stored keys skipped;
with --check, built again and compared with what is stored."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core import console
from kiln.core.errors import InputError
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_jobs_option, add_tree_options

if TYPE_CHECKING:
    from kiln.build.session import Session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("targets", nargs="*", metavar="TARGET")
    parser.add_argument("--all", action="store_true", help="build every package of the tree")
    add_jobs_option(parser)
    parser.add_argument("--no-cache", action="store_true", help="rebuild even what is stored (not stage0)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="build TARGETs again in a fresh root and compare with their stored outputs file by file; exit 1 "
        "when one differs (its files and diffoscope reports kept under $KILN_CACHE/check/)",
    )
    parser.add_argument("--deep", action="store_true", help="with --check: check every package TARGETs need too")
    parser.add_argument("--keep-going", "-k", action="store_true", help="after a failure, build what does not need it")
    parser.add_argument("--out", metavar="DIR", help="export each target's output to DIR/<name>/")
    parser.add_argument("--json", action="store_true", help="print a JSON summary of every package at the end")
    parser.add_argument(
        "--runner",
        choices=["sandbox", "docker", "buildkit"],
        help="where steps run (default sandbox, or the project's runner:): sandbox (bubblewrap), "
        "docker (an engine at DOCKER_HOST), "
        "buildkit (the graph as one Dockerfile)",
    )
    parser.add_argument("--cache-from", metavar="oci://HOST/REPO", help="pull needed entries from this registry first")
    parser.add_argument("--cache-to", metavar="oci://HOST/REPO", help="push the closure's entries to this registry")


def run(ctx: Context[Graph]) -> int:
    from kiln.build.session import Session, choose_progress, failures, outcome_json

    args = ctx.args
    graph = ctx.graph()
    if args.all == bool(args.targets):
        raise InputError("name TARGETs to build, or --all (not both)")
    targets = list(graph.order) if args.all else args.targets
    graph.closure(targets)  # unknown names fail here, with a suggestion
    session = Session.open(graph, args.runner)
    if args.check or args.deep:
        return check_build(session, targets, args)
    outcomes = session.build(
        targets,
        args.jobs,
        choose_progress(json_output=args.json),
        no_cache=args.no_cache,
        keep_going=args.keep_going,
        cache_from=args.cache_from,
        cache_to=args.cache_to,
    )
    failed = failures(outcomes)
    for outcome in failed:
        console.error(str(outcome.error))
    if args.out and not failed:
        session.export(targets, Path(args.out))
    if args.json:
        print(outcome_json(outcomes))
    return 1 if failed else 0


def check_build(session: Session, targets: list[str], args: argparse.Namespace) -> int:
    """kiln build --check [--deep]: 1 when a rebuild differs from what is stored."""
    from kiln.build.check import summary_line
    from kiln.build.session import choose_progress

    if args.no_cache or args.cache_to or args.out:
        raise InputError("--check compares rebuilds with the store: it takes no --no-cache, --cache-to or --out")
    checked = session.check(
        targets,
        deep=args.deep,
        jobs=args.jobs,
        progress=choose_progress(json_output=args.json),
        say=lambda line: console.say_line(f"kiln check: {line}"),
    )
    if args.json:
        print(json.dumps({"packages": {c.name: c.as_json() for c in checked}}, indent=2))
    else:
        for result in checked:
            print(summary_line(result))
    return 0 if all(c.same for c in checked) else 1
