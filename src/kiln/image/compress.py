"""An output's `out_format`: the file as is, or compressed / wrapped in a tarball the platform wants.

Each output depends on the input bytes only: gzip, xz and zstd are made chunk by chunk around the
disk's holes (kiln.image.chunked), and GNU tar runs with fixed owner, mtime and order.
"""

from __future__ import annotations

from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError
from kiln.image.chunked import write_gzip, write_xz, write_zstd

OUT_FORMATS = ("raw", ".xz", ".zst", ".gz", ".tar.gz")


def compress(path: Path, out_format: str, epoch: int, target: Path | None = None) -> Path:
    """Turn path into its out_format, at `target` (default: next to it, the suffix added); the
    uncompressed file is removed. Returns the result. A .tar.gz holds `path` under its own name."""
    if out_format == "raw":
        if target is not None and target != path:
            path.rename(target)
            return target
        return path
    target = target or path.with_name(path.name + out_format)
    if out_format == ".tar.gz":
        # GNU format with sparse members: what GCP asks for (disk.raw inside), and small.
        tar = path.with_name(path.name + ".tar")
        tools.run(
            [
                "tar",
                "--format=gnu",
                "--sparse",
                "--sort=name",
                f"--mtime=@{epoch}",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mode=u=rw,go=r",
                "-C",
                str(path.parent),
                "-cf",
                str(tar),
                path.name,
            ],
            what=f"tar of {path.name}",
        )
        write_gzip(tar, target)
        tar.unlink()
    elif out_format == ".gz":
        write_gzip(path, target)
    elif out_format == ".xz":
        write_xz(path, target)
    elif out_format == ".zst":
        write_zstd(path, target)
    else:
        raise BuildError(f"unknown out_format {out_format}: choose from {', '.join(OUT_FORMATS)}")
    path.unlink()
    return target
