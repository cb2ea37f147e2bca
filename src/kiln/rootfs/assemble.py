"""Kernel + initramfs from package outputs: the first bootable output of a Kiln image.

The initramfs holds `/init` (the tiny init), `/rootfs.sqsh` (the read-only rootfs)
and `/extensions/NN-name.sqsh` layers. Everything is derived from store trees and
SOURCE_DATE_EPOCH, so the same inputs give the same bytes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.core import nofollow
from kiln.core.errors import BuildError
from kiln.rootfs import extension
from kiln.rootfs.archive import cpio_newc, mksquashfs
from kiln.rootfs.extension import MODULES
from kiln.rootfs.tree import Part, check_minimal, largest_files, merge, prune, strip_binaries
from kiln.signing.modules import ModuleSigner

# What a base Kiln rootfs is made of (the kernel adds its modules).
BASE_ROOTFS = ("fhs", "ca-certificates", "util-linux", "e2fsprogs", "dosfstools", "kmod", "machined")
KERNEL = "kernel"
INIT = "init"


@dataclass
class Inputs:
    """Store trees by package name, which of them are extensions (in layer order), and the key
    that signs every kernel module of the rootfs and the extensions (Secure Boot images only)."""

    trees: dict[str, Path]
    rootfs: list[str]
    extensions: list[tuple[extension.Manifest, str]] = field(default_factory=list)
    module_signer: ModuleSigner | None = None


@dataclass
class Report:
    sizes: dict[str, int]
    largest: list[tuple[int, str]]
    stripped: int
    signed_modules: int = 0


def kernel_parts(tree: Path, work: Path) -> tuple[Path, Path]:
    """A copy of vmlinuz and of the kernel output without /boot (its modules go in the rootfs), in `work`.

    The kernel package may be a user's custom kernel: both are read through kiln.core.nofollow, a link at
    /boot/vmlinuz or on the way to or below /usr/lib/modules refused by name, never read with the host's view.
    """
    vmlinuz = copy_vmlinuz(tree, work / "vmlinuz")
    modules = work / "kernel-modules"
    modules.mkdir(parents=True)
    if nofollow.is_dir(tree, MODULES, what="the kernel package"):
        nofollow.copy_tree(tree, MODULES, modules, MODULES, links=False, what="the kernel package")
    return vmlinuz, modules


def copy_vmlinuz(tree: Path, dest: Path) -> Path:
    """The kernel package's /boot/vmlinuz copied to `dest` (a path Kiln chose), never read through a link."""
    _copy_out(tree, "boot/vmlinuz", dest, 0o644, "the kernel package")
    return dest


def _copy_out(tree: Path, rel: str, dest: Path, mode: int, what: str) -> None:
    """A file of a package's output copied to `dest`; a link there or on the way is refused by name."""
    try:
        nofollow.copy_file_in(tree, rel, dest, mode=mode, what=what)
    except FileNotFoundError:
        raise BuildError(f"{what} has no /{rel} in its output ({tree})") from None


def build_rootfs(inputs: Inputs, modules: Path, work: Path, epoch: int) -> tuple[Path, Path, Report]:
    """Merge, prune, strip and check the rootfs tree; then squash it."""
    root = work / "rootfs"
    parts = [Part(name, inputs.trees[name]) for name in inputs.rootfs]
    merge([*parts, Part(KERNEL, modules)], root)
    prune(root)
    stripped = strip_binaries(root)  # before signing: strip drops what follows a module's sections
    signed = inputs.module_signer.sign_tree(root) if inputs.module_signer else 0
    check_minimal(root)
    image = mksquashfs(root, work / "rootfs.sqsh", epoch)
    return root, image, Report({"rootfs.sqsh": image.stat().st_size}, largest_files(root), stripped, signed)


def build_layers(inputs: Inputs, rootfs: Path, work: Path, epoch: int) -> tuple[list[Path], int]:
    """One squashfs per extension, plus a regenerated modules index layer when they carry modules;
    and how many extension modules were signed."""
    trees = []
    signed = 0
    for index, (manifest, name) in enumerate(inputs.extensions, start=1):
        extension.check_compatible(manifest)
        extension.check_paths(name, inputs.trees[name])
        extension.check_kernel(manifest, inputs.trees[name], inputs.trees[KERNEL])
        tree = extension.layer_tree(inputs.trees[name], manifest, work / "ext" / name)
        if inputs.module_signer:
            signed += inputs.module_signer.sign_tree(tree)
        trees.append((f"{index:02d}-{name}", tree))
    index_tree = extension.modules_layer(rootfs, [t for _, t in trees], work / "ext" / "modules-index")
    if index_tree is not None:
        trees.append((f"{len(trees) + 1:02d}-modules-index", index_tree))
    layers = []
    for label, tree in trees:
        layers.append(mksquashfs(tree, work / "layers" / f"{label}.sqsh", epoch))
    return layers, signed


def assemble(inputs: Inputs, out: Path, epoch: int, say: Callable[[str], None]) -> Report:
    """Write out/vmlinuz and out/initramfs.zst."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-image-", dir=out) as tmp:
        work = Path(tmp)
        (work / "layers").mkdir()
        vmlinuz, modules = kernel_parts(inputs.trees[KERNEL], work)
        say(f"rootfs: merging {len(inputs.rootfs)} packages")
        root, squash, report = build_rootfs(inputs, modules, work, epoch)
        layers, signed = build_layers(inputs, root, work, epoch)
        report.signed_modules += signed
        if inputs.module_signer:
            say(f"modules: {report.signed_modules} signed with the module key")
        initramfs = work / "initramfs"
        (initramfs / "extensions").mkdir(parents=True)
        init = initramfs / "init"
        _copy_init(inputs.trees[INIT], init)
        shutil.copy2(squash, initramfs / "rootfs.sqsh")
        for layer in layers:
            shutil.copy2(layer, initramfs / "extensions" / layer.name)
        say(f"initramfs: init, rootfs.sqsh and {len(layers)} extension layer(s)")
        cpio_newc(initramfs, out / "initramfs.zst", epoch)
        shutil.copy2(vmlinuz, out / "vmlinuz")  # kernel_parts' copy, in Kiln's work dir
        (out / "vmlinuz").chmod(0o644)
        report.sizes |= {
            "init": init.stat().st_size,
            "vmlinuz": (out / "vmlinuz").stat().st_size,
            "initramfs.zst": (out / "initramfs.zst").stat().st_size,
        }
        for layer in layers:
            report.sizes[f"extensions/{layer.name}"] = layer.stat().st_size
    return report


def _copy_init(tree: Path, dest: Path) -> None:
    """The init package's /init into the initramfs, never read through a link."""
    _copy_out(tree, "init", dest, 0o755, "the init package")
