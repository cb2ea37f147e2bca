"""An entry's manifest: every path of its tree with type, mode, size and sha256, and the walk that makes it."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from kiln.core.errors import BuildError
from kiln.core.hashing import CHUNK, file_sha256

MANIFEST_SCHEMA = "kiln-store-manifest-v1"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class FileRecord:
    """One path of an entry's tree as the manifest records it (size and sha256 for files only)."""

    path: str
    type: str  # "file" | "dir" | "symlink"
    mode: int
    size: int
    sha256: str | None
    target: str | None


class TreeScan:
    """Walk a tree into sorted FileRecords; when normalizing, clamp mtimes and chown to root.

    Hard links hash once per inode. Special files are errors when normalizing (an output
    must be plain files, dirs and symlinks) and "special" records when verifying.
    """

    def __init__(self, top: Path, *, normalize: bool, source_date_epoch: int = 0) -> None:
        self.top = top
        self.normalize = normalize
        self.limit_ns = source_date_epoch * 1_000_000_000
        self.chown = normalize and os.geteuid() == 0
        self.records: list[FileRecord] = []
        self.hashes: dict[tuple[int, int], str] = {}
        self.buffer = bytearray(CHUNK)

    def run(self) -> list[FileRecord]:
        self._walk(str(self.top), "")
        if self.normalize:
            self._fix(str(self.top), os.lstat(self.top))
        self.records.sort(key=lambda r: r.path)
        return self.records

    def _walk(self, directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            rel = prefix + child.name
            info = child.stat(follow_symlinks=False)
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                self._walk(child.path, rel + "/")
                self.records.append(FileRecord(rel, "dir", stat.S_IMODE(mode), 0, None, None))
            elif stat.S_ISREG(mode):
                inode = (info.st_dev, info.st_ino)
                digest = self.hashes.get(inode) if info.st_nlink > 1 else None
                if digest is None:
                    try:
                        digest = file_sha256(child.path, buffer=self.buffer)
                    except OSError as exc:
                        raise BuildError(f"cannot read {child.path}: {exc.strerror}") from exc
                    if info.st_nlink > 1:
                        self.hashes[inode] = digest
                self.records.append(FileRecord(rel, "file", stat.S_IMODE(mode), info.st_size, digest, None))
            elif stat.S_ISLNK(mode):
                self.records.append(FileRecord(rel, "symlink", stat.S_IMODE(mode), 0, None, os.readlink(child.path)))
            elif self.normalize:
                kind = _special_kind(mode)
                raise BuildError(f"package output contains a {kind}, which the store refuses: {child.path}")
            else:
                self.records.append(FileRecord(rel, "special", stat.S_IMODE(mode), 0, None, None))
                continue
            if self.normalize:
                self._fix(child.path, info)

    def _fix(self, path: str, info: os.stat_result) -> None:
        """Make ownership and times independent of who built it and when."""
        if self.chown and (info.st_uid, info.st_gid) != (0, 0):
            os.lchown(path, 0, 0)
            # chown(2) clears setuid/setgid bits even for root; put the recorded mode back.
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(info.st_mode))
        if info.st_mtime_ns > self.limit_ns:
            os.utime(path, ns=(self.limit_ns, self.limit_ns), follow_symlinks=False)


_SPECIAL_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
)


def _special_kind(mode: int) -> str:
    """What a file that is neither regular, directory nor link is, in words for an error."""
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), "special file")


def manifest_bytes(records: list[FileRecord]) -> bytes:
    """Canonical manifest text: same tree, same bytes, whatever the key or the store."""
    files = [asdict(r) for r in records]
    text = json.dumps({"schema": MANIFEST_SCHEMA, "files": files}, sort_keys=True, indent=1)
    return (text + "\n").encode()


def read_manifest(path: Path) -> list[FileRecord]:
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"not a {MANIFEST_SCHEMA} document")
    return [FileRecord(**item) for item in data["files"]]


def differences(want: FileRecord, got: FileRecord) -> list[str]:
    out: list[str] = []
    if want.type != "symlink" and want.mode != got.mode:
        out.append(f"mode {got.mode:04o}, expected {want.mode:04o}")
    if want.type == "file":
        if want.size != got.size:
            out.append(f"size {got.size}, expected {want.size}")
        if want.sha256 != got.sha256:
            out.append(f"sha256 {got.sha256}, expected {want.sha256}")
    if want.type == "symlink" and want.target != got.target:
        out.append(f"symlink to {got.target!r}, expected {want.target!r}")
    return out
