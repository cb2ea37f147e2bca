"""The disk layout's arithmetic: partition order, alignment, BOOT growing with the payload."""

from __future__ import annotations

from pathlib import Path

from kiln.image.assets import BootAssets
from kiln.image.outputs.disk import BOOT_MIN_SIZE, MIB, layout, minimum_size
from kiln.image.outputs.formats import vhd_checksum


def assets_of(tmp_path: Path, kernel_size: int, initrd_size: int) -> BootAssets:
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initramfs.zst"
    for path, size in ((kernel, kernel_size), (initrd, initrd_size)):
        with path.open("wb") as stream:
            stream.truncate(size)  # sparse: only the sizes matter here
    return BootAssets(kernel, initrd, "console=ttyS0", "0.1.0", 0, "00" * 32)


def test_small_payload_gets_the_default_layout(tmp_path: Path) -> None:
    parts = layout(assets_of(tmp_path, 10 * MIB, 12 * MIB))
    assert [(p.name, p.start // MIB, p.size // MIB) for p in parts] == [
        ("EFI", 1, 100),
        ("BIOS", 101, 1),
        ("BOOT", 102, BOOT_MIN_SIZE // MIB),
        ("META", 230, 1),
    ]
    assert minimum_size(assets_of(tmp_path, 1, 1)) == 232 * MIB


def test_boot_grows_to_hold_two_payloads(tmp_path: Path) -> None:
    parts = {p.name: p for p in layout(assets_of(tmp_path, 60 * MIB, 40 * MIB + 1))}
    boot = parts["BOOT"]
    assert boot.size == 217 * MIB  # 2 x (100 MiB + 1 byte) + 16 MiB, rounded up to whole MiB
    assert parts["META"].start == boot.end and parts["META"].start % MIB == 0


def test_vhd_checksum_ignores_its_own_field() -> None:
    footer = bytearray(512)
    footer[:8] = b"conectix"
    plain = vhd_checksum(footer)
    assert plain == ~sum(b"conectix") & 0xFFFFFFFF
    footer[64:68] = plain.to_bytes(4, "big")
    assert vhd_checksum(footer) == plain
