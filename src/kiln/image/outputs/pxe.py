"""The PXE output: kernel, initramfs and an iPXE script, to serve from any TFTP or HTTP root.

The script names the kernel and initramfs by relative paths: iPXE resolves them against the
script's own URI, so the three files work wherever they are served together (tftp://host/dir/
or http://host/dir/) with no host name baked in. A DHCP server hands out `boot.ipxe` as the
boot file; iPXE recognises the `#!ipxe` line and runs it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kiln.image.assets import BootAssets

SCRIPT = "boot.ipxe"
KERNEL = "vmlinuz"
INITRD = "initramfs.zst"


def ipxe_script(assets: BootAssets) -> str:
    """The iPXE script: load kernel (with the assets' command line) and initramfs, then boot."""
    return "\n".join(
        [
            "#!ipxe",
            f"echo Kiln {assets.version}: loading {KERNEL} and {INITRD}",
            # initrd= names the image for EFI-stub kernels (iPXE's EFI build hands it over by name).
            f"kernel {KERNEL} initrd={INITRD} {assets.cmdline}",
            f"initrd {INITRD}",
            "boot",
            "",
        ]
    )


def build_pxe(assets: BootAssets, out_dir: Path) -> list[Path]:
    """Write vmlinuz, initramfs.zst and boot.ipxe into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for source, name in ((assets.vmlinuz, KERNEL), (assets.initramfs, INITRD)):
        dest = out_dir / name
        if dest.resolve() != source.resolve():
            shutil.copyfile(source, dest)
        written.append(dest)
    script = out_dir / SCRIPT
    script.write_text(ipxe_script(assets))
    written.append(script)
    for path in written:
        path.chmod(0o644)
        os.utime(path, (assets.epoch, assets.epoch))
    return written
