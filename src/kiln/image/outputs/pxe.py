"""The PXE output: kernel, initramfs and an iPXE script, to serve from any TFTP or HTTP root.

The script names the kernel and initramfs by relative paths: iPXE resolves them against the
script's own URI, so the three files work wherever they are served together (tftp://host/dir/
or http://host/dir/) with no host name baked in. A DHCP server hands out `boot.ipxe` as the
boot file; iPXE recognises the `#!ipxe` line and runs it.

arm64 machines network-boot from UEFI's own PXE client, which runs an EFI program and knows no
iPXE scripts. So an arm64 directory also holds GRUB's netboot image, `bootaa64.efi` (the file a
DHCP server hands to UEFI arm64 clients, client architecture 11), and its menu `grub.cfg`:

    bootaa64.efi    GRUB (grub-mkimage -O arm64-efi from the grub-efi-arm64 package) with
                    efinet and tftp built in; its embedded config sets GRUB's prefix to the
                    directory it was loaded from, `$cmdpath` = (tftp,<server>)<boot file's dir>
    grub.cfg        read from there: boots $prefix/vmlinuz with the command line and
                    $prefix/initramfs.zst
    vmlinuz         the arm64 kernel (an Image), initramfs.zst, and boot.ipxe as on amd64

Like the iPXE script, GRUB finds everything relative to where it came from: the directory
works under any name in any TFTP root, with no server address baked in.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core.errors import BuildError
from kiln.image.assets import BootAssets
from kiln.image.outputs.grub import grub_config, mkimage

if TYPE_CHECKING:
    from kiln.image.profile import Profile

SCRIPT = "boot.ipxe"
KERNEL = "vmlinuz"
INITRD = "initramfs.zst"
GRUB_CFG = "grub.cfg"
NETBOOT = {"arm64": "bootaa64.efi"}  # the GRUB netboot image per arch whose PXE clients need one
# Built into the netboot image: UEFI's network card (efinet), TFTP, and what the menu uses.
NET_MODULES = ["efinet", "net", "tftp", "normal", "configfile", "linux", "echo", "test", "efi_gop"]
# GRUB's cmdpath is the device and directory it was loaded from; grub.cfg lies next to it.
NET_LOAD_CFG = "set prefix=$cmdpath\n"


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


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    """The pxe output: its set of files, in `dest` itself."""
    build_pxe(assets, dest)


def build_pxe(assets: BootAssets, out_dir: Path) -> list[Path]:
    """Write vmlinuz, initramfs.zst and boot.ipxe (and on arm64 bootaa64.efi and grub.cfg) into
    `out_dir`; return their paths."""
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
    if assets.loader.arch in NETBOOT:
        written += _grub_netboot(assets, out_dir)
    for path in written:
        path.chmod(0o644)
        os.utime(path, (assets.epoch, assets.epoch))
    return written


def _grub_netboot(assets: BootAssets, out_dir: Path) -> list[Path]:
    """GRUB's netboot EFI image and the grub.cfg it reads next to itself."""
    loader = assets.loader
    if shutil.which("grub-mkimage") is None:
        raise BuildError("building a PXE directory for UEFI needs: apt install grub-common")
    if not (loader.efi_dir / "efinet.mod").exists():
        raise BuildError(f"building an {loader.arch} PXE directory needs GRUB's EFI modules in {loader.efi_dir}")
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(assets.epoch), "TZ": "UTC", "LC_ALL": "C"}
    image = out_dir / NETBOOT[loader.arch]
    with tempfile.TemporaryDirectory(prefix="kiln-pxe-") as tmp:
        load_cfg = Path(tmp) / "load.cfg"
        load_cfg.write_text(NET_LOAD_CFG)
        mkimage(loader.efi_target, loader.efi_dir, "/", load_cfg, image, NET_MODULES, env)
    menu = out_dir / GRUB_CFG
    menu.write_text(grub_config(assets, f"$prefix/{KERNEL}", f"$prefix/{INITRD}"))
    return [image, menu]
