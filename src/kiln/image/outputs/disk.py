"""The raw GPT disk image: EFI, BIOS, BOOT and META partitions that SeaBIOS and OVMF both boot.

Layout (docs/disk-layout.md): a protective MBR holding GRUB's boot.img, the GPT, then EFI
(FAT32, /EFI/BOOT/BOOTX64.EFI), BIOS (GRUB's i386-pc core.img, raw), BOOT (FAT32: slot A's
A/vmlinuz, A/initramfs.zst and A/boot.cfg, the slot menu grub/grub.cfg and the boot state
grub/grubenv; slot B is written by an upgrade) and META (1 MiB, empty). The rest of the disk stays free:
machined creates STATE and EPHEMERAL there on first boot. Both GRUB images find BOOT by its
FAT serial and read the shared menu from it.

Nothing is mounted. The filesystems are made with mkfs.fat and filled with mtools straight at
their offsets inside the image; every GUID and FAT serial derives from the assets' seed and
every FAT time from SOURCE_DATE_EPOCH (TZ=UTC), so the same assets give the same bytes.

arm64 disks (UEFI only) have the same four partitions at the same places, so machined's
partition plan, `machined install` and upgrades treat every Kiln disk alike: EFI holds
EFI/BOOT/BOOTAA64.EFI (GRUB from the grub-efi-arm64 package), and the BIOS boot partition stays,
empty, with no GRUB boot code in the protective MBR. BOOT, its A/B menu and grubenv are as on amd64.

Secure Boot disks (assets with keys; UEFI only) have the same layout too: EFI holds the signed shim
as the removable-media loader and the signed GRUB beside it, and slot A holds the signed UKI
(A/kiln.efi) with a boot.cfg that chainloads it, in place of the kernel and initramfs
(kiln.image.outputs.secureboot).
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError, InputError
from kiln.image.assets import HOST_GRUB, BootAssets, derived_uuid
from kiln.image.outputs import secureboot
from kiln.image.outputs.grub import (
    ENV_NAME,
    MENU_MODULES,
    environment_block,
    mkimage,
    require_tools,
    slot_boot_config,
    slots_config,
)
from kiln.image.outputs.uki import UKI_NAME

MIB = 1 << 20
SECTOR = 512
GRUB_LIB = HOST_GRUB

ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
BIOS_BOOT_TYPE = "21686148-6449-6E6F-744E-656564454649"
LINUX_DATA_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"

ESP_SIZE = 100 * MIB
BIOS_SIZE = 1 * MIB
BOOT_MIN_SIZE = 128 * MIB
META_SIZE = 1 * MIB
# The backup GPT (header + 128 entries) at the end of the disk, rounded up to the alignment.
BACKUP_GPT = 1 * MIB

KERNEL_NAME = "vmlinuz"
INITRD_NAME = "initramfs.zst"
INSTALL_SLOT = "A"  # the disk image, the installer and `kiln install` all write slot A

# Modules built into both core images: nothing is loaded from disk but grub.cfg.
COMMON_MODULES = ["part_gpt", "fat", *MENU_MODULES, "loadenv"]
BIOS_MODULES = ["biosdisk", *COMMON_MODULES]
EFI_MODULES = ["efi_gop", *COMMON_MODULES]

# Offsets GRUB's i386-pc boot.img and diskboot.img (core.img's first sector) keep their
# patchable fields at (grub/include/grub/i386/pc/boot.h).
BPB_START, BPB_END = 0x03, 0x5A  # a DOS BPB, copied from the existing MBR
KERNEL_SECTOR = 0x5C  # 64-bit LBA of core.img's first sector
BOOT_DRIVE = 0x64  # 0xff: use the drive the BIOS booted from
DRIVE_CHECK = 0x66  # a jump that treats drives < 0x80 as floppies; NOPed for hard disks
TABLE_START, TABLE_END = 0x1B8, 0x1FE  # disk signature + partition table, kept from the MBR
BLOCKLIST = SECTOR - 12  # diskboot.img's first blocklist entry: start (u64), length (u16), segment (u16)

TOOLS = {"sfdisk": "fdisk", "mkfs.fat": "dosfstools", "mmd": "mtools", "mcopy": "mtools", "grub-mkimage": "grub-common"}


@dataclass(frozen=True)
class Partition:
    """One GPT entry: name, type GUID, start and size in bytes (its own GUID derives from the name)."""

    name: str
    type: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def layout(assets: BootAssets) -> list[Partition]:
    """EFI, BIOS, BOOT, META back to back from 1 MiB, each 1 MiB aligned.

    BOOT is 128 MiB, or more when twice the kernel and initramfs (room for an upgrade's second
    set) do not fit in it.
    """
    payload = assets.vmlinuz.stat().st_size + assets.initramfs.stat().st_size
    boot_size = max(BOOT_MIN_SIZE, _align(2 * payload + 16 * MIB, MIB))
    parts: list[Partition] = []
    at = MIB
    for name, kind, size in (
        ("EFI", ESP_TYPE, ESP_SIZE),
        ("BIOS", BIOS_BOOT_TYPE, BIOS_SIZE),
        ("BOOT", LINUX_DATA_TYPE, boot_size),
        ("META", LINUX_DATA_TYPE, META_SIZE),
    ):
        parts.append(Partition(name, kind, at, size))
        at += size
    return parts


def minimum_size(assets: BootAssets) -> int:
    """The smallest disk the partitions fit on (machined wants 356 MiB more for STATE and EPHEMERAL)."""
    return layout(assets)[-1].end + BACKUP_GPT


def disk_guid(assets: BootAssets) -> str:
    return str(derived_uuid(assets.seed, "disk")).upper()


def partition_guid(assets: BootAssets, name: str) -> str:
    return str(derived_uuid(assets.seed, f"disk-part-{name}")).upper()


def fat_serial(assets: BootAssets, name: str) -> str:
    """The FAT volume serial of partition `name`, 8 hex digits (GRUB shows it as XXXX-XXXX)."""
    return derived_uuid(assets.seed, f"disk-fat-{name}").hex[:8].upper()


def grub_fs_uuid(serial: str) -> str:
    """How GRUB's `search --fs-uuid` names a FAT serial."""
    return f"{serial[:4]}-{serial[4:]}".upper()


def build_raw(assets: BootAssets, out: Path, size: int) -> Path:
    """Write the raw disk image of `size` bytes (sparse) to `out` and return it."""
    if size % SECTOR:
        raise InputError(f"disk size {size} is not a multiple of {SECTOR} bytes")
    needed = minimum_size(assets)
    if size < needed:
        raise InputError(
            f"disk size {size // MIB} MiB is too small: EFI, BIOS, BOOT and META need "
            f"{needed // MIB} MiB (and machined 356 MiB more for STATE and EPHEMERAL)"
        )
    loader = assets.loader
    require_tools(loader, TOOLS, "boot.img", "a disk image")
    parts = {p.name: p for p in layout(assets)}
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(assets.epoch), "TZ": "UTC", "LC_ALL": "C", "MTOOLS_SKIP_CHECK": "1"}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    with partial.open("wb") as image:
        image.truncate(size)
    try:
        _partition(assets, partial, list(parts.values()), env)
        with tempfile.TemporaryDirectory(prefix="kiln-disk-") as tmp:
            work = Path(tmp)
            boot_uuid = grub_fs_uuid(fat_serial(assets, "BOOT"))
            load_cfg = work / "load.cfg"
            # Both core images look for BOOT by its serial and read the menu there.
            load_cfg.write_text(f"search --no-floppy --set=root --fs-uuid {boot_uuid}\nset prefix=($root)/grub\n")
            core = work / "core.img"
            if loader.bios:
                mkimage("i386-pc", GRUB_LIB / "i386-pc", "/grub", load_cfg, core, BIOS_MODULES, env)
            efi = work / loader.efi_binary
            grub_cfg = work / "grub.cfg"
            grub_cfg.write_text(slots_config(serial=loader.serial_console))
            grubenv = work / ENV_NAME
            grubenv.write_bytes(
                environment_block({"kiln_default": INSTALL_SLOT, f"kiln_version_{INSTALL_SLOT}": assets.version})
            )
            efi_files = _efi_files(assets, load_cfg, efi, work, env)
            _fat(assets, partial, parts["EFI"], "EFI", env)
            if efi_files:
                _copy_in(partial, parts["EFI"], env, efi_files)
            _fat(assets, partial, parts["BOOT"], "BOOT", env)
            boot_files = {"grub/grub.cfg": grub_cfg, f"grub/{ENV_NAME}": grubenv}
            _copy_in(partial, parts["BOOT"], env, {**boot_files, **_slot_files(assets, work)})
            if loader.bios:
                install_bios_grub(partial, core, parts["BIOS"])
        partial.chmod(0o644)
        partial.replace(out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return out


def _efi_files(assets: BootAssets, load_cfg: Path, efi: Path, work: Path, env: dict[str, str]) -> dict[str, Path]:
    """The EFI partition's files: GRUB as the removable-media loader, or under Secure Boot the signed
    shim and GRUB (kiln.image.outputs.secureboot); nothing for a BIOS-only disk."""
    loader = assets.loader
    if assets.keys is not None:
        return secureboot.signed_loader(assets, load_cfg, EFI_MODULES, work, env)
    if not loader.uefi:
        return {}
    mkimage(loader.efi_target, loader.efi_dir, "/grub", load_cfg, efi, EFI_MODULES, env)
    return {f"EFI/BOOT/{loader.efi_binary}": efi}


def _slot_files(assets: BootAssets, work: Path) -> dict[str, Path]:
    """Slot A on BOOT: kernel, initramfs and boot.cfg, or under Secure Boot the signed UKI and a
    boot.cfg that chainloads it."""
    slot_cfg = work / "boot.cfg"
    if assets.keys is not None:
        uki = secureboot.slot_uki(assets, INSTALL_SLOT, work)
        slot_cfg.write_text(secureboot.chainload_config(f"/{INSTALL_SLOT}/{UKI_NAME}"))
        return {f"{INSTALL_SLOT}/{UKI_NAME}": uki, f"{INSTALL_SLOT}/boot.cfg": slot_cfg}
    slot_cfg.write_text(slot_boot_config(assets, INSTALL_SLOT, KERNEL_NAME, INITRD_NAME))
    return {
        f"{INSTALL_SLOT}/{KERNEL_NAME}": assets.vmlinuz,
        f"{INSTALL_SLOT}/{INITRD_NAME}": assets.initramfs,
        f"{INSTALL_SLOT}/boot.cfg": slot_cfg,
    }


def install_bios_grub(image: Path, core_img: Path, bios: Partition) -> None:
    """Put core.img in the BIOS boot partition and boot.img in the protective MBR.

    This is what grub-bios-setup does for a GPT disk with a BIOS boot partition, done here
    because grub-bios-setup insists on resolving the GRUB directory's own filesystem to a
    GRUB device in its device map, which needs some filesystem mounted. The steps:
    boot.img keeps the MBR's BPB and partition table, learns core.img's first sector and
    boots from whatever drive the BIOS passed; core.img's first sector (diskboot) learns
    where the rest of core.img lies (the sectors right after it, loaded at 0x8200). The result
    is byte for byte what `grub-bios-setup --no-rs-codes` writes (compared by hand, with the
    GRUB directory on a loop-mounted scratch filesystem); the Reed-Solomon codes it adds by
    default only help read a damaged core.img.
    """
    core = bytearray(core_img.read_bytes())
    if len(core) > bios.size:
        raise BuildError(f"GRUB's core.img ({len(core)} bytes) does not fit the BIOS boot partition")
    first = bios.start // SECTOR
    _, length, segment = struct.unpack_from("<QHH", core, BLOCKLIST)
    if length != (len(core) + SECTOR - 1) // SECTOR - 1 or segment != 0x820:
        raise BuildError("unexpected GRUB core.img: its first blocklist does not cover the image")
    struct.pack_into("<QHH", core, BLOCKLIST, first + 1, length, segment)
    boot = bytearray((GRUB_LIB / "i386-pc/boot.img").read_bytes())
    if len(boot) != SECTOR:
        raise BuildError("unexpected GRUB boot.img: not one sector")
    with image.open("r+b") as disk:
        mbr = disk.read(SECTOR)
        boot[BPB_START:BPB_END] = mbr[BPB_START:BPB_END]
        struct.pack_into("<Q", boot, KERNEL_SECTOR, first)
        boot[BOOT_DRIVE] = 0xFF
        boot[DRIVE_CHECK : DRIVE_CHECK + 2] = b"\x90\x90"
        boot[TABLE_START:TABLE_END] = mbr[TABLE_START:TABLE_END]
        disk.seek(0)
        disk.write(boot)
        disk.seek(bios.start)
        disk.write(core)


def _partition(assets: BootAssets, image: Path, parts: list[Partition], env: dict[str, str]) -> None:
    """GPT with derived disk and partition GUIDs; names are what machined looks for."""
    lines = ["label: gpt", f"label-id: {disk_guid(assets)}", "unit: sectors", ""]
    lines += [
        f"start={p.start // SECTOR}, size={p.size // SECTOR}, type={p.type}, "
        f'uuid={partition_guid(assets, p.name)}, name="{p.name}"'
        for p in parts
    ]
    _run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(image)], env, "\n".join(lines) + "\n")


def _fat(assets: BootAssets, image: Path, part: Partition, label: str, env: dict[str, str]) -> None:
    """FAT32 at the partition's offset, one sector per cluster (FAT32 needs at least 65525 clusters,
    and tools tell FAT types apart by that count); --invariant fixes the time-based fields, -i the serial."""
    _run(
        [
            "mkfs.fat",
            "--invariant",
            "-i",
            fat_serial(assets, part.name),
            "-F",
            "32",
            "-s",
            "1",
            "-n",
            label,
            "-h",
            str(part.start // SECTOR),
            f"--offset={part.start // SECTOR}",
            str(image),
            str(part.size // 1024),
        ],
        env,
    )


def _copy_in(image: Path, part: Partition, env: dict[str, str], files: dict[str, Path]) -> None:
    """Copy files into the FAT at the partition's offset; directories first, in sorted order."""
    target = f"{image}@@{part.start}"
    dirs = sorted({str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parents) - 1)})
    if dirs:
        _run(["mmd", "-i", target, *(f"::/{d}" for d in dirs)], env)
    for name in sorted(files):
        _run(["mcopy", "-i", target, str(files[name]), f"::/{name}"], env)


def _run(command: list[str], env: dict[str, str], stdin: str | None = None) -> None:
    tools.run(command, env=env, stdin=stdin)


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to
