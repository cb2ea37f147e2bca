"""Authenticode signatures on EFI binaries (UKIs, GRUB, shim), the same bytes for the same key.

Signed with osslsigncode rather than sbsign: sbsign stamps the signature with the current time
(a PKCS#7 signingTime attribute), so two builds differ; osslsigncode takes that time as an
argument (`-time`), and RSA PKCS#1 v1.5 signatures are deterministic, so the same key, input and
SOURCE_DATE_EPOCH give the same signed file. Firmware, shim and `sbverify` check them alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pefile

from kiln.core import tools
from kiln.core.errors import BuildError


def sign(unsigned: Path, signed: Path, key: Path, cert: Path, epoch: int) -> Path:
    """Write `unsigned` signed with (key, cert) to `signed`, dated `epoch`."""
    if shutil.which("osslsigncode") is None:
        raise BuildError("signing EFI binaries needs: apt install osslsigncode")
    signed.unlink(missing_ok=True)
    argv = ["osslsigncode", "sign", "-certs", str(cert), "-key", str(key), "-h", "sha256"]
    tools.run([*argv, "-time", str(epoch), "-in", str(unsigned), "-out", str(signed)], what="osslsigncode sign")
    return signed


def set_timestamp(path: Path, epoch: int) -> None:
    """Set a PE file's COFF TimeDateStamp to `epoch` and recompute its checksum.

    objcopy writes the current time there whatever SOURCE_DATE_EPOCH says (binutils 2.40), so an
    assembled UKI would differ from build to build without this.
    """
    image = pefile.PE(str(path), fast_load=True)
    try:
        image.FILE_HEADER.TimeDateStamp = epoch & 0xFFFFFFFF
        image.OPTIONAL_HEADER.CheckSum = image.generate_checksum()
        data = image.write()
    finally:
        image.close()
    path.write_bytes(bytes(data))


def sections(path: Path) -> dict[str, tuple[int, int]]:
    """{name: (virtual address, virtual size)} of a PE file's sections."""
    image = pefile.PE(str(path), fast_load=True)
    try:
        return {
            s.Name.rstrip(b"\0").decode(errors="replace"): (s.VirtualAddress, s.Misc_VirtualSize)
            for s in image.sections
        }
    finally:
        image.close()


def image_layout(path: Path) -> tuple[int, int]:
    """(ImageBase, SectionAlignment) of a PE file."""
    image = pefile.PE(str(path), fast_load=True)
    try:
        return image.OPTIONAL_HEADER.ImageBase, image.OPTIONAL_HEADER.SectionAlignment
    finally:
        image.close()
