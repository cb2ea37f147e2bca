"""The disk image and its formats, checked with the real tools (sfdisk, mtools, qemu-img, GRUB's images).

Stand-in: the kernel and initramfs are small fake files (random-looking bytes), since nothing
here boots; tests/e2e/test_disk_boot.py boots the real image from every format. sfdisk,
mkfs.fat, mtools, grub-mkimage and qemu-img are the real ones.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import InputError
from kiln.core.hashing import file_sha256
from kiln.image.assets import BootAssets, derived_uuid
from kiln.image.outputs.disk import (
    BIOS_BOOT_TYPE,
    ESP_TYPE,
    GRUB_LIB,
    LINUX_DATA_TYPE,
    MIB,
    build_raw,
    disk_guid,
    fat_serial,
    grub_fs_uuid,
    minimum_size,
    partition_guid,
)
from kiln.image.outputs.formats import VHD_EPOCH, convert, vhd_checksum
from kiln.image.outputs.grub import environment_block, slot_boot_config, slots_config

pytestmark = pytest.mark.integration

EPOCH = 1704067200  # 2024-01-01 00:00:00 UTC
SIZE = 1 << 30
QEMU_FORMAT = {"raw": "raw", "qcow2": "qcow2", "vhd": "vpc", "vmdk": "vmdk"}


def fake_assets(root: Path, epoch: int = EPOCH) -> BootAssets:
    root.mkdir(parents=True, exist_ok=True)
    kernel, initrd = root / "vmlinuz", root / "initramfs.zst"
    kernel.write_bytes(b"fake kernel\n" + hashlib.sha512(b"k").digest() * 4000)
    initrd.write_bytes(b"fake initramfs\n" + hashlib.sha512(b"i").digest() * 2000)
    return BootAssets.make(kernel, initrd, "console=ttyS0 kiln.platform=metal", "0.1.0", epoch)


def sh(*command: str) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "TZ": "UTC", "MTOOLS_SKIP_CHECK": "1"}
    )
    assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result.stdout + result.stderr


sha = file_sha256


def partitions(image: Path) -> dict[str, dict[str, Any]]:
    table = json.loads(sh("sfdisk", "--json", str(image)))["partitiontable"]
    return {"table": table, **{p["name"]: p for p in table["partitions"]}}


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path]:
    work = tmp_path_factory.mktemp("disk")
    assets = fake_assets(work / "assets")
    return assets, build_raw(assets, work / "out" / "disk.raw", SIZE)


def fat_file(image: Path, start_sector: int, name: str, dest: Path) -> bytes:
    sh("mcopy", "-n", "-i", f"{image}@@{start_sector * 512}", f"::/{name}", str(dest))
    return dest.read_bytes()


def test_partition_table(disk: tuple[BootAssets, Path]) -> None:
    assets, image = disk
    assert image.stat().st_size == SIZE
    assert image.stat().st_blocks * 512 < 64 * MIB, "the image is written sparse"
    found = partitions(image)
    table = found.pop("table")
    assert isinstance(table, dict)
    assert table["label"] == "gpt" and table["id"] == disk_guid(assets)
    assert table["id"] == str(derived_uuid(assets.seed, "disk")).upper()
    assert [p["name"] for p in table["partitions"]] == ["EFI", "BIOS", "BOOT", "META"]
    types = {"EFI": ESP_TYPE, "BIOS": BIOS_BOOT_TYPE, "BOOT": LINUX_DATA_TYPE, "META": LINUX_DATA_TYPE}
    sizes = {"EFI": 100 * MIB, "BIOS": MIB, "META": MIB}
    end = 2048
    for name, part in found.items():
        assert part["type"] == types[name]
        assert part["uuid"] == partition_guid(assets, name)
        assert part["start"] == end, f"{name} follows the previous partition"
        assert isinstance(part["start"], int) and isinstance(part["size"], int)
        assert part["start"] % 2048 == 0 and part["size"] % 2048 == 0, f"{name} is 1 MiB aligned"
        if name in sizes:
            assert part["size"] * 512 == sizes[name]
        end = part["start"] + part["size"]
    guids = {p["uuid"] for p in found.values()} | {table["id"]}
    assert len(guids) == 5
    # Everything after META is free for machined's STATE and EPHEMERAL.
    assert (table["lastlba"] + 1 - end) * 512 > SIZE - 400 * MIB
    sh("sfdisk", "--verify", str(image))


def test_boot_holds_slot_a_the_slot_menu_and_the_boot_state(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    boot = partitions(image)["BOOT"]
    start = boot["start"]
    assert isinstance(start, int)
    assert fat_file(image, start, "A/vmlinuz", tmp_path / "k") == assets.vmlinuz.read_bytes()
    assert fat_file(image, start, "A/initramfs.zst", tmp_path / "i") == assets.initramfs.read_bytes()
    slot = fat_file(image, start, "A/boot.cfg", tmp_path / "s").decode()
    assert slot == slot_boot_config(assets, "A", "vmlinuz", "initramfs.zst")
    assert "linux /A/vmlinuz console=ttyS0 kiln.platform=metal kiln.slot=A\n" in slot
    assert fat_file(image, start, "grub/grub.cfg", tmp_path / "g").decode() == slots_config()
    env = fat_file(image, start, "grub/grubenv", tmp_path / "e")
    assert env == environment_block({"kiln_default": "A", "kiln_version_A": assets.version})
    assert len(env) == 1024 and env.startswith(
        f"# GRUB Environment Block\nkiln_default=A\nkiln_version_A={assets.version}\n#".encode()
    )
    assert not sh("mdir", "-b", "-i", f"{image}@@{start * 512}", "::/").count("::/B")  # slot B: written by an upgrade
    info = sh("minfo", "-i", f"{image}@@{start * 512}", "::")
    assert f"serial number: {fat_serial(assets, 'BOOT')}" in info
    assert sh("mlabel", "-s", "-i", f"{image}@@{start * 512}", "::").split() == ["Volume", "label", "is", "BOOT"]
    listing = sh("mdir", "-i", f"{image}@@{start * 512}", "::/A")
    assert listing.count("2024-01-01") >= 3, f"file times are the epoch (UTC):\n{listing}"


def test_esp_holds_grub_efi(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    start = partitions(image)["EFI"]["start"]
    assert isinstance(start, int)
    efi = fat_file(image, start, "EFI/BOOT/BOOTX64.EFI", tmp_path / "efi")
    assert efi[:2] == b"MZ" and b"PE\0\0" in efi[:4096]
    # Its embedded config finds BOOT by the FAT serial derived from the seed.
    assert f"--fs-uuid {grub_fs_uuid(fat_serial(assets, 'BOOT'))}".encode() in efi
    assert f"serial number: {fat_serial(assets, 'EFI')}" in sh("minfo", "-i", f"{image}@@{start * 512}", "::")


def test_mbr_and_bios_partition_hold_grub(disk: tuple[BootAssets, Path]) -> None:
    _, image = disk
    bios = partitions(image)["BIOS"]["start"]
    assert isinstance(bios, int)
    with image.open("rb") as stream:
        mbr = stream.read(512)
        stream.seek(bios * 512)
        core = stream.read(MIB)
    boot_img = (GRUB_LIB / "i386-pc/boot.img").read_bytes()
    # GRUB's boot code, with the fields grub-bios-setup patches: core.img's LBA, boot drive, drive check.
    assert mbr[:3] == boot_img[:3] and mbr[0x5A:0x5C] == boot_img[0x5A:0x5C]
    assert mbr[0x67 + 1 : 0x1B8] == boot_img[0x67 + 1 : 0x1B8]
    assert struct.unpack_from("<Q", mbr, 0x5C)[0] == bios
    assert mbr[0x64] == 0xFF and mbr[0x66:0x68] == b"\x90\x90"
    assert b"GRUB \0Geom\0Hard Disk\0Read\0 Error" in mbr
    # The protective MBR entry and signature are still there.
    assert mbr[0x1C2] == 0xEE and mbr[0x1FE:] == b"\x55\xaa"
    # core.img: diskboot first, whose blocklist points at the sectors right after it.
    diskboot = (GRUB_LIB / "i386-pc/diskboot.img").read_bytes()
    assert core[:0x1F4] == diskboot[:0x1F4]
    start, length, segment = struct.unpack_from("<QHH", core, 0x1F4)
    assert start == bios + 1 and segment == 0x820 and 0 < length < 2047


def test_two_builds_are_byte_identical(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    """Other paths, other file times, a later wall clock: the same bytes."""
    assets, image = disk
    copies = tmp_path / "copies"
    copies.mkdir()
    kernel, initrd = copies / "vmlinuz", copies / "initramfs.zst"
    shutil.copyfile(assets.vmlinuz, kernel)
    shutil.copyfile(assets.initramfs, initrd)
    os.utime(kernel, (1_000_000_000, 1_000_000_000))
    time.sleep(1.1)
    again = BootAssets.make(kernel, initrd, assets.cmdline, assets.version, assets.epoch)
    assert again.seed == assets.seed
    second = build_raw(again, tmp_path / "elsewhere" / "disk.raw", SIZE)
    assert sha(second) == sha(image)
    other = BootAssets.make(kernel, initrd, assets.cmdline, assets.version, assets.epoch + 1)
    third = build_raw(other, tmp_path / "other.raw", SIZE)
    assert sha(third) != sha(image), "another epoch (so another seed) gives other GUIDs and times"


def test_sizes_the_layout_cannot_take(tmp_path: Path) -> None:
    assets = fake_assets(tmp_path / "assets")
    with pytest.raises(InputError, match="too small"):
        build_raw(assets, tmp_path / "small.raw", minimum_size(assets) - MIB)
    with pytest.raises(InputError, match="multiple of 512"):
        build_raw(assets, tmp_path / "odd.raw", SIZE + 100)
    assert not list(tmp_path.glob("*.raw*")), "nothing is left behind"
    smallest = build_raw(assets, tmp_path / "smallest.raw", minimum_size(assets))
    sh("sfdisk", "--verify", str(smallest))


@pytest.mark.parametrize("fmt", ["raw", "qcow2", "vhd", "vmdk"])
def test_formats_are_valid_and_reproducible(disk: tuple[BootAssets, Path], tmp_path: Path, fmt: str) -> None:
    assets, image = disk
    out = convert(image, fmt, tmp_path / "a" / f"disk.{fmt}", assets)
    info = json.loads(sh("qemu-img", "info", "--output=json", "-f", QEMU_FORMAT[fmt], str(out)))
    assert info["format"] == QEMU_FORMAT[fmt] and info["virtual-size"] == SIZE
    if fmt in ("qcow2", "vmdk"):
        assert "No errors" in sh("qemu-img", "check", "-f", QEMU_FORMAT[fmt], str(out))
    # The guest sees exactly the raw image.
    sh("qemu-img", "compare", "-f", "raw", "-F", QEMU_FORMAT[fmt], str(image), str(out))
    time.sleep(1.1)  # a later wall clock: VHD and VMDK carry times and ids qemu-img would randomise
    again = convert(image, fmt, tmp_path / "b" / f"disk.{fmt}", assets)
    assert sha(again) == sha(out)


def test_vhd_footer(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    vhd = convert(image, "vhd", tmp_path / "disk.vhd", assets)
    assert vhd.stat().st_size == SIZE + 512
    footer = _tail(vhd, 512)
    assert footer[:8] == b"conectix"
    assert struct.unpack_from(">I", footer, 60)[0] == 2, "disk type fixed"
    current = struct.unpack_from(">Q", footer, 48)[0]
    assert current == SIZE and current % MIB == 0
    assert struct.unpack_from(">I", footer, 24)[0] == EPOCH - VHD_EPOCH
    assert footer[68:84] == derived_uuid(assets.seed, "vhd").bytes
    assert struct.unpack_from(">I", footer, 64)[0] == vhd_checksum(footer)
    # A wrong checksum is what qemu-img would refuse: the patched one is the one it accepts.
    broken = tmp_path / "broken.vhd"
    subprocess.run(["cp", "--sparse=always", str(vhd), str(broken)], check=True)
    with broken.open("r+b") as stream:
        stream.seek(-512 + 64, 2)
        stream.write(b"\0\0\0\0")
    refused = subprocess.run(["qemu-img", "info", "-f", "vpc", str(broken)], capture_output=True, text=True)
    assert refused.returncode != 0 and "checksum" in refused.stderr


def test_vhd_of_unaligned_raw_is_grown_to_whole_mib(tmp_path: Path) -> None:
    assets = fake_assets(tmp_path / "assets")
    size = 700 * MIB + 4096
    raw = build_raw(assets, tmp_path / "odd.raw", size)
    vhd = convert(raw, "vhd", tmp_path / "odd.vhd", assets)
    current = struct.unpack_from(">Q", _tail(vhd, 512), 48)[0]
    assert current == 701 * MIB
    info = json.loads(sh("qemu-img", "info", "--output=json", "-f", "vpc", str(vhd)))
    assert info["virtual-size"] == 701 * MIB
    back = tmp_path / "back.raw"
    sh("qemu-img", "convert", "-f", "vpc", "-O", "raw", str(vhd), str(back))
    sh("sfdisk", "--verify", str(back))  # the backup GPT moved to the new end
    table = json.loads(sh("sfdisk", "--json", str(back)))["partitiontable"]
    assert [p["name"] for p in table["partitions"]] == ["EFI", "BIOS", "BOOT", "META"]
    assert raw.stat().st_size == size, "the raw image itself is left alone"


def test_vmdk_descriptor(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    vmdk = convert(image, "vmdk", tmp_path / "disk.vmdk", assets)
    head = _head(vmdk, 64 << 10)
    assert head[:4] == b"KDMV"
    descriptor = head[512:].split(b"\0", 1)[0].decode()
    assert 'createType="streamOptimized"' in descriptor
    assert f"CID={derived_uuid(assets.seed, 'vmdk-cid').hex[:8]}\n" in descriptor
    assert "parentCID=ffffffff" in descriptor
    info = json.loads(sh("qemu-img", "info", "--output=json", str(vmdk)))
    assert info["format"] == "vmdk" and info["format-specific"]["data"]["create-type"] == "streamOptimized"


def test_vmdk_cid_patch_drops_what_qemu_left_after_the_descriptor(
    disk: tuple[BootAssets, Path], tmp_path: Path
) -> None:
    """qemu-img rewrites the descriptor when it first writes data, each time with a random CID printed
    without leading zeros: a shorter second CID leaves the first descriptor's last byte after the NUL.
    Here that leftover is put back by hand into a real VMDK; patching gives the same bytes as without it."""
    from kiln.image.outputs.formats import patch_vmdk_cid

    assets, image = disk
    made = convert(image, "vmdk", tmp_path / "clean" / "kiln.vmdk", assets)
    data = bytearray(made.read_bytes())
    offset = struct.unpack_from("<Q", data, 28)[0] * 512
    text = bytes(data[offset : data.index(b"\0", offset)])
    shorter = re.sub(rb"\nCID=[0-9a-f]{8}\n", b"\nCID=1234567\n", text)  # a CID printed one digit shorter
    assert len(shorter) == len(text) - 1
    data[offset : offset + len(text) + 1] = shorter + b"\0\n"  # and the old descriptor's last byte after it
    dirty = tmp_path / "dirty.vmdk"
    dirty.write_bytes(bytes(data))
    patch_vmdk_cid(dirty, assets)
    assert dirty.read_bytes() == made.read_bytes()


def test_ova(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    ova = convert(image, "ova", tmp_path / "kiln.ova", assets)
    with ova.open("rb") as stream:
        assert stream.read(512)[257:263] == b"ustar\0", "POSIX ustar headers"
    with tarfile.open(ova) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["kiln.ovf", "kiln.mf", "kiln.vmdk"]
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == EPOCH and m.isfile() for m in members)
        files = {m.name: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    vmdk = files["kiln.vmdk"]
    manifest = files["kiln.mf"].decode().splitlines()
    assert manifest == [
        f"SHA256(kiln.ovf)= {hashlib.sha256(files['kiln.ovf']).hexdigest()}",
        f"SHA256(kiln.vmdk)= {hashlib.sha256(vmdk).hexdigest()}",
    ]
    ns = {
        "ovf": "http://schemas.dmtf.org/ovf/envelope/1",
        "rasd": "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData",
    }
    root = ET.parse(io.BytesIO(files["kiln.ovf"])).getroot()
    ref = root.find("ovf:References/ovf:File", ns)
    assert ref is not None
    assert ref.get(f"{{{ns['ovf']}}}href") == "kiln.vmdk" and ref.get(f"{{{ns['ovf']}}}size") == str(len(vmdk))
    disk_el = root.find("ovf:DiskSection/ovf:Disk", ns)
    assert disk_el is not None and disk_el.get(f"{{{ns['ovf']}}}capacity") == str(SIZE)
    assert "streamOptimized" in (disk_el.get(f"{{{ns['ovf']}}}format") or "")
    kinds = [
        item.findtext("rasd:ResourceType", namespaces=ns)
        for item in root.iterfind("ovf:VirtualSystem/ovf:VirtualHardwareSection/ovf:Item", ns)
    ]
    assert sorted(kinds, key=lambda kind: int(kind or 0)) == ["3", "4", "5", "10", "17"]  # CPU, memory, IDE, NIC, disk
    for item in root.iterfind(".//ovf:Item", ns):
        tags = [child.tag for child in item]
        assert tags == sorted(tags), "RASD elements in schema (alphabetical) order"
    # The disk inside is the same streamOptimized VMDK `convert` makes on its own.
    alone = convert(image, "vmdk", tmp_path / "alone" / "kiln.vmdk", assets)
    assert hashlib.sha256(vmdk).hexdigest() == sha(alone)
    time.sleep(1.1)
    assert sha(convert(image, "ova", tmp_path / "again" / "kiln.ova", assets)) == sha(ova)


def test_unknown_format(disk: tuple[BootAssets, Path], tmp_path: Path) -> None:
    assets, image = disk
    with pytest.raises(InputError, match="unknown disk format"):
        convert(image, "vdi", tmp_path / "disk.vdi", assets)


def _tail(path: Path, count: int) -> bytes:
    with path.open("rb") as stream:
        stream.seek(-count, 2)
        return stream.read()


def _head(path: Path, count: int) -> bytes:
    with path.open("rb") as stream:
        return stream.read(count)
