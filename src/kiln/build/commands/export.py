"""`kiln export dockerfile TARGET... --out DIR`: the graph as a multi-stage Dockerfile and its build context."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="export_kind", metavar="KIND", required=True)
    dockerfile = kinds.add_parser(
        "dockerfile",
        help="a multi-stage Dockerfile and build context for TARGETs' closure",
        description="a multi-stage Dockerfile (one stage per package) and its build context, for BuildKit",
    )
    add_tree_options(dockerfile)
    dockerfile.add_argument("targets", nargs="+", metavar="TARGET")
    dockerfile.add_argument("--out", required=True, metavar="DIR", help="context directory (emptied first)")
    dockerfile.add_argument(
        "--stage0",
        choices=["image", "tar"],
        default="image",
        help="seed as the image kiln/stage0:<key> (ARG KILN_STAGE0; default) or as a "
        "stage0.tar in the context (no image store needed)",
    )
    dockerfile.add_argument(
        "--no-network-flags",
        action="store_true",
        help="omit RUN --network= (frontends before dockerfile 1.3); isolate with "
        "`docker build --network none` instead",
    )


def run(ctx: Context[Graph]) -> int:
    from kiln.build.dockerfile import OUTPUTS
    from kiln.build.session import Session

    args = ctx.args
    graph = ctx.graph()
    names = graph.closure(args.targets)
    out = Path(args.out)
    session = Session.open(graph, "none")
    export = session.export_dockerfile(
        names, args.targets, out, stage0=args.stage0, network_flags=not args.no_network_flags
    )
    print(f"wrote {export.dockerfile} ({len(names)} packages) and its build context in {out}")
    print(f"build: DOCKER_BUILDKIT=1 docker build --target {OUTPUTS} --output type=local,dest=OUT {out}")
    return 0
