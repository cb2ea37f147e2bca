"""End-to-end: the real image's ISO and PXE outputs boot to "machined ready" in QEMU (TCG).

Nothing is stubbed: the kernel + initramfs are conftest's `image_dir` (built through the graph),
the ISO and PXE directory are made from them by build_iso/build_pxe, and each boot goes
through GRUB (CD, or the ISO as a raw USB disk) or iPXE (the virtio NIC's ROM, over QEMU's TFTP)
under SeaBIOS or OVMF. The console log must show the boot path taken (GRUB's menu entry, or iPXE
running boot.ipxe), so a fallback to another boot device cannot pass. Six boots, about 15-35 s each.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import __version__
from kiln.boot.qemu import READY, Machine, boot
from kiln.image.assets import BootAssets
from kiln.image.outputs.iso import build_iso
from kiln.image.outputs.pxe import build_pxe

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
EPOCH = 1704067200


@pytest.fixture(scope="module")
def outputs(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The ISO and the PXE directory of the real image."""
    assets = BootAssets.make(image_dir / "vmlinuz", image_dir / "initramfs.zst", "console=ttyS0", __version__, EPOCH)
    work = tmp_path_factory.mktemp("iso-pxe")
    iso = build_iso(assets, work / "kiln.iso")
    pxe = work / "pxe"
    build_pxe(assets, pxe)
    return iso, pxe


def machine(how: str, iso: Path, pxe: Path) -> Machine:
    if how == "cd":
        return Machine(cdrom=iso)
    if how == "usb":  # the ISO written raw to a stick: attached as a disk, format raw
        return Machine(disk=iso, disk_format="raw")
    return Machine(pxe=pxe.resolve())


@pytest.mark.parametrize(
    ("how", "firmware"),
    [
        ("cd", "bios"),
        ("cd", "uefi"),
        ("usb", "bios"),
        ("usb", "uefi"),
        ("pxe", "bios"),
        ("pxe", "uefi"),
    ],
)
def test_boots_to_ready(outputs: tuple[Path, Path], tmp_path: Path, how: str, firmware: str) -> None:
    iso, pxe = outputs
    booted = machine(how, iso, pxe)
    booted.firmware = firmware
    log = tmp_path / f"{how}-{firmware}.log"
    result = boot(booted, READY, BOOT_TIMEOUT, log)
    assert result.ok, f"{how}/{firmware}: {result.reason}; console:\n" + "\n".join(result.tail)
    text = log.read_text(errors="replace")
    if how == "pxe":
        assert "boot.ipxe" in text and "[script]" in text, "iPXE did not run boot.ipxe"
    else:
        assert f"Kiln {__version__}" in text, "GRUB's Kiln menu entry never showed"
    print(f"{how}/{firmware}: ready after {result.seconds:.1f} s")
