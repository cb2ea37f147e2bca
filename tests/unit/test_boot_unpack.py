"""kiln boot unpacks a compressed disk (metal-amd64.raw.zst and the cloud ones) before QEMU opens it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kiln.boot.unpack import is_compressed, uncompressed
from kiln.core.errors import InputError
from kiln.image.compress import compress


@pytest.mark.parametrize("out_format", [".zst", ".xz", ".gz"])
def test_a_disk_compressed_by_the_imager_comes_back_byte_for_byte(tmp_path: Path, out_format: str) -> None:
    data = os.urandom(1 << 16) + bytes(1 << 20)
    disk = tmp_path / "metal-amd64.raw"
    disk.write_bytes(data)
    packed = compress(disk, out_format, 0)  # the real tools, as kiln image runs them
    assert packed.name == f"metal-amd64.raw{out_format}" and is_compressed(packed)
    work = tmp_path / "work"
    work.mkdir()
    raw = uncompressed(packed, work)
    assert raw == work / "metal-amd64.raw" and raw.read_bytes() == data


def test_an_uncompressed_artifact_is_booted_as_it_is_and_a_tarball_is_refused(tmp_path: Path) -> None:
    iso = tmp_path / "metal-amd64.iso"
    iso.write_bytes(b"iso")
    assert uncompressed(iso, tmp_path) == iso and not is_compressed(tmp_path)
    tarball = tmp_path / "gcp-amd64.raw.tar.gz"
    subprocess.run(["tar", "-czf", str(tarball), "-C", str(tmp_path), iso.name], check=True)
    with pytest.raises(InputError, match="is a tarball"):
        uncompressed(tarball, tmp_path)


def test_compress_can_name_its_result(tmp_path: Path) -> None:
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"x" * 4096)
    made = compress(disk, ".tar.gz", 0, tmp_path / "gcp-amd64.raw.tar.gz")
    listed = subprocess.run(["tar", "-tzf", str(made)], capture_output=True, text=True, check=True).stdout
    assert made.name == "gcp-amd64.raw.tar.gz" and listed == "disk.raw\n" and not disk.exists()
    plain = tmp_path / "other.raw"
    plain.write_bytes(b"y")
    assert compress(plain, "raw", 0, tmp_path / "renamed.raw").read_bytes() == b"y"
