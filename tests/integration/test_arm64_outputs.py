"""arm64 outputs (UEFI only): the ISO, the raw GPT disk and the PXE directory, made from the real GRUB
arm64 EFI modules and checked with the real tools (xorriso, sfdisk, mtools), each twice for the same bytes.

GRUB's modules come from pkgs/grub-efi-arm64 built through the normal build path (`kiln build`,
the bubblewrap sandbox, the shared test seed): it only unpacks Debian's .deb, so it takes seconds.
It is built for linux/amd64 because the shared seed is the native one (an arm64 build needs the
cross seed); the package renders to the same steps for both platforms (checked below), so its
output is the same.

Stand-ins: the kernel is a small file with an arm64 Image header (the EFI stub's "MZ" and the
ARM\\x64 magic at 0x38, which the imager checks) and the initramfs random-looking bytes: nothing
boots here. Booting an arm64 image needs a real arm64 kernel (the kernel package cross-builds in
about 15 minutes) and takes about 20 s per boot under TCG with AAVMF; the outputs were booted that
way by hand with Debian's arm64 kernel and a busybox initramfs (ISO as CD and as USB disk, the raw
disk with a trial slot, PXE over QEMU's TFTP).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kiln.image.assets import BootAssets, Loader
from kiln.image.imager import Built, make_images
from kiln.image.outputs.disk import BIOS_BOOT_TYPE, ESP_TYPE, LINUX_DATA_TYPE, build_raw
from kiln.image.outputs.grub import grub_config, slot_boot_config, slots_config
from kiln.image.outputs.iso import build_iso
from kiln.image.outputs.pxe import NET_LOAD_CFG, build_pxe
from kiln.image.profile import load_profile
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

EPOCH = 1704067200
MIB = 1 << 20
SIZE = 512 * MIB
CMDLINE = "console=ttyAMA0 kiln.platform=metal"
PE_MACHINES = {0x8664: "amd64", 0xAA64: "arm64"}


def sh(*command: str) -> str:
    env = {**os.environ, "TZ": "UTC", "MTOOLS_SKIP_CHECK": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result.stdout + result.stderr


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pe_machine(data: bytes) -> str:
    """The machine of a PE image (what UEFI checks before it runs an EFI program)."""
    assert data[:2] == b"MZ", "not a PE image"
    (offset,) = struct.unpack_from("<I", data, 0x3C)
    assert data[offset : offset + 4] == b"PE\0\0"
    (machine,) = struct.unpack_from("<H", data, offset + 4)
    return PE_MACHINES.get(machine, hex(machine))


@pytest.fixture(scope="module")
def loader(grub_tree: Path) -> Loader:
    return Loader.for_arch("arm64", ("uefi",), grub_tree / "usr/lib/grub/arm64-efi")


def stand_ins(root: Path) -> tuple[Path, Path]:
    """A stand-in arm64 kernel Image (a real header, fake body) and a fake initramfs."""
    root.mkdir(parents=True, exist_ok=True)
    header = bytearray(64)
    header[0:2] = b"MZ"
    header[0x38:0x3C] = b"ARM\x64"
    kernel, initrd = root / "vmlinuz", root / "initramfs.zst"
    kernel.write_bytes(bytes(header) + hashlib.sha512(b"k").digest() * 4000)
    initrd.write_bytes(b"fake initramfs\n" + hashlib.sha512(b"i").digest() * 2000)
    return kernel, initrd


def arm64_assets(root: Path, loader: Loader) -> BootAssets:
    kernel, initrd = stand_ins(root)
    return BootAssets.make(kernel, initrd, CMDLINE, "0.1.0", EPOCH, loader=loader)


def again(assets: BootAssets, root: Path) -> BootAssets:
    """The same assets from copies in another directory: outputs may depend on nothing else."""
    root.mkdir(parents=True)
    kernel, initrd = root / "k", root / "i"
    shutil.copyfile(assets.vmlinuz, kernel)
    shutil.copyfile(assets.initramfs, initrd)
    return BootAssets.make(kernel, initrd, assets.cmdline, assets.version, assets.epoch, loader=assets.loader)


def test_the_package_is_grubs_arm64_efi_modules(grub_tree: Path) -> None:
    modules = grub_tree / "usr/lib/grub/arm64-efi"
    assert sorted(p.name for p in grub_tree.rglob("*") if p.is_dir()) == ["arm64-efi", "grub", "lib", "usr"]
    for name in ("kernel.img", "normal.mod", "linux.mod", "efinet.mod", "tftp.mod", "fat.mod", "iso9660.mod"):
        data = (modules / name).read_bytes()
        assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == 0xB7, f"{name}: not aarch64"
    assert not (modules / "monolithic").exists()
    # The same .deb and steps whichever arch the graph targets: the amd64-built output stands for both.
    specs = [
        load_tree(ROOT / "pkgs", Platform.parse(p)).packages["grub-efi-arm64"] for p in ("linux/amd64", "linux/arm64")
    ]
    assert specs[0].steps == specs[1].steps and specs[0].finalize == specs[1].finalize


@pytest.fixture(scope="module")
def iso(loader: Loader, tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path]:
    work = tmp_path_factory.mktemp("iso")
    assets = arm64_assets(work / "assets", loader)
    return assets, build_iso(assets, work / "out" / "kiln-arm64.iso")


def test_iso_has_only_the_uefi_boot_image(iso: tuple[BootAssets, Path]) -> None:
    _, image = iso
    report = sh("xorriso", "-indev", str(image), "-report_el_torito", "plain")
    entries = [line.split() for line in report.splitlines() if line.startswith("El Torito boot img :")]
    assert [fields[6] for fields in entries] == ["UEFI"], report
    assert "/efi.img" in report and "eltorito.img" not in report and "grub2-boot-info" not in report
    head = image.read_bytes()[:512]
    assert head[:440] == bytes(440), "no GRUB hybrid MBR boot code: nothing for a BIOS to run"
    table = json.loads(sh("sfdisk", "--json", str(image)))["partitiontable"]
    # xorriso's GPT: the EFI image as the ESP (UEFI from a USB stick), between "Gap" entries covering the rest
    assert table["label"] == "gpt" and [p["type"] for p in table["partitions"]].count(ESP_TYPE) == 1


def test_iso_efi_image_holds_an_arm64_grub(iso: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = iso
    sh("xorriso", "-osirrox", "on", "-indev", str(image), "-extract", "/", str(tmp_path / "x"))
    root = tmp_path / "x"
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "boot.catalog",
        "boot/grub/grub.cfg",
        "boot/initramfs.zst",
        "boot/vmlinuz",
        "efi.img",
    ]
    assert (root / "boot/vmlinuz").read_bytes() == assets.vmlinuz.read_bytes()
    menu = (root / "boot/grub/grub.cfg").read_text()
    assert menu == grub_config(assets, "/boot/vmlinuz", "/boot/initramfs.zst")
    assert f"    linux /boot/vmlinuz {CMDLINE}\n" in menu and "serial" not in menu
    efi = root / "efi.img"
    listing = sh("mdir", "-b", "-i", str(efi), "::/EFI/BOOT")
    assert listing.split() == ["::/EFI/BOOT/BOOTAA64.EFI"]
    sh("mcopy", "-n", "-i", str(efi), "::/EFI/BOOT/BOOTAA64.EFI", str(tmp_path / "boot.efi"))
    binary = (tmp_path / "boot.efi").read_bytes()
    assert pe_machine(binary) == "arm64"


def test_iso_is_byte_identical_across_assemblies(iso: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = iso
    second = build_iso(again(assets, tmp_path / "b"), tmp_path / "elsewhere" / "kiln-arm64.iso")
    assert sha(second) == sha(image)


@pytest.fixture(scope="module")
def disk(loader: Loader, tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path]:
    work = tmp_path_factory.mktemp("disk")
    assets = arm64_assets(work / "assets", loader)
    return assets, build_raw(assets, work / "out" / "disk.raw", SIZE)


def partitions(image: Path) -> dict[str, Any]:
    table = json.loads(sh("sfdisk", "--json", str(image)))["partitiontable"]
    return {p["name"]: p for p in table["partitions"]}


def fat_file(image: Path, part: dict[str, Any], name: str, dest: Path) -> bytes:
    sh("mcopy", "-n", "-i", f"{image}@@{part['start'] * 512}", f"::/{name}", str(dest))
    return dest.read_bytes()


def test_disk_keeps_amd64s_layout(disk: tuple[BootAssets, Path]) -> None:
    """The same four partitions at the same places as amd64's: machined's partition plan, `machined
    install` and upgrades treat every Kiln disk alike. The BIOS boot partition stays, empty."""
    _, image = disk
    parts = partitions(image)
    assert [(n, p["type"], p["start"], p["size"]) for n, p in parts.items()] == [
        ("EFI", ESP_TYPE, 2048, 100 * 2048),
        ("BIOS", BIOS_BOOT_TYPE, 101 * 2048, 2048),
        ("BOOT", LINUX_DATA_TYPE, 102 * 2048, 128 * 2048),
        ("META", LINUX_DATA_TYPE, 230 * 2048, 2048),
    ]
    with image.open("rb") as stream:
        assert stream.read(440) == bytes(440), "no GRUB boot.img in the protective MBR"
        stream.seek(parts["BIOS"]["start"] * 512)
        assert stream.read(MIB) == bytes(MIB), "no core.img in the BIOS boot partition"
    sh("sfdisk", "--verify", str(image))


def test_disk_esp_and_boot_hold_arm64_grub_and_slot_a(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    parts = partitions(image)
    esp = sh("mdir", "-b", "-i", f"{image}@@{parts['EFI']['start'] * 512}", "::/EFI/BOOT")
    assert esp.split() == ["::/EFI/BOOT/BOOTAA64.EFI"]
    assert pe_machine(fat_file(image, parts["EFI"], "EFI/BOOT/BOOTAA64.EFI", tmp_path / "efi")) == "arm64"
    boot = parts["BOOT"]
    assert fat_file(image, boot, "grub/grub.cfg", tmp_path / "cfg").decode() == slots_config(serial=False)
    assert fat_file(image, boot, "A/boot.cfg", tmp_path / "slot").decode() == slot_boot_config(
        assets, "A", "vmlinuz", "initramfs.zst"
    )
    assert fat_file(image, boot, "A/vmlinuz", tmp_path / "k") == assets.vmlinuz.read_bytes()
    env = fat_file(image, boot, "grub/grubenv", tmp_path / "env")
    assert len(env) == 1024 and env.startswith(b"# GRUB Environment Block\nkiln_default=A\nkiln_version_A=0.1.0\n")


def test_disk_is_byte_identical_across_assemblies(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    second = build_raw(again(assets, tmp_path / "b"), tmp_path / "elsewhere" / "disk.raw", SIZE)
    assert sha(second) == sha(image)


@pytest.fixture(scope="module")
def pxe(loader: Loader, tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path]:
    work = tmp_path_factory.mktemp("pxe")
    assets = arm64_assets(work / "assets", loader)
    build_pxe(assets, work / "out")
    return assets, work / "out"


def test_pxe_directory_holds_grubs_netboot_image_and_menu(pxe: tuple[BootAssets, Path]) -> None:
    assets, directory = pxe
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["boot.ipxe", "bootaa64.efi", "grub.cfg", "initramfs.zst", "vmlinuz"]
    for path in directory.iterdir():
        assert (path.stat().st_mode & 0o777, int(path.stat().st_mtime)) == (0o644, EPOCH), path.name
    netboot = (directory / "bootaa64.efi").read_bytes()
    assert pe_machine(netboot) == "arm64"
    assert NET_LOAD_CFG.encode() in netboot, "the embedded config takes grub.cfg from where GRUB came from"
    menu = (directory / "grub.cfg").read_text()
    assert menu == grub_config(assets, "$prefix/vmlinuz", "$prefix/initramfs.zst")
    assert f"    linux $prefix/vmlinuz {CMDLINE}\n    initrd $prefix/initramfs.zst\n" in menu
    assert (directory / "vmlinuz").read_bytes() == assets.vmlinuz.read_bytes()


def test_pxe_is_byte_identical_across_assemblies(pxe: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, directory = pxe
    build_pxe(again(assets, tmp_path / "b"), tmp_path / "elsewhere")
    assert {p.name: sha(p) for p in (tmp_path / "elsewhere").iterdir()} == {p.name: sha(p) for p in directory.iterdir()}


def test_amd64_uefi_only_outputs_drop_the_bios_parts(tmp_path: Path) -> None:
    """firmware: [uefi] on amd64: the host's x86_64 GRUB alone, in the same places."""
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initramfs.zst"
    kernel.write_bytes(b"fake kernel\n" * 1000)
    initrd.write_bytes(b"fake initramfs\n" * 1000)
    assets = BootAssets.make(
        kernel, initrd, "console=ttyS0", "0.1.0", EPOCH, loader=Loader.for_arch("amd64", ("uefi",))
    )
    image = build_iso(assets, tmp_path / "kiln-amd64.iso")
    report = sh("xorriso", "-indev", str(image), "-report_el_torito", "plain")
    assert [line.split()[6] for line in report.splitlines() if line.startswith("El Torito boot img :")] == ["UEFI"]
    raw = build_raw(assets, tmp_path / "disk.raw", SIZE)
    parts = partitions(raw)
    assert pe_machine(fat_file(raw, parts["EFI"], "EFI/BOOT/BOOTX64.EFI", tmp_path / "efi")) == "amd64"
    assert raw.read_bytes()[:440] == bytes(440)


def test_the_imager_writes_arm64_outputs_from_the_grub_package(grub_tree: Path, tmp_path: Path) -> None:
    """`kiln image` with arm64 profiles: GRUB from the package's store tree, its key in the manifest,
    the package in the SBOM as the boot loader, the ISO named for arm64; twice the same bytes."""
    kernel, initrd = stand_ins(tmp_path / "inputs")
    profiles = []
    for kind in ("iso", "image", "pxe"):
        path = tmp_path / "inputs" / f"arm-{kind}.yaml"
        body = {
            "arch": "arm64",
            "platform": "metal",
            "version": "0.1.0",
            "input": {"kernel": {"path": str(kernel)}, "initramfs": {"path": str(initrd)}},
            "output": {"kind": kind, **({"image": {"disk_size": "256MiB"}} if kind == "image" else {})},
        }
        path.write_text(json.dumps(body))
        profiles.append(load_profile(path))
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/arm64")))
    key = "ab" * 32
    built = Built(graph, {"grub-efi-arm64": grub_tree}, {"grub-efi-arm64": key}, EPOCH)
    runs = []
    for run in ("one", "two"):
        results = make_images(profiles, built, tmp_path / run, 2, lambda _: None)
        runs.append({r.profile.name: r.artifacts for r in results})
    assert runs[0] == runs[1]
    assert [a["path"] for a in runs[0]["arm-iso"]] == ["metal-arm64.iso"]
    assert [a["path"] for a in runs[0]["arm-pxe"]] == [
        "boot.ipxe",
        "bootaa64.efi",
        "grub.cfg",
        "initramfs.zst",
        "vmlinuz",
    ]
    manifest = json.loads((tmp_path / "one/arm-image/manifest.json").read_text())
    assert manifest["profile"]["arch"] == "arm64"
    assert manifest["inputs"]["packages"] == {"grub-efi-arm64": key}
    assert manifest["inputs"]["cmdline"] == "console=ttyAMA0 kiln.platform=metal"
    sbom = json.loads((tmp_path / "one/arm-image/sbom.spdx.json").read_text())
    [grub] = [p for p in sbom["packages"] if p["name"] == "grub-efi-arm64"]
    assert grub["versionInfo"] == "2.06-13+deb12u2" and "(bootloader)" in grub["sourceInfo"]
    assert grub["downloadLocation"].endswith("grub-efi-arm64-bin_2.06-13+deb12u2_arm64.deb")
    disk = tmp_path / "one/arm-image/metal-arm64.raw"
    assert sh("mdir", "-b", "-i", f"{disk}@@{MIB}", "::/EFI/BOOT").split() == ["::/EFI/BOOT/BOOTAA64.EFI"]
