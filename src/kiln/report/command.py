"""`kiln report timeline|sizes`: pictures of a build and of an image; the verb's arguments and dispatch.

Drawing modules are imported only when the verb runs, so matplotlib never slows `kiln`'s start-up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.core import console
from kiln.core.verb import Context
from kiln.report.output import FORMATS, format_for, write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "draw a build's timeline from kiln build --json, or measure what takes the space in an image"
    kinds = parser.add_subparsers(dest="report_kind", metavar="KIND", required=True)
    timeline = kinds.add_parser(
        "timeline",
        help="a build's Gantt chart from kiln build --json, the critical path in red",
        description="draw BUILD.json (what `kiln build --json` prints) as a Gantt chart: one bar per package "
        "built, from its start to its finish, the critical path marked and listed; a summary on stdout",
    )
    timeline.add_argument("build_json", metavar="BUILD.json", type=Path)
    timeline.add_argument("-o", "--out", metavar="FILE", type=Path, required=True, help="the chart (.svg or .png)")
    timeline.add_argument("--format", choices=FORMATS, help="picture format (default: from FILE's name)")
    timeline.add_argument("--title", help="the chart's title (default: kiln build)")
    sizes = kinds.add_parser(
        "sizes",
        help="what takes the space in an image: per package, kernel modules and the largest files",
        description="measure an output directory of kiln image (its manifest.json and the store entries it "
        "names): bytes per package of the rootfs as the imager makes it, the kernel modules, vmlinuz and init, "
        "and the largest files; a table on stdout, a chart with -o",
    )
    sizes.add_argument("directory", metavar="DIR", type=Path, help="an image output directory, e.g. _out/metal")
    sizes.add_argument("-o", "--out", metavar="FILE", type=Path, help="also draw the sizes as a chart (.svg or .png)")
    sizes.add_argument("--format", choices=FORMATS, help="picture format (default: from FILE's name)")
    sizes.add_argument("--json", action="store_true", help="the sizes as JSON instead of tables")
    sizes.add_argument(
        "--arch", choices=("amd64", "arm64"), help="which platform, when DIR holds several (kiln image --platform A,B)"
    )


def run(ctx: Context[object]) -> int:
    args = ctx.args
    if args.report_kind == "timeline":
        return _timeline(args)
    return _sizes(args)


def _timeline(args: argparse.Namespace) -> int:
    from kiln.report import timeline

    fmt = format_for(args.out, args.format)
    line = timeline.load(args.build_json)
    write(timeline.draw(line, fmt, args.title), args.out, fmt)
    print(timeline.summary(line))
    return 0


def _sizes(args: argparse.Namespace) -> int:
    from kiln.report import sizes

    fmt = format_for(args.out, args.format) if args.out else None
    measured = sizes.measure(args.directory, arch=args.arch)
    if fmt is not None:
        write(sizes.draw(measured, fmt), args.out, fmt)
    if args.json:
        print(json.dumps(measured.to_json(), indent=2))
        return 0
    packages, files = sizes.table_rows(measured)
    print(sizes.headline(measured))
    console.print_table("packages", ["package", "role", "files", "size", "of rootfs"], packages)
    if files:
        print()
        console.print_table("largest files", ["size", "path", "package"], files)
    return 0
