"""Copying paths out of a tree someone else wrote (finalize, sources, the docker runner), as `cp -a` did, safely.

This runs on the host, as root, over a tree a package wrote, so nothing here follows a
symlink with the host's view and no spec string reaches a shell. Paths are walked one
component at a time through directory descriptors opened with O_NOFOLLOW; a symlink on
the way is resolved as if the tree were `/` (like chroot, as Docker and BuildKit resolve
paths in a container), and one at the end of a `from` is copied as a symlink. The
destination is walked the same way inside `out`, so a later entry cannot write through a
link an earlier entry copied. What `cp -a` kept is kept: modes, ownership, times (ns),
extended attributes (best effort, as `cp -a`), hard links within one entry, devices and fifos.

Rules (one for every runner; the docker runner applies them to the paths it copied out
of its container): a directory's contents, and its own mode, owner and times, go to
`to`; a file, symlink or device is copied as itself, into `to` when `to` is a directory;
a `from` that does not exist is an error naming it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from kiln.core.errors import BuildError
from kiln.core.paths import MAX_SYMLINKS, PathEscape, spec_parts

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20  # as kiln.core.hashing.CHUNK; not imported: the mount helper runs this module per step, kept light


class _Missing(Exception):
    """A component of a path does not exist."""


def finalize_tree(root: Path, copies: list[tuple[str, str]], out: Path) -> None:
    """Copy each `from` of `root` to `to` under `out`, in order; BuildError on the first failure.

    `out` (a path Kiln chose) is made if missing, as the shell finalize's `mkdir -p` did.
    """
    os.makedirs(out, exist_ok=True)
    for source, to in copies:
        copy_path(root, source, out, to)


def copy_path(root: Path, source: str, out: Path, to: str) -> None:
    """One finalize entry: `source` resolved inside `root`, copied to `to` resolved inside `out`."""
    src_parts = spec_parts(source, "finalize 'from'")
    dst_parts = spec_parts(to, "finalize 'to'")
    with _open_top(root) as root_fd, _open_top(out) as out_fd:
        try:
            parent, name = _resolve(root_fd, src_parts, follow_last=False, create=False)
        except _Missing:
            raise BuildError(f"finalize: {source} does not exist in the build root") from None
        with _closing(parent):
            info = _lstat(parent, name)
            if info is None:
                raise BuildError(f"finalize: {source} does not exist in the build root")
            if stat.S_ISDIR(info.st_mode):
                _copy_dir_to(parent, name, info, out_fd, dst_parts, to)
            else:
                _copy_node_to(parent, name, out_fd, dst_parts)


def _copy_dir_to(parent: int, name: str, info: os.stat_result, out_fd: int, dst_parts: list[str], to: str) -> None:
    """A directory's contents and attributes (as stat'ed before the copy) merged into `to`, made if missing."""
    dparent, dname = _resolve(out_fd, dst_parts, follow_last=True, create=True)
    with _closing(dparent):
        existing = _lstat(dparent, dname)
        if existing is None:
            os.mkdir(dname, 0o700, dir_fd=dparent)
        elif not stat.S_ISDIR(existing.st_mode):
            raise BuildError(f"finalize: cannot copy a directory onto {to}, which is not a directory")
        with _open_dir(parent, name) as src, _open_dir(dparent, dname) as dst:
            copier = _Copier(dst)
            copier.contents(src, dst, ())
            copier.attributes(src, dst, info)


def _copy_node_to(parent: int, name: str, out_fd: int, dst_parts: list[str]) -> None:
    """A file, symlink or device copied as itself to `to`, or into `to` when that is a directory."""
    dparent, dname = _resolve(out_fd, dst_parts, follow_last=False, create=True)
    with _closing(dparent):
        existing = _lstat(dparent, dname)
        if existing is not None and stat.S_ISLNK(existing.st_mode):
            # cp copies into the directory a destination link points to; here resolved inside `out`.
            lparent, lname = _resolve(out_fd, dst_parts, follow_last=True, create=False)
            with _closing(lparent):
                target = _lstat(lparent, lname)
                if target is not None and stat.S_ISDIR(target.st_mode):
                    with _open_dir(lparent, lname) as directory:
                        _Copier(directory).node(parent, name, directory, name, ())
                    return
        elif existing is not None and stat.S_ISDIR(existing.st_mode):
            with _open_dir(dparent, dname) as directory:
                _Copier(directory).node(parent, name, directory, name, ())
            return
        _Copier(dparent).node(parent, name, dparent, dname, ())


def copy_dir(src: int, dst: int) -> None:
    """Directory `src`'s contents merged into directory `dst`, then its own mode and times (both descriptors
    opened without following a link; kiln.core.nofollow's copies)."""
    copier = _Copier(dst)
    copier.contents(src, dst, ())
    copier.attributes(src, dst, os.fstat(src))


def copy_node(sparent: int, sname: str, dparent: int, dname: str) -> None:
    """One node (a directory with everything below it) copied as itself, as `cp -a`; hard links kept within it."""
    _Copier(dparent).node(sparent, sname, dparent, dname, (dname,))


def copy_attributes(src: int, dst: int) -> None:
    """`cp -a`'s attributes of the node open as `src` given to the one open as `dst`."""
    _Copier.attributes(src, dst, os.fstat(src))


class _Copier:
    """Copies nodes as `cp -a`; hard links are kept among the nodes one copier writes below `top`."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.links: dict[tuple[int, int], tuple[str, ...]] = {}

    def contents(self, src: int, dst: int, rel: tuple[str, ...]) -> None:
        for name in sorted(os.listdir(src)):
            self.node(src, name, dst, name, (*rel, name))

    def node(self, sparent: int, sname: str, dparent: int, dname: str, rel: tuple[str, ...]) -> None:
        """Copy one node (a directory with everything below it) from sparent/sname to dparent/dname."""
        info = os.stat(sname, dir_fd=sparent, follow_symlinks=False)
        existing = _lstat(dparent, dname)
        if stat.S_ISDIR(info.st_mode):
            if existing is None:
                os.mkdir(dname, 0o700, dir_fd=dparent)
            elif not stat.S_ISDIR(existing.st_mode):
                raise BuildError(f"finalize: cannot overwrite non-directory {'/'.join(rel) or dname} with a directory")
            with _open_dir(sparent, sname) as src, _open_dir(dparent, dname) as dst:
                self.contents(src, dst, rel)
                self.attributes(src, dst, info)
            return
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                raise BuildError(f"finalize: cannot overwrite directory {'/'.join(rel) or dname} with a non-directory")
            os.unlink(dname, dir_fd=dparent)
        if info.st_nlink > 1 and rel:
            first = self.links.get((info.st_dev, info.st_ino))
            if first is not None:
                self._link(first, dparent, dname)
                return
            self.links[(info.st_dev, info.st_ino)] = rel
        if stat.S_ISREG(info.st_mode):
            self._file(sparent, sname, dparent, dname, info)
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(sname, dir_fd=sparent), dname, dir_fd=dparent)
            _chown(dname, info, dparent)
            os.utime(dname, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dparent, follow_symlinks=False)
        else:
            os.mknod(dname, stat.S_IFMT(info.st_mode) | 0o600, info.st_rdev, dir_fd=dparent)
            _chown(dname, info, dparent)
            os.chmod(dname, stat.S_IMODE(info.st_mode), dir_fd=dparent)  # just made: not a link
            os.utime(dname, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dparent, follow_symlinks=False)

    def _file(self, sparent: int, sname: str, dparent: int, dname: str, info: os.stat_result) -> None:
        src = os.open(sname, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sparent)
        try:
            dst = os.open(
                dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dparent
            )
            try:
                copy_data(src, dst)
                self.attributes(src, dst, info)
            finally:
                os.close(dst)
        finally:
            os.close(src)

    @staticmethod
    def attributes(src: int, dst: int, info: os.stat_result) -> None:
        """Owner first (chown clears file capabilities), then xattrs, mode, and times last."""
        with contextlib.suppress(PermissionError):  # cp -a as non-root keeps going too
            os.fchown(dst, info.st_uid, info.st_gid)
        _copy_xattrs(src, dst)
        os.fchmod(dst, stat.S_IMODE(info.st_mode))
        os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))

    def _link(self, first: tuple[str, ...], dparent: int, dname: str) -> None:
        """A hard link to the copy of an inode already copied (all directories on the way are ours)."""
        fds: list[int] = []
        try:
            current = self.top
            for part in first[:-1]:
                current = os.open(part, _DIR, dir_fd=current)
                fds.append(current)
            os.link(first[-1], dname, src_dir_fd=current, dst_dir_fd=dparent, follow_symlinks=False)
        finally:
            for fd in fds:
                os.close(fd)


def _resolve(top: int, parts: list[str], *, follow_last: bool, create: bool) -> tuple[int, str]:
    """(a new descriptor of the directory holding the last component, its name), resolved inside `top`.

    Symlinks are resolved as if `top` were `/`; the last one only with `follow_last`. "."
    names the directory itself when the path resolves to `top` or to a link to a directory.
    With `create`, missing directories on the way are made as `mkdir -p` makes them; without,
    a missing one raises _Missing (the last component may be missing either way).
    """
    stack = [os.dup(top)]
    pending = list(reversed(parts))
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":  # only from a link target; stops at top
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            last = all(p in ("", ".") for p in pending)
            info = _lstat(stack[-1], name)
            if info is None:
                if last:
                    return stack.pop(), name
                info = _make_missing(stack[-1], name, create=create)
            if stat.S_ISLNK(info.st_mode) and (follow_last or not last):
                links = _follow(stack, pending, name, links)
                continue
            if last:
                return stack.pop(), name
            if not stat.S_ISDIR(info.st_mode):
                raise _Missing(name)
            stack.append(os.open(name, _DIR, dir_fd=stack[-1]))
        return stack.pop(), "."
    finally:
        for fd in stack:
            os.close(fd)


def _make_missing(parent: int, name: str, *, create: bool) -> os.stat_result:
    """A missing directory on the way: made (as `mkdir -p` would), or _Missing."""
    if not create:
        raise _Missing(name)
    os.mkdir(name, 0o777, dir_fd=parent)
    return os.stat(name, dir_fd=parent, follow_symlinks=False)


def _follow(stack: list[int], pending: list[str], name: str, links: int) -> int:
    """Put link `name`'s target in its place; an absolute one restarts at the top (stack[0]). Returns the count."""
    links += 1
    if links > MAX_SYMLINKS:
        raise PathEscape(f"finalize: too many levels of symbolic links at {name!r}")
    target = os.readlink(name, dir_fd=stack[-1])
    if target.startswith("/"):
        for fd in stack[1:]:
            os.close(fd)
        del stack[1:]
    pending.extend(reversed(target.split("/")))
    return links


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


@contextlib.contextmanager
def _open_top(path: Path) -> Iterator[int]:
    """A descriptor of a tree's top, a path Kiln chose (so following links in it is fine)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    with _closing(fd):
        yield fd


@contextlib.contextmanager
def _open_dir(parent: int, name: str) -> Iterator[int]:
    fd = os.open(name, _DIR, dir_fd=parent)
    with _closing(fd):
        yield fd


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _chown(name: str, info: os.stat_result, parent: int) -> None:
    with contextlib.suppress(PermissionError):
        os.chown(name, info.st_uid, info.st_gid, dir_fd=parent, follow_symlinks=False)


def copy_data(src: int, dst: int) -> None:
    """All of src's bytes into dst: sendfile, or read and write where the kernel refuses it."""
    try:
        while os.sendfile(dst, src, None, CHUNK):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    while chunk := os.read(src, CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


def _copy_xattrs(src: int, dst: int) -> None:
    """Extended attributes (file capabilities, ACLs), skipping what this filesystem refuses, as cp -a does."""
    try:
        names = os.listxattr(src)
    except OSError:
        return
    for attr in names:
        with contextlib.suppress(OSError):
            os.setxattr(dst, attr, os.getxattr(src, attr))
