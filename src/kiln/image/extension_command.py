"""`kiln extension build|push NAME`: an extension built and checked against the kernel it is meant for.

The extension author's loop: build the package (and the tree's kernel, for its release and
vermagic), refuse what `kiln image` would refuse (files outside the extension paths, a Kiln or
kernel range that excludes this build, a module with another kernel's vermagic), and write the
layer `kiln image` would stack, `<out>/<name>-<version>-<arch>.sqsh`, beside a description of it
(`.json`: manifest, kernel release and vermagic, the modules it carries and loads, size, sha256).
The same checks run again when an image is made, so a layer cannot slip past them.
`push` builds and checks the same way, then uploads the package's tree with that description to
a registry (kiln.image.oci_extension), for `kiln image --extension oci://...` elsewhere.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.core.errors import InputError
from kiln.core.hashing import file_sha256
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_jobs_option, add_keys_option, add_tree_options

DEFAULT_OUT = "_out/extensions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument(
        "action",
        choices=("build", "push"),
        help="build: build NAME, check it, write its layer; push: build and check it, upload it (--to)",
    )
    parser.add_argument("name", metavar="NAME", help="the extension package (a pkg.yaml with an extension: section)")
    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    add_jobs_option(parser)
    parser.add_argument(
        "--to", metavar="HOST/REPO:TAG", help="push: the repository and tag, e.g. localhost:5000/ext:1.0"
    )
    add_keys_option(
        parser,
        "build: sign the layer's kernel modules with DIR's module key (kiln keys generate), as a Secure Boot "
        "image's are; an image signs them again with its own keys either way",
    )
    parser.add_argument("--json", action="store_true", help="what was written, as JSON on stdout")


def run(ctx: Context[Graph]) -> int:
    args, graph = ctx.args, ctx.graph()
    if args.action == "push":
        return push(graph, args)
    # Imported here: the parser should not pay for the build machinery.
    from kiln.rootfs import extension
    from kiln.rootfs.archive import mksquashfs

    manifest, tree, kernel, epoch = build_checked(graph, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{manifest.name}-{manifest.version}-{graph.tree.platform.arch}"
    with tempfile.TemporaryDirectory(prefix=".extension-", dir=out) as tmp:
        layer = extension.layer_tree(tree, manifest, Path(tmp) / "layer")
        signed = module_signer(args.keys).sign_tree(layer) if args.keys else 0
        mksquashfs(layer, out / f"{stem}.sqsh", epoch)
    sqsh = out / f"{stem}.sqsh"
    described = describe(manifest, tree, kernel, graph.tree.platform.arch) | layer_fields(sqsh)
    described["modules"]["signed"] = signed
    (out / f"{stem}.json").write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(described | {"description": str(out / f"{stem}.json")}, indent=2, sort_keys=True))
    else:
        modules = described["modules"]["carried"]
        print(
            f"{manifest.name} {manifest.version} ({described['arch']}): {sqsh}, "
            f"{described['size'] / 1048576:.2f} MiB, {len(modules)} module(s) for kernel {described['kernel']}"
        )
    return 0


def push(graph: Graph, args: argparse.Namespace) -> int:
    """Build, check, upload; prints the pinned reference an image (or a schematic) should name."""
    from kiln.image import oci_extension

    if not args.to:
        raise InputError("kiln extension push needs --to HOST[:PORT]/REPOSITORY:TAG")
    oci_extension.parse_push_target(args.to)  # a bad target fails before the build
    manifest, tree, kernel, _ = build_checked(graph, args)
    described = describe(manifest, tree, kernel, graph.tree.platform.arch)
    reference = oci_extension.push(tree, described, args.to)
    if args.json:
        print(json.dumps(described | {"reference": reference}, indent=2, sort_keys=True))
    else:
        print(reference)
    return 0


def build_checked(graph: Graph, args: argparse.Namespace) -> tuple[Any, Path, Path, int]:
    """Build the extension and the kernel; check them as `kiln image` would. Manifest, tree, kernel tree, epoch."""
    from kiln.build.session import Session, choose_progress
    from kiln.rootfs import extension
    from kiln.rootfs.assemble import KERNEL

    graph.closure([args.name])  # an unknown name fails here, with a suggestion
    manifest = extension.manifest_for(graph.tree.packages[args.name])
    session = Session.open(graph)
    targets = list(dict.fromkeys([KERNEL, args.name]))
    progress = choose_progress(json_output=args.json)
    session.build_all(targets, args.jobs or 2, progress, purpose=f"extension '{args.name}' was not built")
    tree, kernel = (session.store.tree(session.keys[name]) for name in (args.name, KERNEL))
    extension.check_compatible(manifest)
    extension.check_paths(args.name, tree)
    extension.check_kernel(manifest, tree, kernel)
    return manifest, tree, kernel, session.source_date_epoch


def module_signer(keys: Path) -> Any:
    """The module key of a key directory (kiln keys generate), checked as kiln image checks --keys."""
    from kiln.signing.keyset import KeySet
    from kiln.signing.modules import ModuleSigner

    if not keys.is_dir():
        raise InputError(f"--keys {keys}: not a directory (kiln keys generate DIR makes one)")
    return ModuleSigner.from_keys(KeySet(keys))


def layer_fields(layer: Path) -> dict[str, Any]:
    return {"file": layer.name, "size": layer.stat().st_size, "sha256": file_sha256(layer)}


def describe(manifest: Any, tree: Path, kernel: Path, arch: str) -> dict[str, Any]:
    """What an extension says of itself (beside its layer, or as its registry artifact's config): enough to
    check it fits an image without unpacking it."""
    from kiln.rootfs import extension

    modules = extension.module_files(tree)
    release = extension.kernel_release(kernel)
    reference = next(iter(extension.module_files(kernel)), None)
    return {
        "name": manifest.name,
        "version": manifest.version,
        "arch": arch,
        "manifest": json.loads(manifest.to_json()),
        "built_by": f"kiln {__version__}",
        "kernel": release,
        "vermagic": extension.vermagic(reference) if reference else None,
        "modules": {
            "carried": [str(m.relative_to(tree)) for m in modules],
            "loaded_at_boot": list(manifest.modules),
        },
    }
