"""`kiln report sizes DIR`: what takes the space in an image, per package and per file.

DIR is an output directory of `kiln image` (manifest.json names every input package's store key;
sbom.cdx.json says what each one is: kernel, init, rootfs, extension, bootloader). The rootfs is
made again here exactly as the imager makes it (kiln.rootfs: the same merge, prune and strip),
in a temporary directory, from the store entries the manifest names, so each byte is counted
where it lands in the image and charged to the package that shipped it; the kernel's modules
are their own line. The squashfs of that tree gives the compressed size the initramfs carries.
Two things are not redone: signing kernel modules (a Secure Boot image's modules are a few
hundred bytes larger each) and extension layers (counted from their store trees, before the
layer is cut down).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kiln.build.store import Pins, Store
from kiln.core.errors import InputError
from kiln.core.sizes import format_size
from kiln.report import plot
from kiln.rootfs.archive import mksquashfs
from kiln.rootfs.assemble import kernel_parts
from kiln.rootfs.tree import Part, merge, prune, strip_binaries

MANIFEST = "manifest.json"
CYCLONEDX = "sbom.cdx.json"
MODULES = "kernel modules"
LARGEST = 15


@dataclass
class PackageSize:
    name: str
    role: str  # rootfs | kernel | init | extension | bootloader | modules
    files: int
    bytes: int


@dataclass
class FileSize:
    path: str
    package: str
    bytes: int


@dataclass
class Sizes:
    profile: str
    arch: str
    packages: list[PackageSize]  # what the booted system carries, largest first
    largest: list[FileSize]  # the rootfs's largest files
    rootfs_bytes: int = 0
    squashfs_bytes: int = 0
    artifacts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def roles(directory: Path, packages: dict[str, str], arch: str | None = None) -> dict[str, str]:
    """Each input package's role, from the CycloneDX SBOM's kiln:role; by name when there is none."""
    found: dict[str, str] = {}
    try:
        sbom = json.loads((directory / (f"sbom-{arch}.cdx.json" if arch else CYCLONEDX)).read_bytes())
        for component in sbom.get("components", []):
            properties = {p.get("name"): p.get("value") for p in component.get("properties", [])}
            if component.get("name") in packages and properties.get("kiln:role"):
                found[str(component["name"])] = str(properties["kiln:role"])
    except (OSError, ValueError, AttributeError):
        pass
    guess = {"kernel": "kernel", "init": "init"}
    return {name: found.get(name, guess.get(name, "rootfs")) for name in packages}


def read_output(directory: Path, arch: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """manifest.json of an image output directory, and the inputs of one platform (`arch` picks it
    in a multi-platform manifest, whose `platforms` map each one to its inputs)."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError(
            f"{directory} has no {MANIFEST}: name an output directory of kiln image (_out/metal)"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable: {exc}") from None
    if not isinstance(manifest, dict):
        raise InputError(f"{path}: not a manifest of kiln image")
    platforms = manifest.get("platforms")
    if isinstance(platforms, dict):
        arches = sorted(str(p).rsplit("/", 1)[-1] for p in platforms)
        if arch not in arches:
            raise InputError(f"{path} holds several platforms: choose one with --arch ({', '.join(arches)})")
        inputs = {**manifest.get("inputs", {}), **platforms[f"linux/{arch}"]}
    elif arch is not None and manifest.get("profile", {}).get("arch") != arch:
        raise InputError(f"{path} is an image for {manifest.get('profile', {}).get('arch')}, not {arch}")
    else:
        inputs = manifest.get("inputs", {})
    packages = inputs.get("packages") if isinstance(inputs, dict) else None
    if not isinstance(packages, dict) or not packages:
        raise InputError(f"{path}: no inputs.packages: the image was made without packages of the graph")
    return manifest, inputs


def measure(directory: Path, store: Store | None = None, arch: str | None = None) -> Sizes:
    """The sizes of the image in `directory` (for `arch`, if it holds several), its packages read from the store."""
    manifest, inputs = read_output(directory, arch)
    packages = {str(name): str(key) for name, key in inputs["packages"].items()}
    store = store or Store()
    with Pins(store) as pins:  # a gc running meanwhile leaves the entries being measured alone
        trees: dict[str, Path] = {}
        for name, key in packages.items():
            if not pins.pin(key, wait=True):
                raise InputError(
                    f"package {name}'s store entry {key[:12]} is not in the store ({store.root}): "
                    "it was collected or built elsewhere; make the image again (kiln image) to rebuild it"
                )
            trees[name] = store.tree(key)
        return _measure(directory, manifest, inputs, trees, store, arch)


def _measure(
    directory: Path,
    manifest: dict[str, Any],
    inputs: dict[str, Any],
    trees: dict[str, Path],
    store: Store,
    arch: str | None,
) -> Sizes:
    packages = {str(name): str(key) for name, key in inputs["packages"].items()}
    multi = "platforms" in manifest
    role = roles(directory, packages, arch if multi else None)
    profile = manifest.get("profile", {})
    epoch = int(inputs.get("source_date_epoch", 0))
    sizes = Sizes(str(profile.get("name", directory.name)), str(arch or profile.get("arch", "?")), [], [])
    sizes.artifacts = {
        str(a["path"]): int(a["size"])
        for a in manifest.get("artifacts", [])
        if not multi or a.get("arch") in (None, arch)
    }
    with tempfile.TemporaryDirectory(
        prefix="kiln-sizes-", dir=store.tmp_dir if store.tmp_dir.is_dir() else None
    ) as tmp:
        _rootfs(sizes, trees, role, Path(tmp), epoch)
    for name, kind in role.items():
        if kind == "init":
            sizes.packages.append(PackageSize(name, kind, *_tree_size(trees[name] / "init")))
        elif kind == "extension":
            sizes.packages.append(PackageSize(name, kind, *_tree_size(trees[name])))
    sizes.packages.sort(key=lambda p: (-p.bytes, p.name))
    return sizes


def _rootfs(sizes: Sizes, trees: dict[str, Path], role: dict[str, str], work: Path, epoch: int) -> None:
    """The rootfs as the imager makes it, measured per owning package; vmlinuz on its own line."""
    kernel = next((n for n, r in role.items() if r == "kernel"), None)
    parts = [Part(name, trees[name]) for name, kind in role.items() if kind == "rootfs"]
    if kernel is not None:
        vmlinuz, modules = kernel_parts(trees[kernel], work)
        sizes.packages.append(PackageSize(kernel, "kernel", 1, vmlinuz.stat().st_size))
        parts.append(Part(MODULES, modules))
    if not [p for p in parts if p.name != MODULES]:
        return  # the profile brings its own initramfs: no rootfs of Kiln's
    root = work / "rootfs"
    owner = merge(parts, root)
    prune(root)
    strip_binaries(root)
    per_package: dict[str, list[int]] = {p.name: [0, 0] for p in parts}
    files: list[FileSize] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                continue
            rel = path.relative_to(root).as_posix()
            package = owner.get(rel, "?")
            size = path.stat().st_size
            counts = per_package.setdefault(package, [0, 0])
            counts[0] += 1
            counts[1] += size
            files.append(FileSize("/" + rel, package, size))
    for name, (count, size) in per_package.items():
        sizes.packages.append(PackageSize(name, "modules" if name == MODULES else "rootfs", count, size))
    sizes.rootfs_bytes = sum(f.bytes for f in files)
    sizes.largest = sorted(files, key=lambda f: (-f.bytes, f.path))[:LARGEST]
    sizes.squashfs_bytes = mksquashfs(root, work / "rootfs.sqsh", epoch).stat().st_size


def _tree_size(path: Path) -> tuple[int, int]:
    """Files and bytes of a file or a tree (symlinks not counted)."""
    if path.is_file():
        return 1, path.stat().st_size
    count = total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            item = Path(dirpath) / name
            if not item.is_symlink():
                count += 1
                total += item.stat().st_size
    return count, total


def table_rows(sizes: Sizes) -> tuple[list[list[str]], list[list[str]]]:
    """The text tables: packages (name, role, files, size, share of the rootfs) and the largest files."""
    whole = sizes.rootfs_bytes or 1
    packages = [
        [
            p.name,
            p.role,
            str(p.files),
            format_size(p.bytes),
            f"{100 * p.bytes / whole:.1f}%" if p.role in ("rootfs", "modules") else "-",
        ]
        for p in sizes.packages
    ]
    files = [[format_size(f.bytes), f.path, f.package] for f in sizes.largest]
    return packages, files


def headline(sizes: Sizes) -> str:
    text = f"{sizes.profile} ({sizes.arch}): rootfs {format_size(sizes.rootfs_bytes)} uncompressed"
    text += f", {format_size(sizes.squashfs_bytes)} as squashfs" if sizes.squashfs_bytes else ""
    kernel = next((p for p in sizes.packages if p.role == "kernel"), None)
    return text + (f"; vmlinuz {format_size(kernel.bytes)}" if kernel else "")


ROLE_COLOURS = {
    "rootfs": plot.BLUE,
    "modules": plot.ORANGE,
    "kernel": plot.TEAL,
    "init": plot.TEAL,
    "extension": plot.GREEN,
}


def draw(sizes: Sizes, fmt: str) -> bytes:
    """Two bar charts: bytes per package (coloured by role), then the largest files (coloured by package).

    Each package's bar is an SVG group with the id `package-<name>`, each file's `file-<n>`.
    """
    from matplotlib.patches import Patch

    packages = sizes.packages
    files = sizes.largest
    height = 1.8 + 0.26 * (len(packages) + len(files))
    fig = plot.figure(10, height)
    ratios = [max(len(packages), 1), max(len(files), 1)] if files else [1]
    axes = fig.subplots(len(ratios), 1, gridspec_kw={"height_ratios": ratios})
    top = axes[0] if files else axes
    mib = 1024 * 1024
    for row, package in enumerate(packages):
        (patch,) = top.barh(row, package.bytes / mib, color=ROLE_COLOURS.get(package.role, plot.GREY)).patches
        patch.set_gid(f"package-{package.name}")
        _label(top, package.bytes / mib, row, format_size(package.bytes))
    top.set_yticks(range(len(packages)), [_package_label(p) for p in packages])
    top.invert_yaxis()
    top.set_xlabel("MiB (uncompressed, as in the image)")
    top.set_title(headline(sizes), loc="left", fontsize=10)
    shown = dict.fromkeys(ROLE_LABELS[p.role] for p in sorted(packages, key=lambda p: list(ROLE_LABELS).index(p.role)))
    top.legend(
        handles=[Patch(color=ROLE_COLOURS[_role_of(label)], label=label) for label in shown],
        loc="lower right",
        frameon=False,
    )
    _pad(top, max((p.bytes for p in packages), default=0) / mib)
    if files:
        bottom = axes[1]
        for row, item in enumerate(files):
            colour = ROLE_COLOURS["modules" if item.package == MODULES else "rootfs"]
            (patch,) = bottom.barh(row, item.bytes / mib, color=colour).patches
            patch.set_gid(f"file-{row}")
            _label(bottom, item.bytes / mib, row, f"{format_size(item.bytes)}  ({item.package})")
        bottom.set_yticks(range(len(files)), [_short(f.path) for f in files], fontsize=8)
        bottom.invert_yaxis()
        bottom.set_xlabel("MiB")
        bottom.set_title(f"the {len(files)} largest files of the rootfs", loc="left", fontsize=10)
        _pad(bottom, files[0].bytes / mib)
    fig.tight_layout()
    return plot.render(fig, fmt)


ROLE_LABELS = {
    "rootfs": "rootfs package",
    "modules": "kernel modules (in the rootfs)",
    "kernel": "vmlinuz and /init (beside the rootfs)",
    "init": "vmlinuz and /init (beside the rootfs)",
    "extension": "extension layer (store tree)",
}
_MODULES_DIR = re.compile(r"^/usr/lib/modules/[^/]+/kernel/")


def _role_of(label: str) -> str:
    return next(role for role, text in ROLE_LABELS.items() if text == label)


def _package_label(package: PackageSize) -> str:
    where = {"kernel": " (vmlinuz)", "init": " (/init)", "extension": " (extension)"}
    return package.name + where.get(package.role, "")


def _short(path: str) -> str:
    """A module's path without the modules directory, which every one of them shares."""
    return _MODULES_DIR.sub(".../kernel/", path)


def _label(ax: Any, x: float, row: int, text: str) -> None:
    """A bar's value just right of its end (an offset in points: SVG would collapse leading spaces)."""
    ax.annotate(text, (x, row), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)


def _pad(ax: Any, widest: float) -> None:
    """Room right of the widest bar for its label."""
    ax.set_xlim(0, max(widest, 0.001) * 1.35)
