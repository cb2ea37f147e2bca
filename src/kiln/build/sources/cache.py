"""The source cache: a cached file is never trusted for being there.

Before each use its stat (size, mtime_ns, ctime_ns, inode, device) must match the stamp
written when it was last hashed (`<sha256>.verified`), or it is hashed again, and a file
whose bytes no longer match is removed and fetched again. ctime cannot be set back from user
space, so replacing or editing the bytes changes the stat. `kiln cache verify` re-hashes
every cached source regardless of stamps (verify_sources).

Layout of `$KILN_CACHE/sources/`:
    <sha256>            the verified file (mode 0444)
    <sha256>.checked    the archive check's verdict for those bytes (CHECK_VERSION first)
    <sha256>.verified   the stat stamp of the last full hash
    .part-*             downloads and markers being written; a download holds an
                        flock on its file while it is written, so remove_stale_partials
                        only removes files no live process holds (and, for markers,
                        only old ones)
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.core.hashing import file_sha256

CHECKED_SUFFIX = ".checked"
STAMP_SUFFIX = ".verified"
PART_PREFIX = ".part-"
STALE_PARTIAL_SECONDS = 600.0
SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def _stamp(sha: str, info: os.stat_result) -> str:
    return f"{sha} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino} {info.st_dev}\n"


def write_atomic(path: Path, text: str) -> None:
    """Write a small marker next to its file by rename, so a reader sees all of it or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PART_PREFIX)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_stamp(path: Path, sha: str) -> None:
    """Record the stat of a file just hashed to `sha`; only a matching stat lets a later use skip the hash."""
    write_atomic(path.with_name(path.name + STAMP_SUFFIX), _stamp(sha, os.lstat(path)))


def still_verified(path: Path, sha: str) -> bool:
    """True if the cached `path` still holds `sha`'s bytes; a damaged file is removed (and False returned).

    Cheap when the stamp matches the file's stat; otherwise a full hash decides.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(info.st_mode):
        try:
            if path.with_name(path.name + STAMP_SUFFIX).read_text() == _stamp(sha, info):
                return True
        except OSError:
            pass
        try:
            intact = file_sha256(path, follow_links=False) == sha
        except OSError:  # unreadable counts as damaged: fetched again
            intact = False
        if intact:
            write_stamp(path, sha)
            return True
    forget(path)
    return False


def forget(path: Path) -> None:
    """Remove a cached source and what was recorded about it."""
    for stale in (path, path.with_name(path.name + CHECKED_SUFFIX), path.with_name(path.name + STAMP_SUFFIX)):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)


def verify_sources(cache: Path) -> tuple[int, list[str]]:
    """Re-hash every cached source (stamps ignored): (files checked, problems).

    A file whose bytes do not match its name is removed, so no build uses it; the
    next build fetches it again.
    """
    directory = cache / "sources"
    if not directory.is_dir():
        return 0, []
    problems: list[str] = []
    checked = 0
    for path in sorted(directory.iterdir()):
        if not SHA256_NAME.fullmatch(path.name):
            continue
        checked += 1
        try:
            actual = file_sha256(path, follow_links=False) if stat.S_ISREG(os.lstat(path).st_mode) else None
        except OSError as exc:
            actual, found = None, f"cannot be read ({exc.strerror})"
        else:
            found = f"has sha256 {actual}" if actual else "is not a regular file"
        if actual == path.name:
            write_stamp(path, actual)
            continue
        problems.append(f"source {path.name} {found}: removed, it will be fetched again")
        forget(path)
    return checked, problems


def stale_partials(cache: Path, older_than: float = STALE_PARTIAL_SECONDS) -> list[Path]:
    """Partial downloads and markers under sources/ that no live process holds and that are old enough.

    A download flocks its `.part-*` file until it is renamed or removed, so a file we
    can lock belongs to a process that died. The age guard covers the instant between
    mkstemp and flock, and markers written without a lock.
    """
    directory = cache / "sources"
    if not directory.is_dir():
        return []
    cutoff = time.time() - older_than
    found: list[Path] = []
    for path in sorted(directory.glob(PART_PREFIX + "*")):
        with _unless_held(path) as free:
            if free and os.lstat(path).st_mtime < cutoff:
                found.append(path)
    return found


def remove_stale_partials(cache: Path, older_than: float = STALE_PARTIAL_SECONDS) -> list[Path]:
    """Remove what stale_partials finds, each under its lock so a download cannot take it meanwhile."""
    removed: list[Path] = []
    for path in stale_partials(cache, older_than):
        with _unless_held(path) as free:
            if free:
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


@contextmanager
def _unless_held(path: Path) -> Iterator[bool]:
    """Hold `path`'s flock for the block if nobody else does: yields False if it is held or gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        yield False
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
