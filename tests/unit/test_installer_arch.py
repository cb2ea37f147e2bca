"""The installer OCI image takes its architecture from machined (the program it runs), and refuses one
that is not the profile's.

Stand-ins: machined is a hand-made ELF header (64-bit, static: one PT_LOAD, no PT_INTERP) that is
never run; the kernel, initramfs and disk image are small fake files. build_installer only reads
machined's ELF header, so that is all the image's architecture can come from.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kiln.core.errors import BuildError
from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import build_installer

EPOCH = 1700000000
PT_LOAD = 1


def static_elf(path: Path, machine: int) -> Path:
    """A 64-bit little-endian ELF executable header for `machine` with one PT_LOAD program header."""
    header = bytearray(64)
    header[0:4] = b"\x7fELF"
    header[4], header[5], header[6] = 2, 1, 1  # ELFCLASS64, little-endian, version 1
    struct.pack_into("<HHI", header, 16, 2, machine, 1)  # ET_EXEC, e_machine, e_version
    struct.pack_into("<Q", header, 32, 64)  # e_phoff: right after this header
    struct.pack_into("<HHH", header, 52, 64, 56, 1)  # e_ehsize, e_phentsize, e_phnum
    program = struct.pack("<II6Q", PT_LOAD, 5, 0, 0x400000, 0x400000, 120, 120, 0x1000)
    path.write_bytes(bytes(header) + program)
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[BootAssets, Path]:
    kernel, initrd, disk = tmp_path / "vmlinuz", tmp_path / "initramfs.zst", tmp_path / "disk.raw"
    kernel.write_bytes(b"fake kernel " * 100)
    initrd.write_bytes(b"fake initramfs " * 100)
    disk.write_bytes(b"fake disk " * 100)
    return BootAssets.make(kernel, initrd, "console=ttyAMA0", "0.1.0", EPOCH), disk


@pytest.mark.parametrize(("machine", "arch"), [(0xB7, "arm64"), (0x3E, "amd64")])
def test_the_image_architecture_is_machineds(
    inputs: tuple[BootAssets, Path], tmp_path: Path, machine: int, arch: str
) -> None:
    assets, disk = inputs
    machined = static_elf(tmp_path / "machined", machine)
    layout, _ = build_installer(assets, disk, machined, tmp_path / "out", "installer", profile_arch=arch)
    index = json.loads((layout / "index.json").read_text())
    [entry] = index["manifests"]
    assert entry["platform"] == {"architecture": arch, "os": "linux"}
    blobs = layout / "blobs/sha256"
    manifest = json.loads((blobs / entry["digest"].removeprefix("sha256:")).read_text())
    config = json.loads((blobs / manifest["config"]["digest"].removeprefix("sha256:")).read_text())
    assert config["architecture"] == arch and config["os"] == "linux"


def test_a_machined_of_another_arch_than_the_profiles_is_refused(
    inputs: tuple[BootAssets, Path], tmp_path: Path
) -> None:
    assets, disk = inputs
    machined = static_elf(tmp_path / "machined", 0x3E)
    with pytest.raises(BuildError, match="is built for amd64, but the profile is for arm64"):
        build_installer(assets, disk, machined, tmp_path / "out", "installer", profile_arch="arm64")
