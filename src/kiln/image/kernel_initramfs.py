"""`kiln image` without a profile (`--kind kernel,initramfs`): build what is missing, then assemble."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.renamed import Renamed
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_jobs_option

if TYPE_CHECKING:
    from kiln.rootfs.assemble import Report

OUTPUTS = ("kernel", "initramfs")
DEFAULT_KINDS = ",".join(OUTPUTS)
# the old spelling, beside --out in the same verb; accepted with a word on the new one
OLD_OUTPUT = Renamed("image", "--output", "--kind", "old_output", "--out names the directory")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        default=None,
        help="without a profile, what to write, comma-separated: kernel,initramfs (default both; the same "
        "names as a profile's output kinds)",
    )
    OLD_OUTPUT.add_to(parser, default=None)
    parser.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="PKG",
        help="add a system-extension layer: a package of the tree, or an extension in a registry "
        "(oci://HOST/REPO:TAG or @sha256:DIGEST); repeatable, in layer order; with profiles, added to each",
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
    add_jobs_option(parser)
    parser.add_argument("--json", action="store_true", help="print sizes as JSON")


def kinds(args: argparse.Namespace) -> str:
    """--kind, or the old --output with a word on the new name; default kernel,initramfs."""
    given = OLD_OUTPUT.value(args, args.kind)
    return str(given) if given is not None else DEFAULT_KINDS


@dataclass
class Built:
    """What an assembly needs once its packages are stored: their trees, the rootfs list, the layers."""

    trees: dict[str, Path]
    rootfs: list[str]
    extensions: list[tuple[Any, str]]
    epoch: int
    outcomes: dict[str, Any]
    pulled: dict[str, str]  # registry extensions: the reference given -> the digest-pinned one


def build(graph: Graph, packages: list[str], extensions: list[str], jobs: int, *, json_output: bool) -> Built:
    """Build (or find stored) the kernel, init, the rootfs packages and the extensions (pulling those
    that name a registry)."""
    # Imported here: `kiln validate` and friends should not pay for the build machinery.
    from kiln.build.session import Session, choose_progress
    from kiln.image.oci_extension import extension_layers, is_oci, pull_all
    from kiln.rootfs import extension
    from kiln.rootfs.assemble import BASE_ROOTFS, INIT, KERNEL

    tree = graph.tree.packages
    rootfs = [name for name in BASE_ROOTFS if name in tree] + list(packages)
    local = [name for name in extensions if not is_oci(name)]
    for name in [*packages, *local]:
        graph.closure([name])  # unknown names fail here, with a suggestion
    pulled = pull_all(extensions, graph.tree.platform.arch)  # before the build: a bad reference fails at once
    targets = list(dict.fromkeys([KERNEL, INIT, *rootfs, *local]))
    session = Session.open(graph)
    progress = choose_progress(json_output=json_output)
    outcomes = session.build_all(targets, jobs, progress, purpose="cannot assemble the image")
    trees = session.trees(targets)
    manifests = extension_layers(extensions, pulled, trees, lambda name: extension.manifest_for(tree[name]))
    pinned = {name: layer.reference for name, layer in pulled.items()}
    return Built(trees, rootfs, manifests, session.source_date_epoch, outcomes, pinned)


def assemble(built: Built, out: Path) -> Report:
    """out/vmlinuz and out/initramfs.zst from stored packages."""
    from kiln.rootfs.assemble import Inputs
    from kiln.rootfs.assemble import assemble as assemble_parts

    return assemble_parts(Inputs(built.trees, built.rootfs, built.extensions), out, built.epoch, say_line)


def run(graph: Graph, args: argparse.Namespace) -> int:
    outputs = [o.strip() for o in kinds(args).split(",") if o.strip()]
    unknown = [o for o in outputs if o not in OUTPUTS]
    if unknown:
        raise InputError(
            f"unknown --kind {', '.join(unknown)}: choose from {', '.join(OUTPUTS)} "
            "(iso, disk images and the rest come with profiles)"
        )
    out = Path(args.out or "_out/image")
    built = build(graph, args.package, args.extension, args.jobs, json_output=args.json)
    report = assemble(built, out)
    if "kernel" not in outputs:
        (out / "vmlinuz").unlink()
    if "initramfs" not in outputs:
        (out / "initramfs.zst").unlink()
    if args.json:
        print(json.dumps({"sizes": report.sizes, "largest": report.largest, "extensions": built.pulled}, indent=2))
        return 0
    for name, size in report.sizes.items():
        print(f"{name:32s} {size / 1048576:8.2f} MiB")
    print("largest files in the rootfs:")
    for size, path in report.largest:
        print(f"  {size / 1048576:8.2f} MiB  {path}")
    for given, pinned in built.pulled.items():
        print(f"extension {given}: {pinned}")
    print(f"wrote {', '.join(outputs)} to {out}/ ({report.stripped} binaries stripped)")
    return 0
