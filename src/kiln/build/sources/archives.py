"""The archive check: tar (every compression builds use) and zip, read to the end before anything unpacks them.

Builds unpack archives with ordinary `tar`, which follows what the archive says: members that
would land outside the extraction root (absolute paths, `..`, links out, device nodes) are
refused here, once per cached file.

Over 400 lines on purpose: the readers (tar through every decompressor, zip) and the rules they feed
are one safety check, read top to bottom; split, a reader could drift from the rules.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from kiln.build.sources.errors import FetchError
from kiln.core.hashing import CHUNK

# First line of a `.checked` verdict; a verdict of an older check_archive (another first line) is redone.
CHECK_VERSION = "check 2\n"


class _Escape(Exception):
    """A link target that leaves the extraction root, or loops."""


class _Links:
    """Resolves paths inside an archive the way the kernel would after extraction."""

    MAX_DEPTH = 40

    def __init__(self, symlinks: dict[str, str]) -> None:
        self.symlinks = symlinks

    def resolve(self, base: list[str], target: str, depth: int = 0) -> list[str]:
        """Components of `target` (relative to directory `base`) with every archive symlink followed."""
        if depth > self.MAX_DEPTH:
            raise _Escape("is part of a symlink loop")
        if target.startswith("/"):
            raise _Escape("points to an absolute path")
        current = list(base)
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not current:
                    raise _Escape("points outside the extraction root")
                current.pop()
                continue
            current.append(part)
            link = self.symlinks.get("/".join(current))
            if link is not None:
                current = self.resolve(current[:-1], link, depth + 1)
        return current


MemberKind = Literal["file", "dir", "symlink", "hardlink", "device", "other"]


@dataclass(frozen=True)
class Member:
    """One archive member as the checks see it, whatever the archive format."""

    name: str
    kind: MemberKind
    link: str = ""


# Magic numbers of what `tar -xf` (or unzip) would unpack; compressions Python lacks go through their tool.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"LZIP", "lzip"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"\x5d\x00\x00", "lzma"),  # lzma-alone: GNU tar goes by the .tar.lzma suffix, these bytes catch any name
    (b"\x89LZO", "lzop"),
    (b"\x1f\x9d", "compress"),
    (b"\x04\x22\x4d\x18", "lz4"),
)
# --strip-components levels checked when the caller does not know the one used (see check_archive).
STRIP_LEVELS = (0, 1)
_TOOLS = {"zstd": "zstd", "lzip": "lzip"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TAIL_KEEP = 1 << 20


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Tail:
    """A forward-only reader that remembers the last bytes it handed out.

    tarfile stops silently at an unreadable header once past the first member; GNU tar
    skips it and extracts what follows. Keeping the tail lets the check look at the
    block where tarfile stopped and refuse unless it is a clean end of archive.
    """

    def __init__(self, raw: _Readable) -> None:
        self._raw = raw
        self.done = 0
        self._tail = bytearray()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.done += len(data)
        self._tail += data
        if len(self._tail) > 2 * _TAIL_KEEP:
            del self._tail[:-_TAIL_KEEP]
        return data

    def since(self, offset: int) -> bytes:
        """What was handed out from `offset` on (offset must lie in the kept tail)."""
        start = offset - (self.done - len(self._tail))
        if start < 0:
            raise ValueError(f"offset {offset} is no longer kept")
        return bytes(self._tail[start:])

    def drain_is_zero(self) -> bool:
        """Read to the end; True if everything left is zero bytes (tar's padding)."""
        while chunk := self._raw.read(CHUNK):
            self.done += len(chunk)
            if chunk.count(0) != len(chunk):
                return False
        return True


def _sniff(path: Path) -> str | None:
    """The container or compression format by magic number, or None (plain tar or no archive)."""
    with path.open("rb") as handle:
        head = handle.read(8)
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


@contextmanager
def _decompressed(path: Path, kind: str | None, shown: str) -> Iterator[_Readable]:
    """The bytes of `path` after its compression; zstd and lzip through their tools (argv, no shell)."""
    if kind is None:
        with path.open("rb") as handle:
            yield handle
        return
    if kind == "gzip":
        with gzip.open(path, "rb") as gz:
            yield gz
        return
    if kind == "bzip2":
        with bz2.open(path, "rb") as bz:
            yield bz
        return
    if kind in ("xz", "lzma"):
        with lzma.open(path, "rb", format=lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE) as xz:
            yield xz
        return
    tool = shutil.which(_TOOLS.get(kind, kind))
    if kind not in _TOOLS:
        raise FetchError(f"cannot check archive {shown}: {kind}-compressed data cannot be inspected, so it is refused")
    if tool is None:
        raise FetchError(
            f"cannot check archive {shown}: it is {kind}-compressed and {_TOOLS[kind]} is not installed "
            f"(apt-get install {_TOOLS[kind]}); an archive that cannot be checked is refused"
        )
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [tool, "-dc", "--", str(path)], stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        try:
            yield proc.stdout
            while proc.stdout.read(CHUNK):
                pass
            if proc.wait() != 0:
                errors.seek(0)
                said = errors.read().decode(errors="replace").strip()
                raise FetchError(f"cannot read archive {shown}: {_TOOLS[kind]} -dc failed: {said}")
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _looks_like_tar(block: bytes) -> bool:
    """A first block GNU tar would take for a tar header: ustar magic or a matching checksum."""
    if len(block) < tarfile.BLOCKSIZE:
        return False
    if block[257:262] == b"ustar":
        return True
    field = block[148:156].replace(b"\0", b" ").strip()
    if not field or not all(48 <= c <= 55 for c in field):
        return False
    return int(field, 8) in tarfile.calc_chksums(block)  # type: ignore[attr-defined]


def _tar_kind(member: tarfile.TarInfo) -> MemberKind:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk():
        return "device"
    if member.isdir():
        return "dir"
    return "file" if member.isreg() else "other"


_READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError)


def _open_tar(reader: _Tail, shown: str) -> tarfile.TarFile | None:
    """tarfile in stream mode over `reader`; None if the data is no tar (GNU tar would not take it either)."""
    try:
        return tarfile.open(fileobj=reader, mode="r|")  # type: ignore[call-overload,no-any-return]
    except tarfile.TarError as exc:
        if _looks_like_tar(reader.since(0)[: tarfile.BLOCKSIZE]):
            raise FetchError(f"cannot read archive {shown}: {exc}") from None
        return None
    except _READ_ERRORS as exc:  # the compression is damaged: whatever it holds cannot be checked
        raise FetchError(f"cannot read archive {shown}: {exc}") from None


def tar_members(path: Path, shown: str | None = None) -> list[Member]:
    """Every member of a tar in any compression check_archive knows, read to a clean end.

    For callers whose own rules differ from check_archive's (a root filesystem layer
    holds absolute symlinks): the reading is as strict, the judging is theirs.
    """
    name = shown or path.name
    members = _tar_members(path, _sniff(path), name)
    if members is None:
        raise FetchError(f"cannot read archive {name}: it is not a tar archive")
    return members


def _tar_members(path: Path, kind: str | None, shown: str) -> list[Member] | None:
    """Every member of a (compressed) tar, read to a clean end; None if the data is no tar at all."""
    with _decompressed(path, kind, shown) as raw:
        reader = _Tail(raw)
        tar = _open_tar(reader, shown)
        if tar is None:
            return None
        with tar:
            try:
                members = [Member(m.name, _tar_kind(m), m.linkname) for m in tar]
            except _READ_ERRORS as exc:
                raise FetchError(f"cannot read archive {shown}: {exc}") from None
            _check_tar_end(reader, tar.offset, len(members), shown)
    return members


def _check_tar_end(reader: _Tail, offset: int, count: int, shown: str) -> None:
    """Refuse unless tarfile stopped at the end of the data or at a zero block followed only by zeros."""
    block = reader.since(offset)[: tarfile.BLOCKSIZE]
    where = f"at byte {offset}, after {count} members"
    if not block and reader.done == offset:
        return
    if len(block) < tarfile.BLOCKSIZE:
        raise FetchError(f"cannot read archive {shown}: truncated header {where}")
    if block.count(0) != len(block):
        raise FetchError(
            f"cannot read archive {shown}: unreadable tar header {where} (GNU tar would skip it and "
            "extract what follows, so the archive is refused)"
        )
    rest = reader.since(offset + tarfile.BLOCKSIZE)
    if rest.count(0) != len(rest) or not reader.drain_is_zero():
        raise FetchError(f"cannot read archive {shown}: data after the end-of-archive marker {where}")


def _zip_members(path: Path, shown: str) -> list[Member]:
    """Members of a zip as unzip would make them: the Unix mode in the external attributes says links and devices."""
    members: list[Member] = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                mode = info.external_attr >> 16
                if "\\" in info.filename:
                    raise FetchError(
                        f"unsafe archive {shown}: member {info.filename!r} has a backslash "
                        "(unzip may take it for a path separator)"
                    )
                if stat.S_ISLNK(mode):
                    if info.file_size > 4096:
                        raise FetchError(f"unsafe archive {shown}: symlink {info.filename!r} has a huge target")
                    target = archive.read(info).decode("utf-8", "surrogateescape")
                    members.append(Member(info.filename, "symlink", target))
                elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    members.append(Member(info.filename, "device"))
                else:
                    members.append(Member(info.filename, "dir" if info.is_dir() else "file"))
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        NotImplementedError,
        ValueError,
    ) as exc:
        raise FetchError(f"cannot read archive {shown}: {exc}") from None
    return members


def check_archive(path: Path, name: str | None = None, strip_components: int | None = None) -> str | None:
    """Refuse an archive with a member that would be written or point outside the extraction root.

    Formats: tar (plain, gzip, bzip2, xz, and zstd or lzip through their tools) and zip;
    a tar is read to a clean end, since GNU tar goes on past a header tarfile cannot
    read. Refused: absolute names, `..` components, control characters in names,
    symlinks and hardlinks whose target resolves (through the archive's own symlinks)
    outside the root, device nodes, and anything unreadable or uncheckable.

    `tar --strip-components=N` moves members up, so a symlink that is safe in place
    (`a/l -> ../x`) can point out once stripped (`l -> ../x`). With `strip_components`
    the check applies that level (as GNU tar does, to names and hardlink targets).
    Without it, the levels in STRIP_LEVELS are checked: builds strip in their shell
    steps, where Kiln cannot see the number, and every pkgs/ step strips 0 or 1.
    Checking every level instead would refuse ordinary tarballs: a link
    `pkg/a/b/l -> ../../x` is fine up to one level and points out at two.

    Returns the format checked ("tar" or "zip"), or None for a file that is no
    archive (a patch, a plain gzip file): its first block is no tar header, so GNU
    tar would not unpack it either.
    """
    shown = name or path.name
    try:
        kind = _sniff(path)
    except OSError as exc:
        raise FetchError(f"cannot read archive {shown}: {exc}") from None
    if kind == "zip":
        members: list[Member] | None = _zip_members(path, shown)
        checked = "zip"
    else:
        members = _tar_members(path, kind, shown)
        checked = "tar"
    if members is None:
        return None
    _check_names(members, shown)
    if strip_components is not None:
        levels: tuple[int, ...] = (strip_components,)
    else:
        levels = STRIP_LEVELS if checked == "tar" else (0,)  # unzip strips nothing
    for level in levels:
        _check_links(members, shown, level)
    return checked


def check_tree_archive(path: Path, name: str) -> None:
    """Refuse a plain tar of a store tree (a pulled cache entry) that could write outside the tree.

    Not the source-archive rules: a store tree holds symlinks to absolute paths on purpose
    (toolchain-seed's `x86_64-kiln-linux-musl-ar -> /usr/bin/ar`), which mean something inside a
    build root or an image and are never followed on the host. What is refused: the names
    check_archive refuses (absolute, `..`, control characters, devices, hardlinks out), and any
    member or hardlink target whose path goes through one of the archive's own symlinks, the one
    way a tar's later member is written (or linked) where an earlier symlink points.
    """
    if _sniff(path) is not None:
        raise FetchError(f"unsafe archive {name}: not a plain tar")
    members = _tar_members(path, None, name)
    if members is None:
        raise FetchError(f"unsafe archive {name}: not a tar archive")
    _check_names(members, name)
    symlinks = {"/".join(p for p in m.name.split("/") if p not in ("", ".")) for m in members if m.kind == "symlink"}
    for member in members:
        paths = [("member", member.name)] + ([("hardlink target", member.link)] if member.kind == "hardlink" else [])
        for what, text in paths:
            parts = [p for p in text.split("/") if p not in ("", ".")]
            through = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in symlinks), None)
            if through is not None:
                raise FetchError(f"unsafe archive {name}: {what} {text!r} goes through the symlink {through!r}")


def _check_names(members: list[Member], shown: str) -> None:
    """What no extraction should ever write: absolute names, `..`, control characters, devices."""
    for member in members:

        def refuse(why: str, member: Member = member) -> FetchError:
            return FetchError(f"unsafe archive {shown}: member {member.name!r} {why}")

        if member.name.startswith("/"):
            raise refuse("has an absolute path")
        if ".." in member.name.split("/"):
            raise refuse("has a '..' component")
        if _CONTROL.search(member.name) or _CONTROL.search(member.link):
            raise refuse("has a control character in its name or link target")
        if member.kind == "device":
            raise refuse("is a device node")
        if member.kind == "hardlink" and (member.link.startswith("/") or ".." in member.link.split("/")):
            raise refuse(f"is a hardlink that points outside the extraction root (target {member.link!r})")


def _strip(name: str, level: int) -> list[str] | None:
    """Components of `name` after GNU tar's --strip-components (which counts `.`), None if dropped."""
    parts = [p for p in name.split("/") if p]
    if len(parts) <= level:
        return None
    return [p for p in parts[level:] if p != "."]


def _check_links(members: list[Member], shown: str, level: int) -> None:
    """Every symlink and hardlink resolves inside the root once `level` components are stripped."""
    symlinks: dict[str, str] = {}
    for member in members:
        parts = _strip(member.name, level) if member.kind == "symlink" else None
        if parts:
            symlinks["/".join(parts)] = member.link
    links = _Links(symlinks)
    after = f" after --strip-components={level}" if level else ""
    for member in members:
        parts = _strip(member.name, level)
        if not parts or member.kind not in ("symlink", "hardlink"):
            continue
        try:
            if member.kind == "symlink":
                links.resolve(parts[:-1], member.link)
            else:
                target = _strip(member.link, level)  # hardlink targets are archive paths, stripped alike
                links.resolve([], "/".join(target or []))
        except _Escape as exc:
            raise FetchError(
                f"unsafe archive {shown}: member {member.name!r} is a {member.kind} that {exc}{after} "
                f"(target {member.link!r})"
            ) from None
