"""The ISO and PXE outputs' format and layout, checked with the real tools (xorriso, sfdisk, mtools, blkid).

Stand-in: the kernel and initramfs are small fake files (random-looking bytes), since nothing
here boots; tests/e2e/test_iso_pxe_boot.py boots the real image. GRUB, xorriso, mkfs.fat and
mtools are the real ones.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kiln.boot.qemu import Machine, machine_for
from kiln.core.errors import BuildError
from kiln.image.assets import BootAssets, derived_uuid
from kiln.image.outputs.grub import grub_config
from kiln.image.outputs.iso import build_iso, grub_uuid, volume_id
from kiln.image.outputs.pxe import build_pxe

pytestmark = pytest.mark.integration

EPOCH = 1704067200  # 2024-01-01 00:00:00 UTC
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"


def fake_assets(root: Path, version: str = "0.1.0", epoch: int = EPOCH) -> BootAssets:
    root.mkdir(parents=True, exist_ok=True)
    kernel, initrd = root / "vmlinuz", root / "initramfs.zst"
    kernel.write_bytes(b"fake kernel\n" + hashlib.sha512(b"k").digest() * 4000)
    initrd.write_bytes(b"fake initramfs\n" + hashlib.sha512(b"i").digest() * 2000)
    return BootAssets.make(kernel, initrd, "console=ttyS0 kiln.platform=metal", version, epoch)


def sh(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result.stdout + result.stderr


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def iso(tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path]:
    work = tmp_path_factory.mktemp("iso")
    assets = fake_assets(work / "assets")
    return assets, build_iso(assets, work / "out" / "kiln.iso")


def test_volume_id_rules() -> None:
    assert volume_id("0.1.0") == "KILN_0_1_0"
    assert volume_id("1.2.3-rc1+git.abc") == "KILN_1_2_3_RC1_GIT_ABC"
    long = volume_id("1.0.0-" + "x" * 40)
    assert len(long) == 32 and long.startswith("KILN_1_0_0_XXX")


def test_label_and_el_torito_entries(iso: tuple[BootAssets, Path]) -> None:
    _, image = iso
    report = sh("xorriso", "-indev", str(image), "-report_el_torito", "plain")
    assert "Volume id    : 'KILN_0_1_0'" in report
    lines = [line.split() for line in report.splitlines() if line.startswith("El Torito boot img :")]
    platforms = {fields[6]: fields for fields in lines}  # El Torito boot img : N Pltf B Emul ...
    assert set(platforms) == {"BIOS", "UEFI"}, report
    assert all(fields[7] == "y" and fields[8] == "none" for fields in lines), report  # bootable, no emulation
    assert "/boot/grub/i386-pc/eltorito.img" in report and "/efi.img" in report
    assert "grub2-boot-info" in report  # the BIOS image is patched so the hybrid MBR can load it from USB


def test_files_in_place(iso: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = iso
    sh("xorriso", "-osirrox", "on", "-indev", str(image), "-extract", "/", str(tmp_path / "x"))
    root = tmp_path / "x"
    assert (root / "boot/vmlinuz").read_bytes() == assets.vmlinuz.read_bytes()
    assert (root / "boot/initramfs.zst").read_bytes() == assets.initramfs.read_bytes()
    assert (root / "boot/grub/grub.cfg").read_text() == grub_config(assets, "/boot/vmlinuz", "/boot/initramfs.zst")
    # Every file carries SOURCE_DATE_EPOCH, not the build's wall-clock time.
    assert {int(p.stat().st_mtime) for p in root.rglob("*") if p.is_file()} == {EPOCH}


def test_grub_finds_this_iso(iso: tuple[BootAssets, Path], tmp_path: Path) -> None:
    """The UUID the GRUB cores search for is the UUID the ISO has (else no boot finds grub.cfg)."""
    assets, image = iso
    uuid = grub_uuid(assets.epoch)
    assert uuid == "2024-01-01-00-00-00-00"
    assert sh("blkid", "-o", "value", "-s", "UUID", str(image)).strip() == uuid
    sh("xorriso", "-osirrox", "on", "-indev", str(image), "-extract", "/efi.img", str(tmp_path / "efi.img"))
    sh("mcopy", "-i", str(tmp_path / "efi.img"), "::/EFI/BOOT/BOOTX64.EFI", str(tmp_path / "BOOTX64.EFI"))
    assert f"--fs-uuid {uuid}".encode() in (tmp_path / "BOOTX64.EFI").read_bytes()
    assert "KILN_EFI" in sh("mlabel", "-s", "-i", str(tmp_path / "efi.img"), "::")


def test_usb_partition_tables(iso: tuple[BootAssets, Path]) -> None:
    """Written raw to a stick: a GRUB hybrid MBR (BIOS) and a GPT whose ESP holds GRUB's EFI binary."""
    assets, image = iso
    data = image.read_bytes()
    assert data[510:512] == b"\x55\xaa"
    assert data[0:440] != bytes(440)  # boot code present
    area = sh("xorriso", "-indev", str(image), "-report_system_area", "plain")
    assert "grub2-mbr" in area and "protective-msdos-label" in area and "GPT" in area
    table = sh("sfdisk", "-d", str(image))
    assert "label: gpt" in table
    assert f"label-id: {str(derived_uuid(assets.seed, 'iso-gpt')).upper()}" in table
    esp = [line for line in table.splitlines() if f"type={ESP_TYPE}" in line]
    assert len(esp) == 1, table
    start = int(esp[0].split("start=")[1].split(",")[0])
    listing = sh("mdir", "-i", f"{image}@@{start * 512}", "::/EFI/BOOT")
    assert "BOOTX64" in listing


def test_byte_identical_rebuild(iso: tuple[BootAssets, Path], tmp_path: Path) -> None:
    """Same inputs, another directory, another wall-clock second: the same bytes. Another epoch: others."""
    assets, first = iso
    time.sleep(1.1)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    again = BootAssets.make(
        Path(shutil.copy(assets.vmlinuz, moved)),
        Path(shutil.copy(assets.initramfs, moved)),
        assets.cmdline,
        assets.version,
        assets.epoch,
    )
    second = build_iso(again, tmp_path / "again.iso")
    assert sha(second) == sha(first)
    later = BootAssets.make(again.vmlinuz, again.initramfs, assets.cmdline, assets.version, EPOCH + 86400)
    assert sha(build_iso(later, tmp_path / "later.iso")) != sha(first)


def test_missing_tools_is_an_actionable_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assets = fake_assets(tmp_path / "a")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BuildError, match=r"apt install .*xorriso"):
        build_iso(assets, tmp_path / "x.iso")


def test_pxe_directory(tmp_path: Path) -> None:
    assets = fake_assets(tmp_path / "a")
    out = tmp_path / "pxe"
    written = build_pxe(assets, out)
    assert sorted(p.name for p in written) == ["boot.ipxe", "initramfs.zst", "vmlinuz"]
    assert (out / "vmlinuz").read_bytes() == assets.vmlinuz.read_bytes()
    assert (out / "initramfs.zst").read_bytes() == assets.initramfs.read_bytes()
    script = (out / "boot.ipxe").read_text().splitlines()
    assert script[0] == "#!ipxe"
    commands = [line.split(maxsplit=1) for line in script[1:] if not line.startswith("echo")]
    # Relative paths: iPXE resolves them against the script's URI, on any TFTP or HTTP root.
    assert commands == [
        ["kernel", f"vmlinuz initrd=initramfs.zst {assets.cmdline}"],
        ["initrd", "initramfs.zst"],
        ["boot"],
    ]
    assert {int(p.stat().st_mtime) for p in written} == {EPOCH}
    # Rebuilding in place (sources are the outputs) keeps the files.
    same = BootAssets.make(out / "vmlinuz", out / "initramfs.zst", assets.cmdline, assets.version, EPOCH)
    build_pxe(same, out)
    assert (out / "vmlinuz").read_bytes() == assets.vmlinuz.read_bytes()


def test_machine_for_picks_pxe_and_keeps_kernel_mode(tmp_path: Path) -> None:
    assets = fake_assets(tmp_path / "a")
    pxe = tmp_path / "pxe"
    build_pxe(assets, pxe)
    machine = machine_for(pxe)
    assert machine.pxe == pxe.resolve() and machine.kernel is None and machine.cdrom is None
    command = " ".join(machine.command())
    assert f"tftp={pxe.resolve()},bootfile=boot.ipxe" in command
    assert "virtio-net-pci,netdev=net0,bootindex=0" in command
    assert "-kernel" not in command
    kernel_dir = machine_for(tmp_path / "a")  # vmlinuz + initramfs.zst, no boot.ipxe
    assert kernel_dir.kernel == tmp_path / "a/vmlinuz" and kernel_dir.pxe is None
    assert "tftp=" not in " ".join(kernel_dir.command())
    iso = tmp_path / "k.iso"
    iso.write_bytes(b"")
    assert machine_for(iso).cdrom == iso
    assert isinstance(machine_for(iso), Machine)
