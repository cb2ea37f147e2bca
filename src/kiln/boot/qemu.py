"""Booting an artifact in QEMU and waiting for a line on the serial console.

Used by `kiln boot` and the end-to-end tests. amd64 artifacts boot on qemu-system-x86_64, arm64 ones
on qemu-system-aarch64's virt machine with AAVMF (kiln.boot.platforms; kiln.boot.arch tells which an
artifact is). The console is streamed as it comes (to the terminal and a log file); the run ends
when the expected line appears, on a kernel panic, or at the timeout, with the last console lines
to show why.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack

from kiln.boot.arch import choose_arch
from kiln.boot.console import BootResult as BootResult
from kiln.boot.console import WatchOptions
from kiln.boot.console import watch as watch
from kiln.boot.platforms import MIB, Platform, platform_for
from kiln.boot.platforms import OVMF_CODE as OVMF_CODE  # kept importable from here
from kiln.boot.platforms import OVMF_VARS as OVMF_VARS
from kiln.boot.secureboot import SECURE_CODE, SECURE_MACHINE, enrolled_vars, esp_image
from kiln.core.errors import BuildError, InputError
from kiln.signing.pcr import software_tpm

READY = "machined ready:"
DISK_FORMATS = {".raw": "raw", ".img": "raw", ".qcow2": "qcow2", ".vhd": "vpc", ".vmdk": "vmdk"}


@dataclass
class Machine:
    """What to boot and how; `command()` turns it into a QEMU command line.

    `arch` picks the emulator (amd64: qemu-system-x86_64; arm64: qemu-system-aarch64, virt machine,
    UEFI only). An empty `firmware` or `pxe_bootfile` means the arch's default (PLATFORMS).
    """

    kernel: Path | None = None
    initrd: Path | None = None
    cdrom: Path | None = None
    disk: Path | None = None
    # A directory served by QEMU's TFTP; its `pxe_bootfile` is what the NIC's firmware boots: for amd64
    # boot.ipxe (an iPXE script); for arm64 bootaa64.efi (a GRUB EFI netboot image, which reads its
    # grub.cfg and the kernel and initramfs over the same TFTP).
    pxe: Path | None = None
    disk_format: str = "raw"
    cmdline: str = ""
    firmware: str = ""  # bios or uefi; empty: the arch's default (bios on amd64, uefi on arm64)
    memory: str = "1024"
    accel: str = "tcg"
    blank_disk: Path | None = None
    api_port: int | None = None
    net_options: str = ""  # appended to QEMU's user network, e.g. net=, guestfwd= for a fake metadata service
    network: bool = True  # False: no NIC at all (a machine with its cable out)
    extra: list[str] = field(default_factory=list)
    arch: str = "amd64"
    pxe_bootfile: str = ""
    secure_boot_keys: Path | None = None  # a key directory: OVMF's Secure Boot build with its keys enrolled
    efi: Path | None = None  # a lone EFI program (a UKI) to boot from a FAT disk made for it
    efi_disk: Path | None = None  # that disk, made by boot()
    tpm: bool = False  # a TPM 2.0 (swtpm, fresh per boot): systemd-stub measures a UKI into its PCR 11
    tpm_socket: Path | None = None  # swtpm's control socket, set by boot()

    def platform(self) -> Platform:
        return platform_for(self.arch)

    def boot_firmware(self) -> str:
        """bios or uefi: the one asked for, checked against what the arch boots, or the arch's default."""
        platform = self.platform()
        firmware = self.firmware or ("uefi" if self.secure_boot_keys or self.efi else platform.firmwares[0])
        if (self.secure_boot_keys or self.efi) and firmware != "uefi":
            raise InputError(f"--firmware {firmware}: Secure Boot and EFI programs boot with UEFI only")
        if self.secure_boot_keys and self.arch != "amd64":
            raise InputError(f"--secure-boot: {self.arch} has no Secure Boot firmware build here (amd64's OVMF has)")
        if firmware not in platform.firmwares:
            only = " or ".join(f.upper() for f in platform.firmwares)
            raise InputError(
                f"--firmware {firmware}: {self.arch} boots with {only} only ({platform.code.name}): drop --firmware"
            )
        return firmware

    def command(self, vars_copy: Path | None = None) -> list[str]:
        platform = self.platform()
        qemu = shutil.which(platform.qemu)
        if qemu is None:
            raise BuildError(f"{platform.qemu} is not installed: apt install {platform.qemu_package}")
        args = [
            qemu,
            "-accel",
            self.accel,
            "-m",
            self.memory,
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-nodefaults",
        ]
        args += self._machine_args(platform, vars_copy)
        if self.kernel:
            args += ["-kernel", str(self.kernel)]
            if self.initrd:
                args += ["-initrd", str(self.initrd)]
            args += ["-append", self.cmdline or f"console={platform.console}"]
        args += self._drive_args()
        args += self._net_args(platform)
        if self.tpm:
            if self.tpm_socket is None:
                raise BuildError("a TPM needs its swtpm started first (boot() does)")
            device = "tpm-tis" if self.arch == "amd64" else "tpm-tis-device"
            args += ["-chardev", f"socket,id=chrtpm,path={self.tpm_socket}"]
            args += ["-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", f"{device},tpmdev=tpm0"]
        return args + self.extra

    def _machine_args(self, platform: Platform, vars_copy: Path | None) -> list[str]:
        """The machine type and, for UEFI, the firmware (read-only code, the writable copy of its variables)."""
        args = list(platform.machine)
        if self.boot_firmware() == "uefi":
            if vars_copy is None:
                raise BuildError(f"UEFI boots need a writable copy of {platform.vars.name}")
            code = SECURE_CODE if self.secure_boot_keys else platform.code
            args += [
                *(SECURE_MACHINE if self.secure_boot_keys else platform.uefi_machine),
                "-drive",
                f"if=pflash,format=raw,unit=0,readonly=on,file={code}",
                "-drive",
                f"if=pflash,format=raw,unit=1,file={vars_copy}",
            ]
        return args

    def _drive_args(self) -> list[str]:
        """The CD and disks: IDE CD and virtio disks on amd64; the arm64 virt machine has no IDE, so its CD
        is a SCSI CD on virtio-scsi and the booted disk a virtio-blk device that can carry a boot index."""
        args = []
        if self.cdrom and self.arch == "arm64":
            args += _on_bus(
                f"file={self.cdrom},format=raw,media=cdrom,readonly=on,if=none,id=cd0",
                "virtio-scsi-pci,id=scsi0",
                "scsi-cd,drive=cd0,bus=scsi0.0,bootindex=0",
            )
        elif self.cdrom:
            args += ["-drive", f"file={self.cdrom},media=cdrom,readonly=on,if=ide,index=1"]
        if self.disk and self.arch == "arm64":
            args += _on_bus(
                f"file={self.disk},format={self.disk_format},if=none,id=disk0,snapshot=on",
                "virtio-blk-pci,drive=disk0,bootindex=1",
            )
        elif self.disk:
            args += ["-drive", f"file={self.disk},format={self.disk_format},if=virtio,snapshot=on"]
        if self.efi_disk:
            args += ["-drive", f"file={self.efi_disk},format=raw,if=virtio,snapshot=on"]
        if self.blank_disk:
            args += ["-drive", f"file={self.blank_disk},format=qcow2,if=virtio"]
        return args

    def _net_args(self, platform: Platform) -> list[str]:
        """QEMU's user network (API forward, extra options, TFTP for PXE) on a virtio NIC, and an RNG."""
        if not self.network:
            return ["-nic", "none", "-device", "virtio-rng-pci"]
        net = "user,id=net0"
        if self.api_port:
            net += f",hostfwd=tcp:127.0.0.1:{self.api_port}-:50000"
        if self.net_options:
            net += f",{self.net_options}"
        nic = "virtio-net-pci,netdev=net0"
        if self.arch == "arm64":
            nic += ",romfile="  # the NIC ROM is x86 iPXE; AAVMF drives the NIC itself
        if self.pxe:
            # QEMU's DHCP offers the boot file; the firmware's PXE client fetches it by TFTP and runs it.
            net += f",tftp={self.pxe},bootfile={self.pxe_bootfile or platform.pxe_bootfile}"
            nic += ",bootindex=0"
        return ["-netdev", net, "-device", nic, "-device", "virtio-rng-pci"]


def _on_bus(drive: str, *devices: str) -> list[str]:
    """A drive with no interface of its own (`if=none`) and the devices that put it on a bus."""
    return ["-drive", drive, *(arg for device in devices for arg in ("-device", device))]


def machine_for(artifact: Path, arch: str | None = None) -> Machine:
    """Pick how to boot an artifact from what it is; `arch` None: detect it (kiln.boot.arch.choose_arch)."""
    if arch is None:
        arch = choose_arch(artifact).name
    platform = platform_for(arch)
    if artifact.is_dir():
        return _directory_machine(artifact, arch, platform)
    if not artifact.is_file():
        raise InputError(f"no such artifact: {artifact}")
    if artifact.suffix == ".iso":
        return Machine(cdrom=artifact, arch=arch)
    if artifact.suffix.lower() == ".efi":
        return Machine(efi=artifact, arch=arch)
    if artifact.suffix in DISK_FORMATS:
        return Machine(disk=artifact, disk_format=DISK_FORMATS[artifact.suffix], arch=arch)
    raise InputError(f"do not know how to boot {artifact.name}: expected a directory, .iso or a disk image")


def _directory_machine(artifact: Path, arch: str, platform: Platform) -> Machine:
    """A PXE directory (the arch's boot file) or a kernel+initramfs one."""
    if (artifact / platform.pxe_bootfile).is_file():
        return Machine(pxe=artifact.resolve(), arch=arch, pxe_bootfile=platform.pxe_bootfile)
    if arch == "arm64" and (artifact / "boot.ipxe").is_file():
        raise InputError(
            f"{artifact} is an iPXE directory (boot.ipxe), which arm64 firmware cannot run: arm64 PXE boots "
            "bootaa64.efi, a GRUB EFI netboot image that reads grub.cfg, vmlinuz and initramfs by TFTP"
        )
    kernel = artifact / "vmlinuz"
    initrds = [artifact / n for n in ("initramfs.zst", "initramfs", "initramfs.xz") if (artifact / n).exists()]
    if kernel.is_file() and initrds:
        return Machine(kernel=kernel, initrd=initrds[0], arch=arch)
    raise InputError(f"{artifact} holds no vmlinuz and initramfs.zst to boot")


def boot(
    machine: Machine,
    expect: str,
    timeout: float,
    log: Path,
    echo: Callable[[str], None] | None = None,
    **options: Unpack[WatchOptions],
) -> BootResult:
    """Run QEMU until `expect` shows on the console, a panic, QEMU's exit, or the timeout.

    With `until_exit`, a found line is not the end: the guest must also stop QEMU (power off)
    before the timeout (or `exit_timeout`, see console.watch), and the result carries QEMU's exit code.
    The keyword `options` (until_exit, on_found, exit_timeout) are console.watch's, handed on as they are.
    """
    with tempfile.TemporaryDirectory(prefix="kiln-boot-") as tmp, ExitStack() as stack:
        if machine.tpm:
            machine.tpm_socket = Path(f"{stack.enter_context(software_tpm(Path(tmp) / 'tpm'))}.ctrl")
        command = machine.command(_prepare(machine, Path(tmp)))
        return watch(command, expect, timeout, log, echo, **options)


def _prepare(machine: Machine, tmp: Path) -> Path | None:
    """Check that what the machine boots from exists; returns a writable copy of the UEFI variables, if UEFI."""
    vars_copy = None
    if machine.boot_firmware() == "uefi":
        platform = machine.platform()
        if not platform.code.exists() or not platform.vars.exists():
            raise BuildError(
                f"UEFI firmware for {machine.arch} is not installed: apt install {platform.firmware_package}"
            )
        vars_copy = tmp / platform.vars.name
        if machine.secure_boot_keys:
            enrolled_vars(machine.secure_boot_keys, platform.vars, vars_copy)
        else:
            shutil.copyfile(platform.vars, vars_copy)
        if platform.pflash_size is not None:
            _fit_pflash(platform.code, vars_copy, platform.pflash_size)
    if machine.efi:
        machine.efi_disk = esp_image(machine.efi, machine.platform().efi_binary, tmp / "esp.img")
    if machine.blank_disk and not machine.blank_disk.exists():
        raise BuildError(f"blank disk {machine.blank_disk} does not exist")
    return vars_copy


def _fit_pflash(code: Path, vars_copy: Path, size: int) -> None:
    """QEMU's virt machine takes pflash images of exactly its bank size: pad the variables copy up to it
    (Debian's AAVMF files already have it) and say plainly when the firmware itself does not fit."""
    if code.stat().st_size != size:
        raise BuildError(f"{code} is {code.stat().st_size} bytes; QEMU's virt machine needs {size // MIB} MiB pflash")
    if vars_copy.stat().st_size < size:
        os.truncate(vars_copy, size)
