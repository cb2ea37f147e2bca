"""Applying one image layer to a seed tree: checked first, whiteouts and members resolved inside the tree only."""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from kiln.build.sources.archives import Member, tar_members
from kiln.build.sources.errors import FetchError
from kiln.core.errors import InputError, Location
from kiln.core.hashing import CHUNK, file_sha256

OPAQUE = ".wh..wh..opq"
WHITEOUT = ".wh."


class SeedError(InputError):
    """A --from-tar archive that is malformed, unsafe, or has no image for the platform (bad input, exit 2)."""


@dataclass
class Layer:
    """A layer blob to apply: its file, how it is compressed, and the sha256 of its tar if known."""

    blob: Path
    compression: str | None
    diff_id: str | None = None


def sniff_compression(path: Path) -> str | None:
    with path.open("rb") as handle:
        head = handle.read(4)
    return "gzip" if head.startswith(b"\x1f\x8b") else "zstd" if head == b"\x28\xb5\x2f\xfd" else None


def _plain_tar(layer: Layer, work: Path, label: str, where: Location) -> Path:
    """The layer as an uncompressed tar (zstd through its tool, argv only), checked against its diff_id."""
    if layer.compression is None:
        plain = layer.blob
    else:
        plain = work / "layer.tar"
        if layer.compression == "gzip":
            try:
                with gzip.open(layer.blob, "rb") as source, plain.open("wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
            except (OSError, EOFError, zlib.error) as exc:
                raise SeedError(f"{label}: cannot decompress: {exc}", where) from None
        else:
            tool = shutil.which("zstd")
            if tool is None:
                raise SeedError(f"{label} is zstd-compressed and zstd is not installed (apt-get install zstd)", where)
            result = subprocess.run(
                [tool, "-q", "-d", "-f", "-o", str(plain), "--", str(layer.blob)], capture_output=True, text=True
            )
            if result.returncode != 0:
                raise SeedError(f"{label}: cannot decompress: {result.stderr.strip()}", where)
    if layer.diff_id is not None and f"sha256:{file_sha256(plain)}" != layer.diff_id:
        raise SeedError(f"{label} does not match its diff_id {layer.diff_id}", where)
    return plain


def apply_layer(layer: Layer | Path, tree: Path, label: str | None = None, where: Location | None = None) -> None:
    """Unpack one layer over `tree`, honouring OCI whiteouts (.wh.name and .wh..wh..opq).

    Every member and whiteout must stay inside `tree` without passing through a
    symlink (of the tree, or made by this layer): GNU tar follows an existing
    symlink to a directory, so `etc -> /etc` from a lower layer would send an upper
    layer's `etc/passwd` to the host.
    """
    if isinstance(layer, Path):
        layer = Layer(layer, sniff_compression(layer))
    label = label or layer.blob.name
    where = where or Location(str(layer.blob))
    with tempfile.TemporaryDirectory(dir=tree.parent, prefix=".layer-") as tmp:
        plain = _plain_tar(layer, Path(tmp), label, where)
        try:
            members = tar_members(plain, label)
        except FetchError as exc:
            raise SeedError(exc.message, where) from None
        whiteouts = _check_layer(members, tree, label, where)
        for parts in whiteouts:
            _whiteout(tree, parts)
        result = subprocess.run(
            [
                "tar",
                "-xpf",
                str(plain),
                "-C",
                str(tree),
                "--numeric-owner",
                f"--exclude={WHITEOUT}*",
                f"--exclude=*/{WHITEOUT}*",
            ],
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise SeedError(f"cannot unpack {label}: {result.stderr.strip()}", where)


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def _check_layer(members: list[Member], tree: Path, label: str, where: Location) -> list[list[str]]:
    """Refuse members that would leave the tree; return the whiteouts as path components."""
    links = {"/".join(_parts(m.name)) for m in members if m.kind == "symlink"}
    whiteouts: list[list[str]] = []

    def refuse(member: Member, why: str) -> SeedError:
        return SeedError(f"{label}: member {member.name!r} {why}", where)

    for member in members:
        parts = _parts(member.name)
        if member.name.startswith("/") or ".." in parts:
            raise refuse(member, "leads outside the root (absolute or '..')")
        through = _symlink_prefix(tree, parts[:-1], links)
        if through:
            raise refuse(member, f"would be written through the symlink {through!r}")
        if member.kind == "hardlink":
            target = _parts(member.link)
            if member.link.startswith("/") or ".." in target:
                raise refuse(member, f"is a hardlink outside the root (target {member.link!r})")
            through = _symlink_prefix(tree, target[:-1], links)
            if through:
                raise refuse(member, f"is a hardlink through the symlink {through!r}")
        if parts and parts[-1].startswith(WHITEOUT):
            if parts[-1] != OPAQUE and parts[-1][len(WHITEOUT) :] in ("", ".", ".."):
                raise refuse(member, "is a whiteout of no file")
            whiteouts.append(parts)
    return whiteouts


def _symlink_prefix(tree: Path, parents: list[str], layer_links: set[str]) -> str | None:
    """The first of `parents`' prefixes that is a symlink in the tree or in the layer, if any."""
    current = tree
    for depth, part in enumerate(parents, 1):
        prefix = "/".join(parents[:depth])
        if prefix in layer_links:
            return prefix
        current = current / part
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return prefix
        except OSError:
            pass
    return None


def _real_dir(tree: Path, parts: list[str]) -> Path | None:
    """tree/parts if every component is a real directory (no symlink followed), else None."""
    current = tree
    for part in parts:
        current = current / part
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return None
        except OSError:
            return None
    return current


def _whiteout(tree: Path, parts: list[str]) -> None:
    """Apply one whiteout inside `tree` only; nothing is followed, a missing path is nothing to remove."""
    directory = _real_dir(tree, parts[:-1])
    if directory is None:
        return
    if parts[-1] == OPAQUE:
        for child in list(directory.iterdir()):
            _remove(child)
    else:
        _remove(directory / parts[-1][len(WHITEOUT) :])


def _remove(path: Path) -> None:
    """Remove a file, link or directory tree without following symlinks."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()
