"""The signed boot chain of Secure Boot outputs: shim, then GRUB, then a signed UKI per slot.

The firmware verifies shim against the db key the user enrolled; shim verifies GRUB against the
same db, and GRUB, which under Secure Boot loads nothing but through shim, has shim verify the
slot's UKI before chainloading it. Every link is signed with the user's db key (kiln.signing.pe),
and the UKI holds the kernel, the initramfs and the command line, so nothing unsigned runs.

Why shim and GRUB rather than a UKI alone: the A/B slots, tries and fallback live in GRUB's menu
and environment block (docs/upgrades.md), and GRUB under Secure Boot (Debian's 2.06) refuses to
start anything unless shim's protocol verifies it. shim is Debian's shim-unsigned, signed here
with the user's key; the certificate it trusts besides db goes into dbx (kiln.signing.shim).
shim checks GRUB's SBAT generation against the revocations it carries, so
GRUB's .sbat section says what Debian's signed build of the same GRUB says.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kiln.core.errors import BuildError
from kiln.image.assets import BootAssets
from kiln.image.outputs.grub import mkimage
from kiln.image.outputs.uki import UKI_NAME, build_uki
from kiln.signing import pe
from kiln.signing.keyset import KeySet
from kiln.signing.shim import MOK_MANAGER, SHIM

GRUB_EFI_NAME = "grubx64.efi"  # the second stage shim starts from its own directory
GRUB_PACKAGE = "grub-efi-amd64-bin"
# Debian's signed GRUB 2.06-13+deb12u2 declares generation 5 for grub and grub.debian (shim 16.1
# refuses grub below 5); the GRUB built here is made of the same package's modules.
SBAT_GENERATION = 5
SECUREBOOT_MODULES = ["chain"]  # chainloader: GRUB starts the slot's UKI through shim and the firmware


def sbat_csv(grub_version: str) -> str:
    """GRUB's .sbat section, naming the Debian package version the modules come from."""
    return (
        "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n"
        f"grub,{SBAT_GENERATION},Free Software Foundation,grub,2.06,https://www.gnu.org/software/grub/\n"
        f"grub.debian,{SBAT_GENERATION},Debian,grub2,{grub_version},https://tracker.debian.org/pkg/grub2\n"
    )


def host_grub_version() -> str:
    """The installed grub-efi-amd64-bin's version (the modules grub-mkimage links)."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", GRUB_PACKAGE], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout:
        raise BuildError(f"Secure Boot outputs need {GRUB_PACKAGE}: apt install {GRUB_PACKAGE}")
    return result.stdout.strip()


def require(assets: BootAssets) -> KeySet:
    """The assets' keys, after checking the chain can be built (amd64 UEFI, shim installed)."""
    keys = assets.keys
    if keys is None or assets.loader.arch != "amd64" or assets.loader.bios:
        raise BuildError("a Secure Boot output needs keys, amd64 and UEFI only")
    for part in (SHIM, MOK_MANAGER):
        if not part.exists():
            raise BuildError(f"Secure Boot outputs need shim ({part}): apt install shim-unsigned")
    return keys


def signed_loader(
    assets: BootAssets, load_cfg: Path, modules: list[str], work: Path, env: dict[str, str], prefix: str = "/grub"
) -> dict[str, Path]:
    """{ESP path: file}: shim as the removable-media loader, GRUB and MokManager beside it, all signed.

    `load_cfg` is GRUB's embedded first config (find the boot filesystem, set the prefix).
    """
    keys = require(assets)
    key, cert = keys.signing_pair("db")
    sbat = work / "sbat.csv"
    sbat.write_text(sbat_csv(host_grub_version()))
    grub = work / "grub-unsigned.efi"
    mkimage(
        assets.loader.efi_target,
        assets.loader.efi_dir,
        prefix,
        load_cfg,
        grub,
        [*modules, *SECUREBOOT_MODULES],
        env,
        sbat,
    )
    return {
        f"EFI/BOOT/{assets.loader.efi_binary}": pe.sign(SHIM, work / "shim.efi", key, cert, assets.epoch),
        f"EFI/BOOT/{GRUB_EFI_NAME}": pe.sign(grub, work / GRUB_EFI_NAME, key, cert, assets.epoch),
        f"EFI/BOOT/{MOK_MANAGER.name}": pe.sign(MOK_MANAGER, work / MOK_MANAGER.name, key, cert, assets.epoch),
    }


def chainload_config(path: str) -> str:
    """A slot's (or the ISO's) boot.cfg under Secure Boot: start the signed UKI; GRUB has shim verify it."""
    return f"chainloader {path}\n"


def slot_uki(assets: BootAssets, slot: str, work: Path) -> Path:
    """The slot's signed UKI; its command line names the slot, as boot.cfg's does without Secure Boot."""
    return build_uki(assets, work / f"{slot}-{UKI_NAME}", f"{assets.cmdline} kiln.slot={slot}", require(assets))
