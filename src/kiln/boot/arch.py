"""Which architecture an artifact boots on, read from what it holds, never from its name alone.

`kiln boot` must choose qemu-system-x86_64 or qemu-system-aarch64 before QEMU starts, and a wrong
choice shows only as a silent console until the timeout. So the answer comes, cheapest first, from:

1. the manifest.json Kiln writes beside its outputs, when it lists the artifact: the artifact's
   `arch` (outputs built for several platforms), else `profile.arch`;
2. the artifact's own bytes: a kernel's boot header (arm64 `Image` magic, x86 `HdrS`, or a PE
   header's machine field for EFI zboot kernels and EFI loaders); the removable-media loader
   (EFI/BOOT/BOOTAA64.EFI or BOOTX64.EFI) in an ISO's tree, its El Torito EFI image, or a raw
   disk's EFI system partition, read with xorriso, sfdisk and mtools (no mounts, no nbd).

qcow2, vhd and vmdk are not opened (that would need qemu-nbd and kernel modules, or a full
conversion): for them the manifest is the only source. When nothing decides, amd64 is the
default, unless the artifact's name suggests arm64: then the caller must say --arch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError, display_path

ARCHES = ("amd64", "arm64")
MANIFEST = "manifest.json"  # kiln.image.manifest.MANIFEST (boot sits below image and cannot import it)
ESP_TYPES = {"C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "EF"}  # GPT and MBR type of an EFI system partition
BIOS_BOOT_TYPE = "21686148-6449-6E6F-744E-656564454649"  # GRUB's BIOS boot partition: x86 only
EFI_LOADERS = {"BOOTAA64.EFI": "arm64", "BOOTX64.EFI": "amd64"}
PE_MACHINES = {0xAA64: "arm64", 0x8664: "amd64"}
HEAD = 64 * 1024  # bytes read from a kernel: its headers lie in the first 4 KiB, gzip needs some slack
TOOL_TIMEOUT = 30
# xorriso's listing of the ISO tree's EFI programs, down to /EFI/BOOT/<file> (names in any case)
_EFI_FIND = ["-find", "/", "-maxdepth", "3", "-type", "f", "-name", "*.[Ee][Ff][Ii]"]
_ARM_NAME = re.compile(r"arm64|aarch64", re.IGNORECASE)


@dataclass(frozen=True)
class Arch:
    """An architecture and why it was picked (shown to the user in one line)."""

    name: str
    why: str


def choose_arch(artifact: Path, override: str | None = None) -> Arch:
    """The architecture to boot `artifact` as: `override` (--arch), else detection, else amd64.

    amd64 is only a default when nothing hints at arm64: an unreadable artifact named like an arm64
    one raises InputError asking for --arch, since booting it as amd64 would just time out.
    """
    if override is not None:
        if override not in ARCHES:
            raise InputError(f"--arch {override}: expected one of {', '.join(ARCHES)}")
        return Arch(override, "given by --arch")
    found = detect(artifact)
    if found is not None:
        return found
    shown = display_path(artifact)
    if _ARM_NAME.search(f"{artifact.parent.name}/{artifact.name}"):
        raise InputError(
            f"cannot tell which architecture {shown} is for from its contents, and its name suggests arm64: "
            "give --arch arm64 or --arch amd64"
        )
    return Arch("amd64", f"nothing in {shown} names an architecture: amd64 by default")


def detect(artifact: Path) -> Arch | None:
    """The architecture Kiln's manifest or the artifact's contents show, or None when neither does."""
    return manifest_arch(artifact) or content_arch(artifact)


def manifest_arch(artifact: Path) -> Arch | None:
    """The arch the manifest.json in (a directory) or above (a file, or a directory in a profile's
    output) the artifact gives it: the artifact's own `arch` (a profile built for several platforms
    lists each artifact with one), else `profile.arch`.

    A file must be listed among the manifest's artifacts, so a manifest for something else (a
    store entry, another profile's copy) does not decide; it is looked up beside the file, then
    one level up (pxe-arm64/vmlinuz in a multi-platform output). A directory with its own manifest
    needs no listing, unless that manifest covers several arches: then the directory is not one
    artifact and InputError names the ones inside. A directory listed in the manifest above it
    (pxe-arm64/) takes the arch its files share.
    """
    if artifact.is_dir():
        own = artifact / MANIFEST
        data = _read_json(own)
        arch = _profile_arch(data)
        if arch is not None:
            return Arch(arch, f"{display_path(own)} says arch {arch}")
        _refuse_several(artifact, data)
        parent = artifact.parent / MANIFEST
        above = _read_json(parent)
        arches = {_artifact_arch(a, above) for a in _listed(above) if _under(a, artifact.name)}
        if len(arches) == 1 and (arch := arches.pop()) is not None:
            return Arch(arch, f"{display_path(parent)} lists {artifact.name}/ for arch {arch}")
        return None
    for directory in (artifact.parent, artifact.parent.parent):
        rel = artifact.relative_to(directory).as_posix()
        manifest = directory / MANIFEST
        data = _read_json(manifest)
        for entry in _listed(data):
            if entry.get("path") == rel and (arch := _artifact_arch(entry, data)) is not None:
                return Arch(arch, f"{display_path(manifest)} says arch {arch}")
    return None


def _listed(data: dict[str, Any]) -> list[dict[str, Any]]:
    listed = data.get("artifacts")
    return [a for a in listed if isinstance(a, dict)] if isinstance(listed, list) else []


def _profile_arch(data: dict[str, Any]) -> str | None:
    profile = data.get("profile")
    arch = profile.get("arch") if isinstance(profile, dict) else None
    return arch if arch in ARCHES else None


def _artifact_arch(entry: dict[str, Any], data: dict[str, Any]) -> str | None:
    """An artifact's own arch, else its manifest's profile.arch (the single-platform shape)."""
    arch = entry.get("arch")
    return arch if arch in ARCHES else _profile_arch(data)


def _under(entry: dict[str, Any], name: str) -> bool:
    return isinstance(entry.get("path"), str) and entry["path"].startswith(f"{name}/")


def _refuse_several(directory: Path, data: dict[str, Any]) -> None:
    """A profile's output built for several platforms cannot be booted as one: say which parts can."""
    arches = sorted({str(a["arch"]) for a in _listed(data) if a.get("arch") in ARCHES})
    if len(arches) < 2:
        return
    tops = sorted({str(a["path"]).split("/")[0] for a in _listed(data) if a.get("arch") in ARCHES})
    shown = display_path(directory)
    raise InputError(
        f"{shown} holds outputs for {' and '.join(arches)} (kiln image --platform with several platforms): "
        f"boot one of them: {', '.join(f'{shown}/{t}' for t in tops)}"
    )


def content_arch(artifact: Path) -> Arch | None:
    """What the artifact's own bytes say: a directory's kernel or EFI loader, an ISO's or a raw disk's ESP."""
    if artifact.is_dir():
        return directory_arch(artifact)
    if not artifact.is_file():
        return None
    suffix = artifact.suffix.lower()
    if suffix == ".iso":
        return iso_arch(artifact)
    if suffix in (".raw", ".img"):
        return disk_arch(artifact)
    return None


def directory_arch(directory: Path) -> Arch | None:
    """A kernel+initramfs or PXE directory: its vmlinuz, else the EFI loader a PXE directory serves."""
    for name in ("vmlinuz", "bootaa64.efi", "bootx64.efi"):
        path = directory / name
        arch = kernel_arch(path) if path.is_file() else None
        if arch is not None:
            return Arch(arch, f"{display_path(path)} is an {arch} {'kernel' if name == 'vmlinuz' else 'EFI program'}")
    return None


def kernel_arch(path: Path) -> str | None:
    """A Linux kernel's (or any EFI program's) architecture from its header, or None.

    arm64 `Image`: b"ARM\\x64" at offset 56. x86 bzImage: b"HdrS" at 0x202. Both also carry a PE
    header when built with the EFI stub, so those checks come first; the PE machine field then
    decides for zboot kernels and EFI loaders. A gzip'd Image (QEMU accepts one) is inflated first.
    """
    try:
        with path.open("rb") as stream:
            head = stream.read(HEAD)
    except OSError:
        return None
    if head[:2] == b"\x1f\x8b":
        head = _gunzip_head(head)
    if head[56:60] == b"ARM\x64":
        return "arm64"
    if head[0x202:0x206] == b"HdrS":
        return "amd64"
    return pe_arch(head)


def pe_arch(head: bytes) -> str | None:
    """The architecture in a PE image's COFF header (the machine field after b"PE\\0\\0"), or None."""
    if head[:2] != b"MZ" or len(head) < 0x40:
        return None
    offset = int.from_bytes(head[0x3C:0x40], "little")
    if head[offset : offset + 4] != b"PE\0\0":
        return None
    return PE_MACHINES.get(int.from_bytes(head[offset + 4 : offset + 6], "little"))


def iso_arch(iso: Path) -> Arch | None:
    """An ISO's EFI loader: in its file tree (Debian-style ISOs), else in its El Torito EFI image (Kiln's
    and grub-mkrescue's); an ISO whose only El Torito image is a BIOS one is x86."""
    listing = _tool(["xorriso", "-indev", str(iso.resolve()), "-report_el_torito", "plain", *_EFI_FIND])
    if listing is None:
        return None
    shown = display_path(iso)
    loaders = _loaders(re.findall(r"^'(.*)'$", listing, re.MULTILINE))
    if loaders:
        return _from_loaders(loaders, f"{shown} holds")
    images = re.findall(r"^El Torito boot img\s*:\s*\d+\s+(\S+)\s.*\s(\d+)\s*$", listing, re.MULTILINE)
    for platform, lba in images:
        if platform == "UEFI":
            loaders = fat_loaders(iso, int(lba) * 2048)
            if loaders:
                return _from_loaders(loaders, f"{shown}'s El Torito EFI image holds")
    if images and all(platform == "BIOS" for platform, _ in images):
        return Arch("amd64", f"{shown} boots only through El Torito BIOS (x86)")
    return disk_arch(iso)  # a hybrid ISO whose EFI image only its partition table shows


def disk_arch(disk: Path) -> Arch | None:
    """A raw disk's EFI system partition's loader (sfdisk finds it, mtools reads it in place); a
    disk with a BIOS boot partition and no EFI loader is x86."""
    table = _partition_table(disk)
    if table is None:
        return None
    sector = int(table.get("sectorsize", 512))
    partitions = [p for p in table.get("partitions", []) if isinstance(p, dict)]
    shown = display_path(disk)
    for part in partitions:
        if str(part.get("type", "")).upper() in ESP_TYPES:
            loaders = fat_loaders(disk, int(part.get("start", 0)) * sector)
            if loaders:
                return _from_loaders(loaders, f"{shown}'s EFI system partition holds")
    if any(str(p.get("type", "")).upper() == BIOS_BOOT_TYPE for p in partitions):
        return Arch("amd64", f"{shown} has a BIOS boot partition (x86) and no EFI loader")
    return None


def fat_loaders(image: Path, offset: int) -> dict[str, str]:
    """The removable-media loaders in EFI/BOOT of the FAT filesystem at `offset` in `image`: name -> arch."""
    listing = _tool(["mdir", "-b", "-i", f"{image}@@{offset}", "::/EFI/BOOT"], {"MTOOLS_SKIP_CHECK": "1"})
    return _loaders(listing.splitlines()) if listing else {}


def _loaders(paths: list[str]) -> dict[str, str]:
    found = {}
    for path in paths:
        name = path.rstrip().rsplit("/", 1)[-1].upper()
        if name in EFI_LOADERS:
            found[name] = EFI_LOADERS[name]
    return found


def _from_loaders(loaders: dict[str, str], where: str) -> Arch:
    """One arch from the loaders found; with both, amd64 (QEMU's x86 firmware picks BOOTX64.EFI)."""
    names = ", ".join(sorted(loaders))
    arch = "amd64" if "amd64" in loaders.values() else "arm64"
    return Arch(arch, f"{where} {names}")


def _partition_table(disk: Path) -> dict[str, Any] | None:
    text = _tool(["sfdisk", "--json", str(disk)])
    try:
        table = json.loads(text)["partitiontable"] if text else None
    except (ValueError, KeyError, TypeError):
        return None
    return table if isinstance(table, dict) else None


def _tool(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    """A probing tool's stdout, or None when it is missing, fails or hangs: detection then falls back."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=TOOL_TIMEOUT,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _gunzip_head(data: bytes) -> bytes:
    """The first bytes of a gzip stream's content (enough for a kernel's headers), or b"" if corrupt."""
    try:
        return zlib.decompressobj(wbits=31).decompress(data, 4096)
    except zlib.error:
        return b""
