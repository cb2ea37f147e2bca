"""The disk image a `kiln image` output directory holds for a cloud, read from its manifest.json."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln.boot.unpack import DECOMPRESSORS, uncompressed
from kiln.core.errors import InputError, KilnError
from kiln.core.hashing import file_sha256

MANIFEST = "manifest.json"
BLOCK = 512 * 1024  # the EBS direct APIs' one block size
DEFAULT_NAME = "kiln-{profile}-{version}-{arch}"  # an AMI's name; an Azure blob's, with .vhd


class UploadFailed(KilnError):
    """A cloud's call failed midway: which call, where, and what it left behind."""

    exit_code = 1


@dataclass(frozen=True)
class CloudImage:
    """One output directory's disk for a cloud: what it is and the facts an upload tags it with."""

    directory: Path
    artifact: Path  # as written: aws-amd64.raw.zst
    platform: str  # the profile's platform: aws, azure, ...
    profile: str
    arch: str  # amd64 or arm64
    version: str
    schematic: str  # "" without one
    manifest_sha256: str  # what identifies this release's image: an upload of it is found by it
    artifact_sha256: str = ""  # the disk file's sha256 as manifest.json lists it

    @classmethod
    def read(cls, directory: Path, platform: str, formats: tuple[str, ...]) -> CloudImage:
        """The directory's one artifact of `formats` (e.g. ".raw"), for `platform`; InputError otherwise."""
        manifest = directory / MANIFEST
        if not manifest.is_file():
            raise InputError(f"{directory}: no {MANIFEST}: not an output directory of kiln image")
        try:
            data = json.loads(manifest.read_text())
            profile = data["profile"]
            digests = {str(a["path"]): str(a.get("sha256", "")) for a in data["artifacts"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{manifest}: not a kiln image manifest ({exc})") from None
        if profile.get("platform") != platform:
            raise InputError(f"{directory}: the image is for platform {profile.get('platform')!r}, not {platform!r}")
        suffixes = tuple(f + c for f in formats for c in ("", *DECOMPRESSORS))
        disks = [name for name in digests if name.endswith(suffixes) and "/" not in name]
        if len(disks) != 1:
            raise InputError(f"{directory}: expected one {' or '.join(formats)} disk image, found {disks or 'none'}")
        artifact = directory / disks[0]
        if not artifact.is_file() or artifact.is_symlink():
            raise InputError(f"{artifact}: listed in {MANIFEST} but not a regular file here")
        arch = str(profile.get("arch", ""))
        if arch not in ("amd64", "arm64"):
            raise InputError(f"{manifest}: arch {arch!r} is neither amd64 nor arm64")
        return cls(
            directory=directory,
            artifact=artifact,
            platform=platform,
            profile=str(profile.get("name", "")),
            arch=arch,
            version=str(profile.get("version", "")),
            schematic=str(profile.get("schematic") or ""),
            manifest_sha256=file_sha256(manifest),
            artifact_sha256=digests[disks[0]],
        )

    def check_digest(self) -> None:
        """The artifact's bytes are the ones its manifest lists: an upload names the image by that digest,
        so a file changed (or cut short) since `kiln image` wrote it must not go up under it."""
        found = file_sha256(self.artifact)
        if found != self.artifact_sha256:
            raise InputError(
                f"{self.artifact}: sha256 {found[:16]}..., but {MANIFEST} lists "
                f"{self.artifact_sha256[:16] or 'none'}...: the file is not the one kiln image wrote"
            )

    def raw(self, work: Path) -> Path:
        """The disk's raw bytes: the artifact itself, or its uncompressed copy in `work`."""
        return uncompressed(self.artifact, work)


def image_name(template: str, image: CloudImage) -> str:
    """`template` filled in from the image (--name-template)."""
    try:
        return template.format(profile=image.profile, version=image.version, arch=image.arch, schematic=image.schematic)
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(f"--name-template {template!r}: {exc} (fields: profile, version, arch, schematic)") from None


def blocks(raw: Path) -> Iterator[tuple[int, bytes]]:
    """(index, data) of every BLOCK of the disk that holds a byte other than zero; the last block
    is padded with zeros. Zero blocks are skipped: a fresh EBS volume reads them as zeros anyway."""
    zero = bytes(BLOCK)
    with raw.open("rb") as disk:
        index = 0
        while data := disk.read(BLOCK):
            if len(data) < BLOCK:
                data += bytes(BLOCK - len(data))
            if data != zero:
                yield index, data
            index += 1


def size_in_gib(raw: Path) -> int:
    """The smallest whole number of GiB that holds the disk (EBS volumes come in GiB)."""
    return max(1, -(-raw.stat().st_size // (1 << 30)))


def send_in_parallel(
    chunks: Iterable[tuple[int, bytes]], send: Callable[[int, bytes], None], workers: int
) -> tuple[int, int]:
    """Each (position, data) chunk through `send` on `workers` threads, reading at most twice as many
    chunks ahead of the sends as there are workers (a disk is never held in memory whole); returns the
    chunks and bytes sent, or raises the first failure once every chunk was tried."""
    slots = threading.BoundedSemaphore(workers * 2)

    def one(position: int, data: bytes) -> None:
        try:
            send(position, data)
        finally:
            slots.release()

    sent = size = 0
    pending: list[Future[None]] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for position, data in chunks:
            slots.acquire()
            pending.append(pool.submit(one, position, data))
            sent, size = sent + 1, size + len(data)
        for future in pending:
            future.result()
    return sent, size
