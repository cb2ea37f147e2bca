"""What QEMU needs to know per architecture: emulator, machine, firmware, console and PXE boot file.

amd64 boots on qemu-system-x86_64 with SeaBIOS (pc) or OVMF (q35); arm64 on qemu-system-aarch64's
virt machine with AAVMF only (arm64 has no BIOS). Each entry names the Debian package to install
when its emulator or firmware is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import InputError

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
AAVMF_CODE = Path("/usr/share/AAVMF/AAVMF_CODE.fd")
AAVMF_VARS = Path("/usr/share/AAVMF/AAVMF_VARS.fd")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Platform:
    """What differs between the architectures QEMU boots: emulator, machine, firmware, console, PXE file."""

    qemu: str
    qemu_package: str  # the Debian package that installs `qemu`
    firmwares: tuple[str, ...]  # the first is the default
    code: Path  # UEFI firmware (read-only pflash) and the variable store copied for each boot
    vars: Path
    firmware_package: str
    console: str  # the kernel's serial console when no --cmdline is given
    pxe_bootfile: str  # what QEMU's DHCP offers as the boot file
    efi_binary: str  # EFI/BOOT/<this>: what UEFI boots from a disk without boot entries
    machine: tuple[str, ...] = ()  # -machine/-cpu for every boot
    uefi_machine: tuple[str, ...] = ()  # added for UEFI boots
    pflash_size: int | None = None  # the size the machine needs both pflash images to be


PLATFORMS = {
    "amd64": Platform(
        qemu="qemu-system-x86_64",
        qemu_package="qemu-system-x86",
        firmwares=("bios", "uefi"),
        code=OVMF_CODE,
        vars=OVMF_VARS,
        firmware_package="ovmf",
        console="ttyS0",
        pxe_bootfile="boot.ipxe",  # run by the iPXE in the virtio NIC's option ROM
        efi_binary="BOOTX64.EFI",
        uefi_machine=("-machine", "q35"),
    ),
    "arm64": Platform(
        qemu="qemu-system-aarch64",
        qemu_package="qemu-system-arm",
        firmwares=("uefi",),
        code=AAVMF_CODE,
        vars=AAVMF_VARS,
        firmware_package="qemu-efi-aarch64",
        console="ttyAMA0",  # the virt machine's PL011
        # AAVMF's own PXE client fetches and starts an EFI program: GRUB's arm64-efi netboot image.
        pxe_bootfile="bootaa64.efi",
        efi_binary="BOOTAA64.EFI",
        # cortex-a72 rather than max: under TCG, max's pointer authentication (QARMA) makes a
        # kernel+initramfs boot about 4x slower (measured 2.3 s vs 8.9 s to userspace with AAVMF).
        machine=("-machine", "virt", "-cpu", "cortex-a72"),
        pflash_size=64 * MIB,  # virt's two flash banks
    ),
}


def platform_for(arch: str) -> Platform:
    """The platform QEMU boots `arch` on; InputError for an arch it does not."""
    if arch not in PLATFORMS:
        raise InputError(f"arch {arch}: QEMU boots {' and '.join(PLATFORMS)} only")
    return PLATFORMS[arch]
