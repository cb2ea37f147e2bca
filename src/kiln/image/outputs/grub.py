"""The GRUB menu every GRUB-booted output (ISO, disk images) shares."""

from __future__ import annotations

from kiln.image.assets import BootAssets


def grub_config(assets: BootAssets, kernel: str, initrd: str, timeout: int = 1) -> str:
    """grub.cfg booting `kernel` with `initrd` (GRUB paths, e.g. "/boot/vmlinuz") on serial and screen.

    The caller sets GRUB's root (search by label or a fixed device) before this menu runs.
    """
    return "\n".join(
        [
            "serial --unit=0 --speed=115200",
            "terminal_input console serial",
            "terminal_output console serial",
            "set default=0",
            f"set timeout={timeout}",
            f'menuentry "Kiln {assets.version}" {{',
            f"    linux {kernel} {assets.cmdline}",
            f"    initrd {initrd}",
            "}",
            "",
        ]
    )
