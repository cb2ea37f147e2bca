"""The rootfs tree: package outputs merged, pruned to what a running system needs, stripped.

A Kiln rootfs is read-only and minimal: no shell, no package manager, no headers,
static libraries, docs or man pages. Two packages shipping the same file is an
error, never a silent overwrite.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kiln.core import nofollow, tools
from kiln.core.errors import BuildError
from kiln.core.paths import join_inside

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
    """Copy every part into dest; returns path -> owning package. Conflicts are errors naming both.

    Parts are package outputs, so both sides go through kiln.core.nofollow: a link is copied as a
    link and never entered, and nothing is written through a link an earlier part left in dest.
    """
    owner: dict[str, str] = {}
    dest.mkdir(parents=True, exist_ok=True)
    for part in parts:
        with (
            nofollow.opened_dir(part.tree, what=f"package '{part.name}'") as src,
            nofollow.opened_dir(dest, what="rootfs") as dst,
        ):
            _merge_dir(src, dst, "", part.name, owner)
    return owner


def _merge_dir(src: int, dst: int, rel: str, package: str, owner: dict[str, str]) -> None:
    """One directory of a part merged into the same directory of the rootfs."""
    for name, info in nofollow.entries_at(src):
        here = f"{rel}/{name}" if rel else name
        existing = nofollow.lstat_at(dst, name)
        if not stat.S_ISDIR(info.st_mode):
            _claim(owner, here, package)
            if existing is not None:
                raise BuildError(
                    f"rootfs conflict: /{here} is a directory in an earlier package but not in '{package}'"
                )
            nofollow.copy_node_at(src, name, dst, name)
            continue
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            raise BuildError(
                f"rootfs conflict: {here} is a directory in '{package}' but not in '{owner.get(here, '?')}'"
            )
        with (
            nofollow.opened_at(src, name, f"/{here}", what=f"package '{package}'") as child,
            nofollow.opened_at(dst, name, f"/{here}", create=True, what="rootfs") as target,
        ):
            _merge_dir(child, target, here, package, owner)
            if existing is None:
                nofollow.copy_attributes_at(child, target)


def _claim(owner: dict[str, str], rel: str, package: str) -> None:
    if rel in owner:
        raise BuildError(f"rootfs conflict: /{rel} is in both '{owner[rel]}' and '{package}'")
    owner[rel] = package


def prune(root: Path) -> list[str]:
    """Remove development files and docs; returns what was removed (relative paths).

    A pruned directory reached through a link is not the rootfs's own: it is left alone, never removed
    with the host's view of the link.
    """
    removed = [rel for rel in PRUNED_DIRS if nofollow.remove_tree_in(root, rel, what="rootfs")]
    for entry in nofollow.walk(root, what="rootfs"):
        if not entry.is_dir and entry.name.endswith(PRUNED_SUFFIXES):
            removed.append(entry.rel)
            nofollow.unlink_at(entry.parent, entry.name)
    return removed


def check_minimal(root: Path) -> None:
    """Refuse a rootfs that carries a shell or a package manager (its links resolved inside it, as it boots)."""
    found = [rel for rel in FORBIDDEN if os.path.lexists(join_inside(root, rel, follow_last=False))]
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

    One strip process per tool and batch of files, not one per file: a rootfs holds about 150. The walk
    and the reads go through kiln.core.nofollow, so strip is handed only regular files whose directories
    are the rootfs's own.
    """
    found: dict[str, list[tuple[str, os.stat_result]]] = {}
    for entry in nofollow.walk(root, what="rootfs"):
        if not entry.is_file or entry.info.st_size < 20:
            continue
        with nofollow.opened_file(entry.parent, entry.name, entry.shown, what="rootfs") as fd:
            machine = elf_machine(os.pread(fd, 20, 0))
        if machine is None:
            continue
        strip = STRIP_FOR_MACHINE.get(machine)
        if strip is None:
            raise BuildError(f"{entry.shown}: an ELF file for machine {machine:#x}, which Kiln does not build for")
        found.setdefault(strip, []).append((entry.rel, entry.info))
    for strip, files in found.items():
        for start in range(0, len(files), STRIP_BATCH):
            batch = files[start : start + STRIP_BATCH]
            tools.run([strip, "--strip-unneeded", *(str(root / rel) for rel, _ in batch)], what=f"{strip} in {root}")
            for rel, info in batch:
                nofollow.set_times_in(root, rel, (info.st_atime_ns, info.st_mtime_ns), what="rootfs")
    return sum(len(files) for files in found.values())


STRIP_BATCH = 200


def largest_files(root: Path, count: int = 10) -> list[tuple[int, str]]:
    sizes = [(e.info.st_size, e.shown) for e in nofollow.walk(root, what="rootfs") if e.is_file]
    return sorted(sizes, reverse=True)[:count]


def clamp_times(root: Path, epoch: int) -> None:
    """Every entry's mtime to SOURCE_DATE_EPOCH, so archives of the tree are reproducible (a link's own)."""
    times = (epoch * 1_000_000_000, epoch * 1_000_000_000)
    for entry in nofollow.walk(root, what="rootfs"):
        nofollow.set_times_at(entry.parent, entry.name, times)
    nofollow.set_top_times(root, times)
