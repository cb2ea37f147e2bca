"""What every bootable output is made from, and how outputs stay byte-reproducible.

Each output module (iso, disk, formats, pxe, oci) takes a BootAssets and writes files
derived only from it: times come from `epoch` (SOURCE_DATE_EPOCH), and every UUID,
serial number or volume id comes from `derived_uuid(assets.seed, purpose)`, never from
the clock, a random source or the host.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from kiln.core.hashing import file_sha256

# Namespace for Kiln's derived UUIDs (itself a uuid5 of the project's name in the URL namespace).
KILN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kiln.invalid/uuid")


@dataclass(frozen=True)
class BootAssets:
    """A kernel, its initramfs and how to boot them."""

    vmlinuz: Path
    initramfs: Path  # zstd-compressed newc cpio: /init, /rootfs.sqsh, /extensions/*.sqsh
    cmdline: str  # kernel arguments, e.g. "console=ttyS0 kiln.platform=metal"
    version: str  # Kiln's version: volume labels and menu titles
    epoch: int  # SOURCE_DATE_EPOCH: every timestamp inside an output
    seed: str  # hex digest of everything above; UUIDs and serials derive from it
    vmlinuz_sha256: str = ""
    initramfs_sha256: str = ""

    @classmethod
    def make(
        cls,
        vmlinuz: Path,
        initramfs: Path,
        cmdline: str,
        version: str,
        epoch: int,
        digests: tuple[str, str] | None = None,
    ) -> BootAssets:
        """Assets whose seed hashes the kernel, the initramfs, the command line, version and epoch.

        `digests` (the files' sha256s) lets callers that make many assets of the same files hash them once.
        """
        vmlinuz_sha256, initramfs_sha256 = digests or (file_sha256(vmlinuz), file_sha256(initramfs))
        digest = hashlib.sha256()
        for file_digest in (vmlinuz_sha256, initramfs_sha256):
            digest.update(file_digest.encode())
        digest.update(f"\0{cmdline}\0{version}\0{epoch}".encode())
        return cls(vmlinuz, initramfs, cmdline, version, epoch, digest.hexdigest(), vmlinuz_sha256, initramfs_sha256)


def derived_uuid(seed: str, purpose: str) -> uuid.UUID:
    """A UUID that is the same for the same inputs and differs per purpose (disk, ESP, BOOT...)."""
    return uuid.uuid5(KILN_NAMESPACE, f"{seed}:{purpose}")
