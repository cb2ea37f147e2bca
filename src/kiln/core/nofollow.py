"""Host-side work on a tree someone else wrote, never through one of its links.

Kiln runs as root over trees a package, an extension or a registry wrote: package outputs, extension
layers, the merged rootfs, pulled trees. Any of them may hold a link to anywhere on the host, planted
where Kiln will write, chmod, rename or walk. Everything here starts at the tree's top (a path Kiln
chose) and goes one component at a time through directory descriptors opened with O_NOFOLLOW; writes,
modes, times and renames act on names relative to those descriptors. Where a directory or a file is
expected, a link is refused with a LinkRefused naming the entry (`/usr/lib/modules is a symbolic
link`); a walk lists links but never enters them. Copies keep links as links (kiln.core.treecopy).

Host-side callers that must use it (tests/unit/test_nofollow_callers.py fails when one of these
modules makes a raw open, write, chmod, utime, rename, walk or copy call instead):
- kiln.signing.modules: ModuleSigner.sign_tree (reads, writes and renames every module it signs);
- kiln.rootfs.extension: check_paths, layer_tree (the copy and Kiln's manifest), has_modules,
  modules_layer (the merged copy depmod runs on, the index files), kernel_release, module_files, vermagic;
- kiln.rootfs.tree: merge, prune, check_minimal, strip_binaries, largest_files, clamp_times;
- kiln.rootfs.assemble: kernel_parts, copy_vmlinuz and the copy of /init (also kiln.image.imager's
  vmlinuz for a profile that brings its own initramfs);
- kiln.image.imager: package_file (machined for the installer image and for `kiln install`, which runs
  it on the host from that copy); kiln.image.arch: loader_for (GRUB's arm64 EFI modules, read by
  grub-mkimage: no link on the way or below);
- kiln.build.check: keep_evidence's copies of the stored and rebuilt files that differ (both trees a
  build wrote; the offsets and diffoscope reports are made from the copies); kiln.signing.rebuild.compare
  and kiln.signing.rebuild.checkout: disk_digest, _copy_release_file, _sha256_in, kiln_of (a release's and
  a checkout's files, hashed or copied out for diffoscope).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.core import treecopy
from kiln.core.errors import BuildError, printable
from kiln.core.paths import spec_parts

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO never hangs us


class LinkRefused(BuildError):
    """A link where Kiln needs a file or a directory of the tree itself."""


@dataclass(frozen=True)
class Entry:
    """One entry of a walk: its path below the walk's top, its name, and its parent's descriptor
    (valid until the walk moves on), with the entry's own lstat."""

    rel: str
    name: str
    parent: int
    info: os.stat_result

    @property
    def shown(self) -> str:
        return "/" + self.rel

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.info.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.info.st_mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.info.st_mode)


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def refuse(what: str, shown: str, needed: str = "a directory") -> LinkRefused:
    """The error for a link found where `needed` was, naming the entry (escaped: the tree chose its name)."""
    shown = printable(shown)
    return LinkRefused(f"{what}: {shown} is a symbolic link where Kiln needs {needed}; it never follows a tree's links")


def lstat_at(parent: int, name: str) -> os.stat_result | None:
    """The entry `name` of directory `parent` itself (a link is not followed), or None when missing."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _open_child(parent: int, name: str, shown: str, *, create: bool, what: str) -> int:
    """A descriptor of directory `name` in `parent`: made when missing with `create`; a link is refused."""
    info = lstat_at(parent, name)
    if info is None and create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        info = lstat_at(parent, name)
    if info is None:
        raise FileNotFoundError(errno.ENOENT, f"{what}: {shown} does not exist")
    if stat.S_ISLNK(info.st_mode):
        raise refuse(what, shown)
    if not stat.S_ISDIR(info.st_mode):
        raise BuildError(f"{what}: {printable(shown)} is not a directory")
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as error:  # swapped for a link or a file since the lstat
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refuse(what, shown) from None
        raise


@contextlib.contextmanager
def opened_dir(top: Path, rel: str = "", *, create: bool = False, what: str = "tree") -> Iterator[int]:
    """A descriptor of `top`/`rel`, every component below `top` a real directory (a link is refused by name).

    `top` is a path Kiln chose. Missing directories are made with `create`, else FileNotFoundError.
    """
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = ""
    try:
        for name in spec_parts(rel, what):
            walked = _join(walked, name)
            child = _open_child(fd, name, "/" + walked, create=create, what=what)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def is_dir(top: Path, rel: str, *, what: str = "tree") -> bool:
    """Whether `top`/`rel` is a directory of the tree (False when missing or not one); a link at it or on the
    way is refused by name."""
    info = lstat_in(top, rel, what=what)
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise refuse(what, "/" + "/".join(spec_parts(rel, what)))
    return info is not None and stat.S_ISDIR(info.st_mode)


def lstat_in(top: Path, rel: str, *, what: str = "tree") -> os.stat_result | None:
    """The entry `top`/`rel` itself (a link not followed) or None when missing; a link on the way is refused."""
    parent, name = _split(rel, what)
    try:
        with opened_dir(top, parent, what=what) as fd:
            return lstat_at(fd, name)
    except FileNotFoundError:
        return None


def _split(rel: str, what: str) -> tuple[str, str]:
    parts = spec_parts(rel, what)
    if not parts:
        raise BuildError(f"{what}: a file path is needed, not the tree's top")
    return "/".join(parts[:-1]), parts[-1]


def walk(top: Path, rel: str = "", *, what: str = "tree") -> Iterator[Entry]:
    """Every entry below `top`/`rel`, sorted, each directory before its contents; links are listed, never
    entered. `Entry.rel` is relative to `top`."""
    with opened_dir(top, rel, what=what) as fd:
        yield from _walk(fd, "/".join(spec_parts(rel, what)), what)


def _walk(fd: int, rel: str, what: str) -> Iterator[Entry]:
    for name in sorted(os.listdir(fd)):
        info = lstat_at(fd, name)
        if info is None:
            continue
        entry = Entry(_join(rel, name), name, fd, info)
        yield entry
        if entry.is_dir:
            child = _open_child(fd, name, entry.shown, create=False, what=what)
            try:
                yield from _walk(child, entry.rel, what)
            finally:
                os.close(child)


def entries_at(fd: int) -> list[tuple[str, os.stat_result]]:
    """The entries of the directory open as `fd`, each with its own lstat, sorted by name."""
    found = ((name, lstat_at(fd, name)) for name in sorted(os.listdir(fd)))
    return [(name, info) for name, info in found if info is not None]


def children(top: Path, rel: str = "", *, what: str = "tree") -> list[tuple[str, os.stat_result]]:
    """The entries of directory `top`/`rel` (each one's own lstat), sorted; a link on the way is refused."""
    with opened_dir(top, rel, what=what) as fd:
        return entries_at(fd)


@contextlib.contextmanager
def opened_at(parent: int, name: str, shown: str, *, create: bool = False, what: str = "tree") -> Iterator[int]:
    """A descriptor of directory `name` in `parent` (made when missing with `create`); a link is refused."""
    fd = _open_child(parent, name, shown, create=create, what=what)
    try:
        yield fd
    finally:
        os.close(fd)


def copy_node_at(parent: int, name: str, dest_parent: int, dest_name: str) -> None:
    """Entry `name` of `parent` copied as itself (a link as a link, a directory with all below it) to
    `dest_parent`/`dest_name`, as `cp -a` would, never through a link on either side."""
    treecopy.copy_node(parent, name, dest_parent, dest_name)


def copy_attributes_at(src: int, dst: int) -> None:
    """Owner, mode, extended attributes and times of directory or file `src` given to `dst` (descriptors)."""
    treecopy.copy_attributes(src, dst)


def refuse_links(top: Path, rel: str, *, what: str) -> None:
    """Refuse, naming it, the first link at or below `top`/`rel` (missing is fine)."""
    try:
        for entry in walk(top, rel, what=what):
            if entry.is_link:
                raise refuse(what, entry.shown, "a file or directory")
    except FileNotFoundError:
        return


@contextlib.contextmanager
def opened_file(parent: int, name: str, shown: str, *, what: str = "tree") -> Iterator[int]:
    """A read descriptor of regular file `name` in `parent`; a link is refused by name, anything else not a file too."""
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise refuse(what, shown, "a file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BuildError(f"{what}: {printable(shown)} is not a regular file")
        yield fd
    finally:
        os.close(fd)


def read_at(parent: int, name: str, shown: str, *, limit: int | None = None, what: str = "tree") -> bytes:
    """All of regular file `name` in `parent` (never through a link); over `limit` bytes is refused."""
    with opened_file(parent, name, shown, what=what) as fd:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise BuildError(f"{what}: {shown} is over {limit >> 20} MiB")
        chunks = []
        while chunk := os.read(fd, max(size, 1 << 16)):
            chunks.append(chunk)
        return b"".join(chunks)


def read_walked(path: Path, *, limit: int | None = None, what: str = "tree") -> bytes:
    """A file a no-follow walk of its tree just listed (its directories are the tree's own), read by its full
    path without following a link at its end; for callers that keep paths, not descriptors."""
    with opened_dir(path.parent) as fd:
        return read_at(fd, path.name, str(path), limit=limit, what=what)


def read_in(top: Path, rel: str, *, limit: int | None = None, what: str = "tree") -> bytes:
    """`read_at` by a path below `top`, no link followed on the way."""
    parent, name = _split(rel, what)
    with opened_dir(top, parent, what=what) as fd:
        return read_at(fd, name, "/" + _join(parent, name), limit=limit, what=what)


def write_at(
    parent: int,
    name: str,
    data: bytes,
    shown: str,
    *,
    mode: int = 0o644,
    times_ns: tuple[int, int] | None = None,
    what: str = "tree",
) -> None:
    """`data` as file `name` in `parent`, whole or not at all: a new inode under a fresh name (O_CREAT|O_EXCL|
    O_NOFOLLOW, so nothing planted is ever opened) gets its mode and times, then is renamed over `name`.

    A link or a directory at `name` is refused: a new inode also leaves a hard-linked store file as it was.
    """
    existing = lstat_at(parent, name)
    if existing is not None and stat.S_ISLNK(existing.st_mode):
        raise refuse(what, shown, "a file")
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise BuildError(f"{what}: {shown} is a directory where Kiln writes a file")
    temp, fd = _create_temp(parent, name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if times_ns is not None:
                os.utime(fd, ns=times_ns)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise


def _create_temp(parent: int, name: str) -> tuple[str, int]:
    """A new empty file beside `name` under a name nobody planted (retried if one was)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(16):
        temp = f".{name[:200]}.kiln-{secrets.token_hex(6)}"
        try:
            return temp, os.open(temp, flags, 0o600, dir_fd=parent)
        except FileExistsError:
            continue
    raise BuildError(f"cannot make a temporary file beside {name}")


def write_in(top: Path, rel: str, data: bytes, *, mode: int = 0o644, what: str = "tree") -> None:
    """`write_at` by a path below `top`: missing directories made, a link on the way refused by name."""
    parent, name = _split(rel, what)
    with opened_dir(top, parent, create=True, what=what) as fd:
        write_at(fd, name, data, "/" + _join(parent, name), mode=mode, what=what)


def set_mode_at(parent: int, name: str, mode: int, shown: str, *, what: str = "tree") -> None:
    """chmod of file or directory `name` in `parent` through a descriptor opened without following a link."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise refuse(what, shown, "a file") from None
        raise
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def set_times_at(parent: int, name: str, times_ns: tuple[int, int]) -> None:
    """The times of entry `name` in `parent` itself: a link's own times, never its target's."""
    os.utime(name, ns=times_ns, dir_fd=parent, follow_symlinks=False)


def set_times_in(top: Path, rel: str, times_ns: tuple[int, int], *, what: str = "tree") -> None:
    """`set_times_at` by a path below `top`; a link on the way is refused by name."""
    parent, name = _split(rel, what)
    with opened_dir(top, parent, what=what) as fd:
        set_times_at(fd, name, times_ns)


def set_top_times(top: Path, times_ns: tuple[int, int]) -> None:
    """The times of the tree's top directory (a path Kiln chose), through its descriptor."""
    with opened_dir(top) as fd:
        os.utime(fd, ns=times_ns)


def unlink_at(parent: int, name: str) -> None:
    """Remove entry `name` (a file or a link, never what a link points to) from `parent`."""
    os.unlink(name, dir_fd=parent)


def remove_tree_in(top: Path, rel: str, *, what: str = "tree") -> bool:
    """Remove directory `top`/`rel` and everything below it; False (nothing removed) when it is missing,
    not a directory, or reached through a link (then it is not this tree's directory)."""
    parent, name = _split(rel, what)
    try:
        with opened_dir(top, parent, what=what) as fd:
            info = lstat_at(fd, name)
            if info is None or not stat.S_ISDIR(info.st_mode):
                return False
            shutil.rmtree(name, dir_fd=fd)  # fd-based: never follows a link below it either
            return True
    except (FileNotFoundError, BuildError):  # LinkRefused among them
        return False


def copy_tree(src: Path, src_rel: str, dest: Path, dest_rel: str = "", *, links: bool = True, what: str) -> None:
    """`src`/`src_rel` (a directory) merged into `dest`/`dest_rel` (made if missing) as `cp -a` would:
    modes, owners, times, links copied as links. A link on the way to either is refused by name; with
    `links=False` any link below `src_rel` is refused too (a tree a host tool then reads)."""
    if not links:
        refuse_links(src, src_rel, what=what)
    with opened_dir(src, src_rel, what=what) as source, opened_dir(dest, dest_rel, create=True, what=what) as target:
        treecopy.copy_dir(source, target)


def copy_file_in(top: Path, rel: str, dest: Path, *, mode: int, what: str = "tree") -> None:
    """Regular file `top`/`rel` (a link on the way or at the end refused by name) copied to `dest`, a new
    file at a path Kiln chose, with `mode`."""
    parent, name = _split(rel, what)
    with opened_dir(top, parent, what=what) as fd, opened_file(fd, name, "/" + _join(parent, name), what=what) as src:
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            treecopy.copy_data(src, out)
            os.fchmod(out, mode)
        finally:
            os.close(out)
