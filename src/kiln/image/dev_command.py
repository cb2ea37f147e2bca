"""`kiln dev boot`: the inner loop, one command from an edit to machined's ready line.

It builds what the edit changed (machined keeps Go's build cache between builds, so an edit to
runtime/machined recompiles only its own packages; the kernel keeps a ccache, so a config,
fragment or patch edit compiles only what it reaches), assembles vmlinuz and initramfs.zst into
`_out/dev`, boots them in QEMU (console log: `_out/dev/console.log`) and says where the time
went. Everything unchanged is reused from the store: the kernel, the userland, init.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from kiln.boot import command as boot_command
from kiln.boot.accel import add_accel_option
from kiln.core.console import say_line
from kiln.core.verb import Context
from kiln.image import kernel_initramfs
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_jobs_option, add_tree_options

DEFAULT_OUT = "_out/dev"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("action", choices=("boot",), help="boot: build, assemble kernel+initramfs, boot to ready")
    parser.add_argument(
        "--extension", action="append", default=[], metavar="PKG", help="add this package as an extension layer"
    )
    parser.add_argument(
        "--package", action="append", default=[], metavar="PKG", help="add this package's output to the rootfs"
    )
    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    add_jobs_option(parser)
    parser.add_argument("--cmdline", default="", help="extra kernel command line")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for ready (default 120)")
    add_accel_option(parser, help="as kiln boot --accel")
    parser.add_argument("--keep", action="store_true", help="keep the machine running after ready (Ctrl-C stops it)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the console")
    parser.add_argument("--json", action="store_true", help="the phases' seconds as JSON on stdout; implies --quiet")


def run(ctx: Context[Graph]) -> int:
    args, graph = ctx.args, ctx.graph()
    start = time.monotonic()
    built = kernel_initramfs.build(graph, args.package, args.extension, args.jobs or 2, json_output=args.json)
    rebuilt = sorted(name for name, outcome in built.outcomes.items() if outcome.status == "built")
    assembled = time.monotonic()
    out = Path(args.out)
    kernel_initramfs.assemble(built, out)
    booted = time.monotonic()
    boot_args = _boot_arguments(out, args)
    code = boot_command.run(replace(ctx, args=boot_args))
    done = time.monotonic()
    phases = {
        "build": round(assembled - start, 2),
        "image": round(booted - assembled, 2),
        "boot": round(done - booted, 2),
        "total": round(done - start, 2),
    }
    if args.json:
        report = {
            "ok": code == 0,
            "rebuilt": rebuilt,
            "seconds": phases,
            "package_seconds": {name: round(built.outcomes[name].seconds, 2) for name in rebuilt},
            "out": str(out),
        }
        print(json.dumps(report | {"console_log": str(out / "console.log")}, indent=2))
    elif not args.keep:
        what = ", ".join(rebuilt) if rebuilt else "nothing"
        say_line(
            f"kiln dev: built {what} in {phases['build']} s, image {phases['image']} s, boot to ready "
            f"{phases['boot']} s: {phases['total']} s in all"
        )
    return code


def _boot_arguments(out: Path, args: argparse.Namespace) -> argparse.Namespace:
    """kiln boot's own options, parsed as if typed (so its defaults stay its own)."""
    parser = argparse.ArgumentParser(add_help=False)
    boot_command.add_arguments(parser)
    argv = [str(out), "--timeout", str(args.timeout), "--accel", args.accel, "--log", str(out / "console.log")]
    argv += [f"--cmdline={args.cmdline}"] if args.cmdline else []
    argv += ["--keep"] if args.keep else []
    argv += ["--quiet"] if args.quiet or args.json else []
    return parser.parse_args(argv)
