"""Compressed disk images (metal-amd64.raw.zst, hcloud-amd64.raw.xz, ...) made bootable: QEMU reads
raw, qcow2, vhd and vmdk files, not their compressed forms, so `kiln boot` unpacks them first."""

from __future__ import annotations

from pathlib import Path

from kiln.core import tools
from kiln.core.errors import InputError

# suffix -> the command that writes the uncompressed bytes to stdout
DECOMPRESSORS = {".zst": ["zstd", "-dcq"], ".xz": ["xz", "-dc"], ".gz": ["gzip", "-dc"]}


def is_compressed(artifact: Path) -> bool:
    return artifact.is_file() and artifact.suffix in DECOMPRESSORS


def uncompressed(artifact: Path, work: Path) -> Path:
    """`artifact` itself, or, when compressed, its uncompressed copy in `work` (named without the suffix)."""
    if not is_compressed(artifact):
        return artifact
    if artifact.name.endswith(".tar.gz"):
        raise InputError(f"{artifact.name} is a tarball (a GCP image): unpack its disk.raw and boot that")
    target = work / artifact.name.removesuffix(artifact.suffix)
    with target.open("wb") as out:
        tools.run([*DECOMPRESSORS[artifact.suffix], str(artifact)], what=f"unpacking {artifact.name}", stdout=out)
    return target
