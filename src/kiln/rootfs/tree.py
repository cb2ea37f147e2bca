"""The rootfs tree: package outputs merged, pruned to what a running system needs, stripped.

A Kiln rootfs is read-only and minimal: no shell, no package manager, no headers,
static libraries, docs or man pages. Two packages shipping the same file is an
error, never a silent overwrite.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError

# Dropped from every rootfs: development files and documentation.
PRUNED_DIRS = (
    "usr/include",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/lib/pkgconfig",
    "usr/share/pkgconfig",
    "usr/local/include",
    "toolchain",
)
PRUNED_SUFFIXES = (".a", ".la", ".h", ".o")

# What must never be on a Kiln rootfs (an interactive way in, or a way to change it).
FORBIDDEN = (
    "bin/sh",
    "bin/bash",
    "bin/dash",
    "bin/busybox",
    "usr/bin/sh",
    "usr/bin/bash",
    "usr/bin/dash",
    "usr/bin/busybox",
    "usr/bin/apt",
    "usr/bin/apt-get",
    "usr/bin/dpkg",
    "sbin/apk",
    "usr/bin/rpm",
)

ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class Part:
    """One package's output going into the rootfs."""

    name: str
    tree: Path


def merge(parts: list[Part], dest: Path) -> dict[str, str]:
    """Copy every part into dest; returns path -> owning package. Conflicts are errors naming both."""
    owner: dict[str, str] = {}
    dest.mkdir(parents=True, exist_ok=True)
    for part in parts:
        for dirpath, dirnames, filenames in os.walk(part.tree):
            base = Path(dirpath)
            rel_dir = base.relative_to(part.tree)
            for name in sorted(dirnames):
                source = base / name
                target = dest / rel_dir / name
                if source.is_symlink():
                    _claim(owner, (rel_dir / name).as_posix(), part.name)
                    target.symlink_to(os.readlink(source))
                elif not target.exists():
                    target.mkdir()
                    shutil.copystat(source, target, follow_symlinks=False)
                elif not target.is_dir() or target.is_symlink():
                    raise BuildError(
                        f"rootfs conflict: {rel_dir / name} is a directory in '{part.name}' "
                        f"but not in '{owner.get((rel_dir / name).as_posix(), '?')}'"
                    )
            dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()]
            for name in sorted(filenames):
                rel = (rel_dir / name).as_posix()
                _claim(owner, rel, part.name)
                source, target = base / name, dest / rel
                if source.is_symlink():
                    target.symlink_to(os.readlink(source))
                else:
                    shutil.copy2(source, target)
    return owner


def _claim(owner: dict[str, str], rel: str, package: str) -> None:
    if rel in owner:
        raise BuildError(f"rootfs conflict: /{rel} is in both '{owner[rel]}' and '{package}'")
    owner[rel] = package


def prune(root: Path) -> list[str]:
    """Remove development files and docs; returns what was removed (relative paths)."""
    removed = []
    for rel in PRUNED_DIRS:
        path = root / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(rel)
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(PRUNED_SUFFIXES):
                path = Path(dirpath) / name
                removed.append(path.relative_to(root).as_posix())
                path.unlink()
    return removed


def check_minimal(root: Path) -> None:
    """Refuse a rootfs that carries a shell or a package manager."""
    found = [rel for rel in FORBIDDEN if (root / rel).exists() or (root / rel).is_symlink()]
    if found:
        raise BuildError(f"the rootfs must not hold a shell or package manager, found: {', '.join(found)}")


# The host's binutils for each ELF machine (e_machine): an arm64 rootfs is stripped on an amd64
# host by Debian's cross binutils (binutils-aarch64-linux-gnu), since the native strip refuses it.
STRIP_FOR_MACHINE = {0x3E: "x86_64-linux-gnu-strip", 0xB7: "aarch64-linux-gnu-strip"}


def elf_machine(header: bytes) -> int | None:
    """e_machine of an ELF header (at least 20 bytes), or None when it is not ELF."""
    if len(header) < 20 or header[:4] != ELF_MAGIC:
        return None
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


def strip_binaries(root: Path) -> int:
    """Strip debug symbols from ELF files; returns how many were stripped.

    One strip process per tool and batch of files, not one per file: a rootfs holds about 150.
    """
    found: dict[str, list[tuple[Path, os.stat_result]]] = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in sorted(filenames):
            path = Path(dirpath) / name
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_size < 20:
                continue
            with path.open("rb") as handle:
                machine = elf_machine(handle.read(20))
            if machine is None:
                continue
            strip = STRIP_FOR_MACHINE.get(machine)
            if strip is None:
                where = f"/{path.relative_to(root)}"
                raise BuildError(f"{where}: an ELF file for machine {machine:#x}, which Kiln does not build for")
            found.setdefault(strip, []).append((path, info))
    for strip, files in found.items():
        for start in range(0, len(files), STRIP_BATCH):
            batch = files[start : start + STRIP_BATCH]
            tools.run([strip, "--strip-unneeded", *(str(path) for path, _ in batch)], what=f"{strip} in {root}")
            for path, info in batch:
                os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    return sum(len(files) for files in found.values())


STRIP_BATCH = 200


def largest_files(root: Path, count: int = 10) -> list[tuple[int, str]]:
    sizes = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                sizes.append((path.stat().st_size, "/" + path.relative_to(root).as_posix()))
    return sorted(sizes, reverse=True)[:count]


def clamp_times(root: Path, epoch: int) -> None:
    """Every entry's mtime to SOURCE_DATE_EPOCH, so archives of the tree are reproducible."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in [*filenames, *dirnames]:
            os.utime(Path(dirpath) / name, (epoch, epoch), follow_symlinks=False)
    os.utime(root, (epoch, epoch))
