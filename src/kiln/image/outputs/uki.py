"""Unified kernel images: systemd's EFI stub carrying the kernel, initramfs, command line and os-release.

One PE file the firmware (or a boot loader through it) verifies as a whole, so under Secure Boot the
command line and the initramfs are as trusted as the kernel: nobody can boot the signed kernel
with `init=/bin/sh` or another initramfs. The stub is Debian's systemd-boot-efi (systemd 252);
the sections are added with objcopy at page-aligned addresses after the stub's own (ukify, which
does the same, came with systemd 253 and is not in Debian 12). Same inputs, same bytes: the PE
timestamp objcopy writes is replaced by SOURCE_DATE_EPOCH, and signing (kiln.signing.pe) is
deterministic. A signed UKI also carries its PCR 11 policy, signed with the PCR key (.pcrsig), and
that key (.pcrpkey): see kiln.signing.pcr.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core import tools
from kiln.core.errors import BuildError, InputError
from kiln.image.assets import BootAssets
from kiln.signing import pcr, pe
from kiln.signing.keyset import KeySet

if TYPE_CHECKING:
    from kiln.image.profile import Profile

STUBS = {"amd64": Path("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")}
PAGE = 0x1000
UKI_NAME = "kiln.efi"


def os_release(version: str) -> str:
    """The .osrel section: what boot menus and `bootctl` show for this image."""
    return f'NAME="Kiln"\nID=kiln\nVERSION_ID="{version}"\nPRETTY_NAME="Kiln {version}"\n'


def stub_for(arch: str) -> Path:
    """systemd's EFI stub for `arch`; amd64's comes from the host's systemd-boot-efi."""
    stub = STUBS.get(arch)
    if stub is None:
        raise InputError(f"UKIs are built for amd64 only so far: {arch} needs systemd's {arch} EFI stub")
    if not stub.exists():
        raise BuildError(f"building a UKI needs systemd's EFI stub {stub}: apt install systemd-boot-efi")
    return stub


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    """The uki output: one UKI with the profile's command line, signed when the profile has keys."""
    build_uki(assets, dest / profile.artifact_name, assets.cmdline, assets.keys, arch=profile.arch)


def build_uki(assets: BootAssets, out: Path, cmdline: str, keys: KeySet | None = None, arch: str | None = None) -> Path:
    """Write the UKI booting `assets` with `cmdline` to `out`, signed with the db key when `keys` is given.

    `arch`: the machine's (default the assets' loader's; a uki output has no boot loader)."""
    stub = stub_for(arch or assets.loader.arch)
    with tempfile.TemporaryDirectory(prefix="kiln-uki-") as tmp:
        work = Path(tmp)
        (work / "osrel").write_text(os_release(assets.version))
        (work / "cmdline").write_text(cmdline)
        sections = [(".osrel", work / "osrel"), (".cmdline", work / "cmdline")]
        if keys is not None:  # measured boot: PCR 11's value signed for the TPM (kiln.signing.pcr)
            measured = {".osrel": work / "osrel", ".cmdline": work / "cmdline", ".initrd": assets.initramfs}
            measured |= {".linux": assets.vmlinuz, ".pcrpkey": keys.require(keys.pcr_public)}
            (work / "pcrsig").write_bytes(pcr.sign_policy(measured, keys))
            sections += [(".pcrpkey", measured[".pcrpkey"]), (".pcrsig", work / "pcrsig")]
        # .linux last, as ukify places it: the kernel may use the room after it
        sections += [(".initrd", assets.initramfs), (".linux", assets.vmlinuz)]
        unsigned = work / "unsigned.efi"
        _objcopy(stub, sections, unsigned)
        pe.set_timestamp(unsigned, assets.epoch)
        out.parent.mkdir(parents=True, exist_ok=True)
        if keys is None:
            os.replace(unsigned, out)
        else:
            key, cert = keys.signing_pair("db")
            pe.sign(unsigned, out, key, cert, assets.epoch)
    out.chmod(0o644)
    return out


def _objcopy(stub: Path, sections: list[tuple[str, Path]], out: Path) -> None:
    """Add `sections` to a copy of `stub`, each at the next page after the previous one."""
    base, _ = pe.image_layout(stub)
    at = _align(max(address + size for address, size in pe.sections(stub).values()), PAGE)
    argv = ["objcopy"]
    for name, path in sections:
        argv += ["--add-section", f"{name}={path}", "--change-section-vma", f"{name}={base + at:#x}"]
        at = _align(at + path.stat().st_size, PAGE)
    tools.run([*argv, str(stub), str(out)], what="objcopy (assembling the UKI)")


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to
