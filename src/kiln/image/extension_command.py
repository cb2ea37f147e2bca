"""`kiln extension build NAME`: an extension built and checked against the kernel it is meant for.

The extension author's loop: build the package (and the tree's kernel, for its release and
vermagic), refuse what `kiln image` would refuse (files outside the extension paths, a Kiln or
kernel range that excludes this build, a module with another kernel's vermagic), and write the
layer `kiln image` would stack, `<out>/<name>-<version>-<arch>.sqsh`, beside a description of it
(`.json`: manifest, kernel release and vermagic, the modules it carries and loads, size, sha256).
The same checks run again when an image is made, so a layer cannot slip past them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.core.errors import BuildError
from kiln.core.hashing import file_sha256
from kiln.pkg.graph import Graph

DEFAULT_OUT = "_out/extensions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("build",), help="build: build NAME, check it, write its layer")
    parser.add_argument("name", metavar="NAME", help="the extension package (a pkg.yaml with an extension: section)")
    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})")
    parser.add_argument("--jobs", "-j", type=int, metavar="N", help="packages built at once (default 2)")
    parser.add_argument("--json", action="store_true", help="what was written, as JSON on stdout")


def run(graph: Graph, args: argparse.Namespace) -> int:
    # Imported here: the parser should not pay for the build machinery.
    from kiln.build.session import Session, choose_progress, failures
    from kiln.rootfs import extension
    from kiln.rootfs.archive import mksquashfs
    from kiln.rootfs.assemble import KERNEL

    graph.closure([args.name])  # an unknown name fails here, with a suggestion
    manifest = extension.manifest_for(graph.tree.packages[args.name])
    session = Session.open(graph)
    targets = list(dict.fromkeys([KERNEL, args.name]))
    progress = choose_progress(json_output=args.json)
    outcomes = session.build(targets, args.jobs or 2, progress, no_cache=False, keep_going=False)
    failed = failures(outcomes)
    if failed:
        for outcome in failed:
            print(str(outcome.error), file=sys.stderr)
        raise BuildError(f"extension '{args.name}' was not built: {len(failed)} package(s) failed")
    tree, kernel = (session.store.tree(session.keys[name]) for name in (args.name, KERNEL))
    extension.check_compatible(manifest)
    extension.check_paths(args.name, tree)
    extension.check_kernel(manifest, tree, kernel)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{manifest.name}-{manifest.version}-{graph.tree.platform.arch}"
    with tempfile.TemporaryDirectory(prefix=".extension-", dir=out) as tmp:
        layer = extension.layer_tree(tree, manifest, Path(tmp) / "layer")
        mksquashfs(layer, out / f"{stem}.sqsh", session.source_date_epoch)
    described = describe(manifest, tree, kernel, out / f"{stem}.sqsh", graph.tree.platform.arch)
    (out / f"{stem}.json").write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(described | {"description": str(out / f"{stem}.json")}, indent=2, sort_keys=True))
    else:
        modules = described["modules"]["carried"]
        print(
            f"{manifest.name} {manifest.version} ({described['arch']}): {out / stem}.sqsh, "
            f"{described['size'] / 1048576:.2f} MiB, {len(modules)} module(s) for kernel {described['kernel']}"
        )
    return 0


def describe(manifest: Any, tree: Path, kernel: Path, layer: Path, arch: str) -> dict[str, Any]:
    """What the .json beside a layer says: enough to check it fits an image without unpacking it."""
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
        "file": layer.name,
        "size": layer.stat().st_size,
        "sha256": file_sha256(layer),
    }
