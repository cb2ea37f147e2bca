"""The hybrid ISO: one file that boots BIOS and UEFI, from a CD and written raw to a USB stick.

Layout is grub-mkrescue's (El Torito BIOS image with GRUB's boot info, GRUB's hybrid MBR,
an EFI El Torito image that GPT also exposes as the EFI system partition), but the pieces are
made here step by step because grub-mkrescue itself is not reproducible: it derives the ISO's
GRUB UUID from the wall clock (baked into both GRUB core images as `search --fs-uuid`) and
formats its efi.img with a random FAT serial. Here the UUID (the ISO's modification date, as
GRUB reads it) comes from SOURCE_DATE_EPOCH, the FAT serial from the assets' seed, and
xorriso gets every date and GUID explicitly, so the same assets give the same bytes.

arm64 machines boot UEFI only, so an arm64 ISO has just the EFI parts: the El Torito EFI image
(FAT holding EFI/BOOT/BOOTAA64.EFI, GRUB from the grub-efi-arm64 package) that the GPT also
exposes as the EFI system partition; no El Torito BIOS image and no GRUB hybrid MBR. The
loader's firmware decides which parts an ISO gets (assets.Loader).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core import tools
from kiln.image.assets import HOST_GRUB, BootAssets, derived_uuid
from kiln.image.compress import compress
from kiln.image.outputs import secureboot
from kiln.image.outputs.grub import MENU_MODULES, chainload_menu, grub_config, mkimage, require_tools
from kiln.image.outputs.uki import UKI_NAME, build_uki

if TYPE_CHECKING:
    from kiln.image.profile import Profile

GRUB_LIB = HOST_GRUB
# Modules built into the GRUB core images: nothing is loaded from the ISO but grub.cfg, so the
# ISO does not carry GRUB's module directories (about 20 MB with grub-mkrescue).
COMMON_MODULES = ["iso9660", "part_msdos", "part_gpt", *MENU_MODULES]
BIOS_MODULES = ["biosdisk", *COMMON_MODULES]
EFI_MODULES = ["fat", "efi_gop", *COMMON_MODULES]
TOOLS = {
    "grub-mkimage": "grub-common",
    "xorriso": "xorriso",
    "mkfs.fat": "dosfstools",
    "mmd": "mtools",
    "mcopy": "mtools",
}


def volume_id(version: str) -> str:
    """ISO 9660 volume id for a version: upper case, [A-Z0-9_] only, at most 32 characters."""
    return re.sub(r"[^A-Z0-9_]", "_", f"KILN_{version}".upper())[:32]


def iso_date(epoch: int) -> str:
    """xorriso's YYYYMMDDhhmmsscc form of an epoch (UTC); GRUB reads the ISO's modification
    date as its filesystem UUID (YYYY-MM-DD-hh-mm-ss-cc)."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y%m%d%H%M%S") + "00"


def grub_uuid(epoch: int) -> str:
    date = iso_date(epoch)
    return "-".join([date[0:4], *(date[i : i + 2] for i in range(4, 16, 2))])


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    """The iso output: the ISO, compressed as out_format asks."""
    iso = build_iso(assets, dest / f"{profile.artifact_stem}.iso")
    compress(iso, profile.out_format, assets.epoch, dest / profile.artifact_name)


def build_iso(assets: BootAssets, out: Path) -> Path:
    """Write the ISO for `assets` to `out` and return it: hybrid BIOS + UEFI on amd64, UEFI only on arm64."""
    loader = assets.loader
    require_tools(loader, TOOLS, "boot_hybrid.img", "an ISO")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(assets.epoch), "TZ": "UTC", "LC_ALL": "C"}
    with tempfile.TemporaryDirectory(prefix="kiln-iso-") as tmp:
        work = Path(tmp)
        load_cfg = work / "load.cfg"
        # The core images find the ISO (CD or whole USB disk) by its UUID and read grub.cfg there.
        load_cfg.write_text(
            f"search --no-floppy --set=root --fs-uuid {grub_uuid(assets.epoch)}\nset prefix=($root)/boot/grub\n"
        )
        boot_options, grafts = _boot_images(assets, load_cfg, work, env)
        payload, grub_cfg = _payload(assets, work)
        partial = out.with_name(out.name + ".partial")
        partial.unlink(missing_ok=True)
        date = iso_date(assets.epoch)
        _run(
            [
                "xorriso",
                "-as",
                "mkisofs",
                "-graft-points",
                "-V",
                volume_id(assets.version),
                "-A",
                f"KILN {assets.version}",
                f"--modification-date={date}",
                "--set_all_file_dates",
                date,
                "--gpt_disk_guid",
                str(derived_uuid(assets.seed, "iso-gpt")),
                *boot_options,
                "--protective-msdos-label",
                "-r",
                "-o",
                str(partial),
                *(f"{name}={path}" for name, path in payload.items()),
                f"/boot/grub/grub.cfg={grub_cfg}",
                *grafts,
            ],
            env,
        )
        partial.chmod(0o644)
        partial.replace(out)
    return out


def _boot_images(assets: BootAssets, load_cfg: Path, work: Path, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The boot images the loader needs (BIOS, UEFI or both), as xorriso's boot options and grafts."""
    boot_options: list[str] = []
    grafts: list[str] = []
    if assets.loader.bios:
        bios = work / "eltorito.img"
        mkimage("i386-pc-eltorito", GRUB_LIB / "i386-pc", "/boot/grub", load_cfg, bios, BIOS_MODULES, env)
        boot_options += [
            # BIOS: El Torito no-emulation GRUB image; the same core booted from the hybrid MBR on USB.
            "-b",
            "boot/grub/i386-pc/eltorito.img",
            "-no-emul-boot",
            "-boot-load-size",
            "4",
            "-boot-info-table",
            "--grub2-boot-info",
            "--grub2-mbr",
            str(GRUB_LIB / "i386-pc/boot_hybrid.img"),
        ]
        grafts.append(f"/boot/grub/i386-pc/eltorito.img={bios}")
    if assets.loader.uefi:
        efi_image = _efi_image(assets, _efi_files(assets, load_cfg, work, env), work, env)
        boot_options += [
            # UEFI: El Torito EFI image, exposed in GPT as the EFI system partition for USB.
            "--efi-boot",
            "efi.img",
            "-efi-boot-part",
            "--efi-boot-image",
        ]
        grafts.append(f"/efi.img={efi_image}")
    return boot_options, grafts


def _payload(assets: BootAssets, work: Path) -> tuple[dict[str, Path], Path]:
    """What GRUB boots (the kernel and initramfs, or under Secure Boot the signed UKI it chainloads) by its
    path in the ISO, and the grub.cfg that boots it."""
    grub_cfg = work / "grub.cfg"
    if assets.keys is not None:
        # Secure Boot: the ISO carries the signed UKI; GRUB has shim verify it and chainloads it.
        payload = {f"/boot/{UKI_NAME}": build_uki(assets, work / UKI_NAME, assets.cmdline, assets.keys)}
        grub_cfg.write_text(chainload_menu(assets, f"/boot/{UKI_NAME}"))
    else:
        payload = {"/boot/vmlinuz": assets.vmlinuz, "/boot/initramfs.zst": assets.initramfs}
        grub_cfg.write_text(grub_config(assets, "/boot/vmlinuz", "/boot/initramfs.zst"))
    return payload, grub_cfg


def _efi_files(assets: BootAssets, load_cfg: Path, work: Path, env: dict[str, str]) -> dict[str, Path]:
    """The EFI image's files: GRUB as EFI/BOOT/<BOOTX64|BOOTAA64>.EFI, or under Secure Boot the
    signed shim there and the signed GRUB beside it (kiln.image.outputs.secureboot)."""
    loader = assets.loader
    if assets.keys is not None:
        return secureboot.signed_loader(assets, load_cfg, EFI_MODULES, work, env, "/boot/grub")
    efi_binary = work / loader.efi_binary
    mkimage(loader.efi_target, loader.efi_dir, "/boot/grub", load_cfg, efi_binary, EFI_MODULES, env)
    return {f"EFI/BOOT/{loader.efi_binary}": efi_binary}


def _efi_image(assets: BootAssets, files: dict[str, Path], work: Path, env: dict[str, str]) -> Path:
    """FAT image holding `files` (EFI/BOOT/...): serial from the seed, times from SOURCE_DATE_EPOCH."""
    image = work / "efi.img"
    # Room for the files plus FAT overhead, in whole MiB (a FAT12/16 size mkfs.fat accepts).
    size_kib = ((sum(f.stat().st_size for f in files.values()) // 1024 + 512) // 1024 + 1) * 1024
    serial = derived_uuid(assets.seed, "iso-efi-fat").hex[:8]
    # --invariant first: it fixes the remaining time-based fields; -i after it sets our serial.
    _run(["mkfs.fat", "-C", "--invariant", "-i", serial, "-n", "KILN_EFI", str(image), str(size_kib)], env)
    _run(["mmd", "-i", str(image), "::/EFI", "::/EFI/BOOT"], env)
    for name, path in sorted(files.items()):
        os.utime(path, (assets.epoch, assets.epoch))
        _run(["mcopy", "-m", "-i", str(image), str(path), f"::/{name}"], env)
    return image


def _run(command: list[str], env: dict[str, str]) -> None:
    tools.run(command, env=env)
