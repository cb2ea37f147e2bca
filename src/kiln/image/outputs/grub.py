"""The GRUB menus: one for read-only media (ISO), one choosing an A/B slot on disks.

The disk menu reads the boot state from GRUB's environment block (`/grub/grubenv` on BOOT):
the default slot, the slot on trial (`kiln_next`) and its tries left. Each boot of a trial
slot costs one try, written back with `save_env` before the kernel starts; with none left,
GRUB boots the default slot again and records the rollback. machined makes a trial slot the
default once it reaches ready (docs/upgrades.md). Each slot carries its own `boot.cfg` (its
kernel command line), so a slot's kernel and arguments travel together.

On amd64 the menus put GRUB on the serial port and the screen; on arm64 (UEFI) GRUB's console is
the firmware's, which is already on the serial port (see Loader.serial_console), so they leave
the terminals as GRUB starts them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError
from kiln.image.assets import HOST_GRUB, BootAssets, Loader

SLOTS = ("A", "B")
MAX_TRIES = 9  # the menu counts tries down without arithmetic: one branch per value
ENV_NAME = "grubenv"
ENV_SIZE = 1024
ENV_HEADER = "# GRUB Environment Block\n"
STATE_VARS = ("kiln_default", "kiln_next", "kiln_tries", "kiln_rollback")
VERSION_VARS = ("kiln_version_A", "kiln_version_B")  # shown in the menu's titles only

# The modules every GRUB core image of Kiln's holds, in this order, besides those of its medium
# (partition tables, filesystems): find the partition, read the menu, boot Linux, talk on serial.
MENU_MODULES = ["search", "search_fs_uuid", "normal", "configfile", "linux", "serial", "terminal", "echo", "test"]

_CONSOLE = ["serial --unit=0 --speed=115200", "terminal_input console serial", "terminal_output console serial"]


def mkimage(
    target: str,
    modules: Path,
    prefix: str,
    load_cfg: Path,
    out: Path,
    built_in: list[str],
    env: dict[str, str],
    sbat: Path | None = None,
) -> None:
    """`grub-mkimage` (the host's grub-common) for `target` from the `modules` directory: `built_in`
    modules linked in, `load_cfg` embedded, `prefix` where GRUB looks for grub.cfg; `sbat`: the
    .sbat section shim checks (Secure Boot)."""
    command = ["grub-mkimage", "-O", target, "-d", str(modules), "-p", prefix, "-c", str(load_cfg), "-o", str(out)]
    if sbat is not None:
        command += ["--sbat", str(sbat)]
    tools.run([*command, *built_in], env=env)


def console(*, serial: bool) -> list[str]:
    """The menus' first lines: GRUB on the serial port and the screen, or the firmware's console as it is."""
    return list(_CONSOLE) if serial else []


def grub_config(assets: BootAssets, kernel: str, initrd: str, timeout: int = 1) -> str:
    """grub.cfg booting `kernel` with `initrd` (GRUB paths, e.g. "/boot/vmlinuz") on serial and screen.

    The caller sets GRUB's root (search by label or a fixed device) before this menu runs.
    """
    return "\n".join(
        [
            *console(serial=assets.loader.serial_console),
            "set default=0",
            f"set timeout={timeout}",
            f'menuentry "Kiln {assets.version}" {{',
            f"    linux {kernel} {assets.cmdline}",
            f"    initrd {initrd}",
            "}",
            "",
        ]
    )


def chainload_menu(assets: BootAssets, efi: str, timeout: int = 1) -> str:
    """grub.cfg starting the signed UKI `efi` (a GRUB path): Secure Boot media, where GRUB has shim
    verify it and the firmware start it, command line and initramfs included."""
    return "\n".join(
        [
            *console(serial=assets.loader.serial_console),
            "set default=0",
            f"set timeout={timeout}",
            f'menuentry "Kiln {assets.version}" {{',
            f"    chainloader {efi}",
            "}",
            "",
        ]
    )


def slot_boot_config(assets: BootAssets, slot: str, kernel: str, initrd: str) -> str:
    """`/<slot>/boot.cfg`: the slot's kernel, its command line (naming the slot) and initramfs."""
    return f"linux /{slot}/{kernel} {assets.cmdline} kiln.slot={slot}\ninitrd /{slot}/{initrd}\n"


def slots_config(timeout: int = 1, *, serial: bool = True) -> str:
    """The disk's grub.cfg: pick the slot from the environment block, count a trial's tries, boot it,
    and boot the other slot should the chosen one fail to load.

    Only the four state variables are loaded (a hostile grubenv cannot set `prefix` or `root`),
    and a slot name that is not A or B reads as A. `serial`: see console().
    """
    countdown = []
    for tries in range(MAX_TRIES, 0, -1):
        keyword = "if" if tries == MAX_TRIES else "elif"
        countdown.append(f'    {keyword} [ "$kiln_tries" = "{tries}" ]; then')
        countdown.append(f'        set kiln_tries="{tries - 1}"')
        countdown.append('        set kiln_slot="$kiln_next"')
    lines = [
        *console(serial=serial),
        f"set timeout={timeout}",
        "set default=0",
        # The other slot, when the chosen slot's kernel or initramfs will not load (damaged, gone).
        "set fallback=1",
        'set kiln_default="A"',
        'set kiln_next=""',
        'set kiln_tries=""',
        'set kiln_rollback=""',
        f"load_env {' '.join(STATE_VARS + VERSION_VARS)}",
        'if [ "$kiln_default" != "B" ]; then set kiln_default="A"; fi',
        'if [ "$kiln_next" != "A" -a "$kiln_next" != "B" ]; then set kiln_next=""; fi',
        'set kiln_slot="$kiln_default"',
        'if [ -n "$kiln_next" ]; then',
        *countdown,
        "    else",
        '        set kiln_rollback="$kiln_next"',
        '        set kiln_next=""',
        '        set kiln_tries=""',
        "    fi",
        f"    save_env {' '.join(STATE_VARS[1:])}",
        "fi",
        'if [ "$kiln_slot" = "A" ]; then',
        '    set kiln_other="B"; set kiln_this_version="$kiln_version_A"; set kiln_other_version="$kiln_version_B"',
        "else",
        '    set kiln_other="A"; set kiln_this_version="$kiln_version_B"; set kiln_other_version="$kiln_version_A"',
        "fi",
        "export kiln_slot kiln_other",
        'menuentry "Kiln $kiln_this_version, slot $kiln_slot" {',
        "    source /$kiln_slot/boot.cfg",
        "}",
        'if [ -f "/$kiln_other/boot.cfg" ]; then',
        '    menuentry "Kiln $kiln_other_version, slot $kiln_other (the other slot)" {',
        "        source /$kiln_other/boot.cfg",
        "    }",
        "fi",
        "",
    ]
    return "\n".join(lines)


def environment_block(values: dict[str, str]) -> bytes:
    """A GRUB environment block: the header, `name=value` lines, '#' padding to 1024 bytes."""
    body = ENV_HEADER + "".join(f"{name}={value}\n" for name, value in values.items())
    if len(body) > ENV_SIZE or any("\n" in v or "\\" in v for v in values.values()):
        raise ValueError(f"boot state does not fit a GRUB environment block: {values}")
    return (body + "#" * (ENV_SIZE - len(body))).encode()


def require_tools(loader: Loader, commands: dict[str, str], bios_image: str, what: str) -> None:
    """Refuse to start `what` (an ISO, a disk image) without its host tools and GRUB's images.

    `commands` maps each host command to its Debian package; `bios_image` is the file under
    i386-pc that the BIOS part needs. arm64's EFI modules come from the graph, so their absence
    is a build error, not a package to install.
    """
    missing = sorted({package for command, package in commands.items() if shutil.which(command) is None})
    if loader.bios and not (HOST_GRUB / "i386-pc" / bios_image).exists():
        missing.append("grub-pc-bin")
    if loader.uefi and not (loader.efi_dir / "normal.mod").exists():
        if loader.arch != "amd64":
            raise BuildError(f"building {what} for {loader.arch} needs GRUB's EFI modules in {loader.efi_dir}")
        missing.append("grub-efi-amd64-bin")
    if missing:
        raise BuildError(f"building {what} needs: apt install {' '.join(missing)}")
