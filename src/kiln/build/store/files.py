"""File-system steps the store needs to be durable and to clean up after builds."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any


def rmtree(path: Path) -> None:
    """Remove a tree even if a build left read-only directories in it."""

    seen: set[str] = set()

    def retry(_func: Callable[..., Any], target: str, exc: tuple[type[BaseException], BaseException, Any]) -> None:
        if not os.path.lexists(target):
            return  # removed by an earlier retry
        if target in seen:
            raise exc[1]
        seen.add(target)
        parent = os.path.dirname(target)
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, stat.S_IMODE(os.lstat(target).st_mode) | stat.S_IRWXU)
            shutil.rmtree(target, onerror=retry)
        else:
            os.unlink(target)

    shutil.rmtree(path, onerror=retry)


def fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
