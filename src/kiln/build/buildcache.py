"""Directories a package keeps between its builds: a step's `cache:` (bldr's cachePaths, BuildKit's cache mounts).

Why: a compiler's own cache (Go's GOCACHE) turns the rebuild of machined after a one-line edit
from a cold compile of the standard library into seconds. The output must not depend on what
the cache holds: keys ignore its contents, and `kiln build --check` rebuilds with empty caches,
so a package whose output leaks its cache fails the check.

Where: `<store>/build-caches/<package>/<arch>/<sha256 of the path, 16 hex>`, names made here,
never spelled by the spec. One build of a package for an arch holds them at a time (a lock that
vanishes with its holder, like the store's). Only the sandbox writes into them, and nothing on
the host reads them; `kiln cache gc --build-caches` removes those no build holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from kiln.build.rootplan import cache_name
from kiln.build.store.locks import acquire, release
from kiln.core.paths import spec_parts

DIRECTORY = "build-caches"


def _package_dir(store_root: Path, package: str, arch: str) -> Path:
    for value, what in ((package, "package name"), (arch, "arch")):
        if spec_parts(value, what) != [value]:
            raise ValueError(f"{what} {value!r} cannot name a cache directory")
    return store_root / DIRECTORY / package / arch


@contextlib.contextmanager
def held(store_root: Path, package: str, arch: str, paths: Iterable[str]) -> Iterator[dict[str, Path]]:
    """Host directories for `paths` (cache path -> directory), locked for this build until exit."""
    wanted = sorted(set(paths))
    if not wanted:
        yield {}
        return
    base = _package_dir(store_root, package, arch)
    base.mkdir(parents=True, exist_ok=True)
    lock = base.parent / f"{arch}.lock"
    fd = acquire(lock, fcntl.LOCK_EX)
    assert fd is not None
    try:
        directories = {path: base / cache_name(path) for path in wanted}
        for directory in directories.values():
            directory.mkdir(parents=True, exist_ok=True)  # a gc may have emptied the package meanwhile
        yield directories
    finally:
        release(lock, fd)


def empty(scratch: Path, paths: Iterable[str]) -> dict[str, Path]:
    """Fresh empty directories for `paths` below `scratch` (a check rebuild proves the cache changes nothing)."""
    directories = {path: scratch / cache_name(path) for path in sorted(set(paths))}
    for directory in directories.values():
        directory.mkdir(parents=True, exist_ok=True)
    return directories


def remove_unheld(store_root: Path) -> list[Path]:
    """Delete every package's caches that no build holds now; returns what went."""
    removed: list[Path] = []
    top = store_root / DIRECTORY
    if not top.is_dir():
        return removed
    for package in sorted(p for p in top.iterdir() if p.is_dir() and not p.is_symlink()):
        for arch in sorted(p for p in package.iterdir() if p.is_dir() and not p.is_symlink()):
            lock = package / f"{arch.name}.lock"
            fd = acquire(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                continue  # a build is using it
            try:
                shutil.rmtree(arch)
                removed.append(arch)
            finally:
                release(lock, fd)
    return removed


def size(store_root: Path) -> int:
    """Bytes the build caches take (regular files; os.walk follows no link the sandbox left there)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(store_root / DIRECTORY):
        for name in filenames:
            info = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total
