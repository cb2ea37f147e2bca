"""Lock files that vanish with their last holder: flock(2) on `<name>.lock`, unlinked on release.

Generic, like osbuild's fscache locks: the kernel drops a flock when its process dies, so no
stale lock can block a later run. Race: a releaser unlinks the file while another process
waits on it; the waiter then holds a lock on a file nobody else can find. So `acquire` checks
after locking that the file it holds is still the one at the path, and starts over if not.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def acquire(path: Path, flags: int) -> int | None:
    """flock `path` and return the fd, or None if LOCK_NB and it is held elsewhere.

    Lock files are unlinked when released, so after locking we check that the file we
    hold is still the one at `path`; if a releaser unlinked it meanwhile, start over.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            on_disk = os.stat(path)
            held = os.fstat(fd)
            if (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def release(path: Path, fd: int) -> None:
    """Unlink the lock file if nobody else holds or waits on it, then drop the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # a shared holder remains; the last one out removes the file
    else:
        with suppress(FileNotFoundError):
            os.unlink(path)
    os.close(fd)


@contextmanager
def held_if_free(path: Path) -> Iterator[bool]:
    """`path` locked exclusively for the block (True), or False at once when another holds it: for
    what must leave alone whatever is in use, without waiting for it."""
    fd = acquire(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        release(path, fd)
