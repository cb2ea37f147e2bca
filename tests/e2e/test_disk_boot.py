"""End-to-end: the real image's disk image boots to "machined ready" from every QEMU-bootable format.

Nothing is stubbed: the kernel + initramfs are conftest's `image_dir` (built through the graph),
the raw image is build_raw's, the others come from it through convert, and each boots through
kiln.boot.qemu's machine_for (the file suffix picks QEMU's format) as a virtio disk under
SeaBIOS or OVMF. The console must show GRUB's Kiln menu entry (so no other boot path passes)
and machined must take the disk by its BOOT/META partitions and put /var on the EPHEMERAL
partition it creates in the free space. Five boots, about 20-40 s each under TCG.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import __version__
from kiln.boot.qemu import READY, boot, machine_for
from kiln.image.assets import BootAssets
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.formats import convert

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
EPOCH = 1704067200
SIZE = 1 << 30


@pytest.fixture(scope="module")
def disks(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """disk.raw, .qcow2, .vhd and .vmdk of the real image."""
    assets = BootAssets.make(image_dir / "vmlinuz", image_dir / "initramfs.zst", "console=ttyS0", __version__, EPOCH)
    work = tmp_path_factory.mktemp("disk")
    raw = build_raw(assets, work / "disk.raw", SIZE)
    found = {"raw": raw}
    for fmt in ("qcow2", "vhd", "vmdk"):
        found[fmt] = convert(raw, fmt, work / f"disk.{fmt}", assets)
    return found


@pytest.mark.parametrize(
    ("fmt", "firmware"),
    [
        ("raw", "bios"),
        ("raw", "uefi"),
        ("qcow2", "bios"),
        ("vhd", "bios"),
        ("vmdk", "bios"),
    ],
)
def test_boots_to_ready(disks: dict[str, Path], tmp_path: Path, fmt: str, firmware: str) -> None:
    machine = machine_for(disks[fmt])
    machine.firmware = firmware
    log = tmp_path / f"{fmt}-{firmware}.log"
    result = boot(machine, READY, BOOT_TIMEOUT, log)
    assert result.ok, f"{fmt}/{firmware}: {result.reason}; console:\n" + "\n".join(result.tail)
    text = log.read_text(errors="replace")
    assert f"Kiln {__version__}, slot A" in text, "GRUB's Kiln menu entry for slot A never showed"
    assert "disk: using /dev/vda" in text, "machined did not take the image's disk"
    assert result.line is not None and "var=/dev/vda" in result.line, f"/var is not on the disk: {result.line}"
    print(f"{fmt}/{firmware}: ready after {result.seconds:.1f} s")
