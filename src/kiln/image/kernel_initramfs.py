"""`kiln image` without a profile (`--kind kernel,initramfs`): build what is missing, then assemble."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.core.console import say_line
from kiln.core.errors import BuildError, InputError
from kiln.core.renamed import renamed
from kiln.pkg.graph import Graph

OUTPUTS = ("kernel", "initramfs")
DEFAULT_KINDS = ",".join(OUTPUTS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        default=None,
        help="without a profile, what to write, comma-separated: kernel,initramfs (default both; the same "
        "names as a profile's output kinds)",
    )
    # the old spelling, beside --out in the same verb; accepted with a word on the new one
    parser.add_argument("--output", dest="old_output", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="PKG",
        help="turn this package into a system-extension layer (repeatable, in layer order)",
    )
    parser.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="PKG",
        help="add this package's output to the rootfs (repeatable)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="where to write (default _out/<profile>/ with profiles, else _out/image)"
    )
    parser.add_argument(
        "--jobs", "-j", type=int, metavar="N", help="packages built at once (default 2, or the project's jobs:)"
    )
    parser.add_argument("--json", action="store_true", help="print sizes as JSON")


def kinds(args: argparse.Namespace) -> str:
    """--kind, or the old --output with a word on the new name; default kernel,initramfs."""
    given = renamed("image", "--output", "--kind", args.old_output, args.kind, "--out names the directory")
    return str(given) if given is not None else DEFAULT_KINDS


def run(graph: Graph, args: argparse.Namespace) -> int:
    # Imported here: `kiln validate` and friends should not pay for the build machinery.
    from kiln.build.session import Session, choose_progress, failures
    from kiln.rootfs import extension
    from kiln.rootfs.assemble import BASE_ROOTFS, INIT, KERNEL, Inputs, assemble

    outputs = [o.strip() for o in kinds(args).split(",") if o.strip()]
    unknown = [o for o in outputs if o not in OUTPUTS]
    if unknown:
        raise InputError(
            f"unknown --kind {', '.join(unknown)}: choose from {', '.join(OUTPUTS)} "
            "(iso, disk images and the rest come with profiles)"
        )
    packages = graph.tree.packages
    rootfs = [name for name in BASE_ROOTFS if name in packages] + list(args.package)
    for name in [*args.package, *args.extension]:
        graph.closure([name])  # unknown names fail here, with a suggestion
    manifests = [(extension.manifest_for(packages[name]), name) for name in args.extension]
    targets = list(dict.fromkeys([KERNEL, INIT, *rootfs, *args.extension]))
    session = Session.open(graph)
    progress = choose_progress(json_output=args.json)
    outcomes = session.build(targets, args.jobs, progress, no_cache=False, keep_going=False)
    failed = failures(outcomes)
    if failed:
        for outcome in failed:
            print(str(outcome.error), file=sys.stderr)
        raise BuildError(f"cannot assemble the image: {len(failed)} package(s) failed")
    trees = {name: session.store.tree(session.keys[name]) for name in targets}
    out = Path(args.out or "_out/image")
    report = assemble(Inputs(trees, rootfs, manifests), out, session.source_date_epoch, say_line)
    if "kernel" not in outputs:
        (out / "vmlinuz").unlink()
    if "initramfs" not in outputs:
        (out / "initramfs.zst").unlink()
    if args.json:
        print(json.dumps({"sizes": report.sizes, "largest": report.largest}, indent=2))
        return 0
    for name, size in report.sizes.items():
        print(f"{name:32s} {size / 1048576:8.2f} MiB")
    print("largest files in the rootfs:")
    for size, path in report.largest:
        print(f"  {size / 1048576:8.2f} MiB  {path}")
    print(f"wrote {', '.join(outputs)} to {out}/ ({report.stripped} binaries stripped)")
    return 0
