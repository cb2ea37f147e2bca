"""Sources put into a build root: fetched files hashed again as they are copied, local paths merged safely."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from kiln.build.sources.cache import SHA256_NAME, forget
from kiln.build.sources.errors import FetchError
from kiln.core.errors import BuildError
from kiln.core.hashing import CHUNK
from kiln.core.paths import PathEscape, join_inside
from kiln.core.treecopy import copy_path
from kiln.pkg.model import Source, excluded


def place_source(fetched: Path, build_dir: Path, destination: str) -> Path:
    """Put a copy of a fetched file at build_dir/destination.

    A copy, not a hard link: steps run with CAP_DAC_OVERRIDE, so a step appending to a
    hard-linked source would corrupt the verified cache for every later build. The
    bytes copied are hashed on the way (a cached file is named by its sha256), so a
    file swapped after Fetcher.fetch verified it never reaches the build.
    """
    target = _target(build_dir, destination)
    _copy_verified(fetched, target)
    target.chmod(0o644)
    return target


def _copy_verified(fetched: Path, target: Path) -> None:
    """Copy `fetched` to `target`, refusing (and forgetting the cached file) if its bytes are not its name's sha256."""
    h = hashlib.sha256()
    with open(os.open(fetched, os.O_RDONLY | os.O_NOFOLLOW), "rb") as source, target.open("wb") as out:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            h.update(chunk)
            out.write(chunk)
    if SHA256_NAME.fullmatch(fetched.name) and h.hexdigest() != fetched.name:
        target.unlink()
        forget(fetched)
        raise FetchError(
            f"cached source {fetched} changed after it was verified (sha256 {h.hexdigest()}); "
            "it was removed: run the build again to fetch it"
        )


def place_local(project_root: Path, source: Source, build_dir: Path) -> Path:
    """Copy a local source (a file or a tree of the project) to build_dir/destination.

    Symlinks are copied as links, never followed, so nothing outside the tree leaks
    in; hidden directories and the source's `exclude` patterns are skipped, as the
    cache key (keys.tree_digest) skips them.
    """
    if source.path is None:
        raise FetchError(f"source {source.destination!r} is not local: fetch it")
    rel = PurePosixPath(source.path)
    if rel.is_absolute() or ".." in rel.parts:
        raise FetchError(f"local source path {source.path!r} must be relative to the project root without '..'")
    root = project_root.resolve()
    origin = project_root / source.path
    if not origin.exists():
        raise FetchError(f"local source path {source.path!r} does not exist under {project_root}")
    if not origin.resolve().is_relative_to(root):
        raise FetchError(f"local source path {source.path!r} leads out of the project ({origin.resolve()})")
    target = _target(build_dir, source.destination)
    ignore = _ignored(origin, source.exclude or ())
    if target.is_dir():  # an earlier source is there: merge without following the links it left
        _merge_local(origin, build_dir, source.destination, ignore)
    elif origin.is_dir():
        shutil.copytree(origin, target, symlinks=True, ignore=ignore)
    else:
        shutil.copy2(origin, target, follow_symlinks=False)
    return target


def _merge_local(origin: Path, build_dir: Path, destination: str, ignore: Callable[[str, list[str]], set[str]]) -> None:
    """Copy `origin` onto a directory an earlier source filled, as finalize copies: the
    destination is walked without following links, so a link the earlier source placed
    (say `x -> /etc/passwd`) is replaced, never written through."""
    with tempfile.TemporaryDirectory(prefix=".local-", dir=build_dir.parent) as tmp:
        staged = Path(tmp) / "tree"
        if origin.is_dir():
            shutil.copytree(origin, staged, symlinks=True, ignore=ignore)
        else:
            staged.mkdir()
            shutil.copy2(origin, staged / origin.name, follow_symlinks=False)
        try:
            copy_path(staged, "/", build_dir, destination)
        except BuildError as exc:
            raise FetchError(f"local source onto {destination!r}: {exc.message}") from None


def _ignored(origin: Path, exclude: tuple[str, ...]) -> Callable[[str, list[str]], set[str]]:
    """copytree's ignore for a local source: hidden directories and paths matching its `exclude` patterns."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        base = Path(directory)
        hidden = {n for n in names if n.startswith(".") and (base / n).is_dir() and not (base / n).is_symlink()}
        rel = base.relative_to(origin)
        return hidden | {n for n in names if excluded((rel / n).as_posix(), exclude)}

    return ignore


def _target(build_dir: Path, destination: str) -> Path:
    """build_dir/destination with its parents made; refuses paths (or symlinked parents) leading out."""
    rel = PurePosixPath(destination)
    parts = [p for p in rel.parts if p != "."]
    if rel.is_absolute() or ".." in parts or not parts:
        raise FetchError(f"destination {destination!r} must be a relative path inside the build directory")
    root = build_dir.resolve()
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() and not current.resolve().is_relative_to(root):
            raise FetchError(f"destination {destination!r} leads out of the build directory through a symlink")
    try:  # the join itself resolves links inside the build directory, never with the host's view
        target = join_inside(root, destination, follow_last=False, what="destination")
    except PathEscape as exc:
        raise FetchError(exc.message) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    return target
