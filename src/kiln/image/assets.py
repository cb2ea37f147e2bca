"""What every bootable output is made from, and how outputs stay byte-reproducible.

Each output module (iso, disk, formats, pxe, oci) takes a BootAssets and writes files
derived only from it: times come from `epoch` (SOURCE_DATE_EPOCH), and every UUID,
serial number or volume id comes from `derived_uuid(assets.seed, purpose)`, never from
the clock, a random source or the host.

The assets' Loader says which GRUB boots them: amd64 outputs take the host's GRUB modules
(grub-pc-bin, grub-efi-amd64-bin) and boot BIOS and UEFI; arm64 outputs boot UEFI only and take
GRUB's arm64 EFI modules from the grub-efi-arm64 package's output in the store (the host is
amd64: it has no arm64 GRUB). Every GRUB image is made by the host's grub-mkimage (grub-common).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from kiln.core.hashing import file_sha256
from kiln.signing.keyset import KeySet

HOST_GRUB = Path("/usr/lib/grub")
ARCHES = ("amd64", "arm64")
FIRMWARES = ("bios", "uefi")
# What each arch's machines boot from: arm64 machines have UEFI (or U-Boot's UEFI) and no BIOS.
ARCH_FIRMWARE = {"amd64": ("bios", "uefi"), "arm64": ("uefi",)}
# grub-mkimage's EFI target and the removable-media file name UEFI looks for, per arch.
EFI_TARGETS = {"amd64": "x86_64-efi", "arm64": "arm64-efi"}
EFI_BINARIES = {"amd64": "BOOTX64.EFI", "arm64": "BOOTAA64.EFI"}

# Namespace for Kiln's derived UUIDs (itself a uuid5 of the project's name in the URL namespace).
KILN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://kiln.invalid/uuid")


@dataclass(frozen=True)
class Loader:
    """The GRUB that boots an output: its arch, the firmware it serves and where its EFI modules are.

    The default is what amd64 outputs have always been: the host's GRUB, BIOS and UEFI. BIOS is
    amd64's alone, so its modules are always the host's (/usr/lib/grub/i386-pc).
    """

    arch: str = "amd64"
    firmware: tuple[str, ...] = ARCH_FIRMWARE["amd64"]
    efi_dir: Path = HOST_GRUB / EFI_TARGETS["amd64"]  # modules for grub-mkimage -O <efi_target>

    @classmethod
    def for_arch(cls, arch: str, firmware: tuple[str, ...], efi_dir: Path | None = None) -> Loader:
        """amd64: the host's GRUB; arm64: UEFI only, modules from `efi_dir` (grub-efi-arm64's output).

        The firmware is kept in one order (bios, uefi), so the same choice gives the same seed."""
        firmware = tuple(name for name in FIRMWARES if name in firmware)
        if arch == "amd64":
            return cls("amd64", firmware)
        if efi_dir is None or "bios" in firmware:
            raise ValueError(f"an {arch} loader needs its EFI modules' directory and boots UEFI only")
        return cls(arch, firmware, efi_dir)

    @property
    def bios(self) -> bool:
        return "bios" in self.firmware

    @property
    def uefi(self) -> bool:
        return "uefi" in self.firmware

    @property
    def efi_target(self) -> str:
        return EFI_TARGETS[self.arch]

    @property
    def efi_binary(self) -> str:
        """EFI/BOOT/<this>: the file UEFI boots from removable media (and any ESP without boot entries)."""
        return EFI_BINARIES[self.arch]

    @property
    def serial_console(self) -> bool:
        """Whether GRUB drives the serial port itself (amd64: the ns8250 COM1 `serial` knows).

        On arm64 UEFI, GRUB's `console` is the firmware's console, which the firmware already
        puts on the serial port (the PL011 on QEMU's virt, ARM servers and the clouds): GRUB's
        `serial --unit=0` knows no such port there, and its EFI serial terminal would print every
        character twice.
        """
        return self.arch == "amd64"

    def identity(self) -> str:
        """What of the loader the assets' seed includes: nothing for the default (amd64's seeds stay
        as they were), else arch and firmware (never a path: store locations differ between hosts)."""
        return "" if self == Loader() else f"{self.arch}:{','.join(self.firmware)}"


@dataclass(frozen=True)
class BootAssets:
    """A kernel, its initramfs and how to boot them."""

    vmlinuz: Path
    initramfs: Path  # zstd-compressed newc cpio: /init, /rootfs.sqsh, /extensions/*.sqsh
    cmdline: str  # kernel arguments, e.g. "console=ttyS0 kiln.platform=metal"
    version: str  # Kiln's version: volume labels and menu titles
    epoch: int  # SOURCE_DATE_EPOCH: every timestamp inside an output
    seed: str  # hex digest of everything above; UUIDs and serials derive from it
    vmlinuz_sha256: str = ""
    initramfs_sha256: str = ""
    loader: Loader = Loader()
    keys: KeySet | None = None  # sign the boot chain with these (Secure Boot outputs and UKIs)

    @classmethod
    def make(
        cls,
        vmlinuz: Path,
        initramfs: Path,
        cmdline: str,
        version: str,
        epoch: int,
        digests: tuple[str, str] | None = None,
        loader: Loader = Loader(),
        keys: KeySet | None = None,
    ) -> BootAssets:
        """Assets whose seed hashes the kernel, the initramfs, the command line, version, epoch,
        (when it is not amd64's default) the loader's arch and firmware, and the signing certificate.

        `digests` (the files' sha256s) lets callers that make many assets of the same files hash them once.
        """
        vmlinuz_sha256, initramfs_sha256 = digests or (file_sha256(vmlinuz), file_sha256(initramfs))
        digest = hashlib.sha256()
        for file_digest in (vmlinuz_sha256, initramfs_sha256):
            digest.update(file_digest.encode())
        digest.update(f"\0{cmdline}\0{version}\0{epoch}".encode())
        if loader.identity():
            digest.update(f"\0{loader.identity()}".encode())
        if keys is not None:
            digest.update(f"\0db:{file_sha256(keys.require(keys.cert('db')))}".encode())
        return cls(
            vmlinuz,
            initramfs,
            cmdline,
            version,
            epoch,
            digest.hexdigest(),
            vmlinuz_sha256,
            initramfs_sha256,
            loader,
            keys,
        )


def derived_uuid(seed: str, purpose: str) -> uuid.UUID:
    """A UUID that is the same for the same inputs and differs per purpose (disk, ESP, BOOT...)."""
    return uuid.uuid5(KILN_NAMESPACE, f"{seed}:{purpose}")
