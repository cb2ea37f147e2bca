"""The rules of a profile that its JSON Schema cannot say: options that only fit some output kinds,
what an arch cannot boot, what Secure Boot needs. Each problem is (path in the file, message), so
kiln.image.profile reports them all at once at their lines.
"""

from __future__ import annotations

from typing import Any

from kiln.core.errors import InputError
from kiln.core.sizes import parse_size
from kiln.core.yamlfile import Path_
from kiln.image.assets import ARCH_FIRMWARE
from kiln.image.outputs.kinds import kinds_where

DEFAULT_ARCH = "amd64"
# Outputs a boot loader boots (outputs.kinds).
BOOTED_KINDS = kinds_where(boot="loader")


def arch_rules(arch: str, kind: str, firmware: list[str] | None, disk_format: str, why: str) -> list[tuple[Path_, str]]:
    """What `arch` cannot boot: (path, message) per problem. `why` says where the arch came from."""
    found: list[tuple[Path_, str]] = []
    bootable = ARCH_FIRMWARE[arch]
    for index, name in enumerate(firmware or []):
        if name not in bootable:
            found.append(
                (
                    ("output", "firmware", index),
                    f"firmware {name} cannot be built for {arch}{why}: {arch} machines boot "
                    f"{' and '.join(f.upper() for f in bootable)} only; write firmware: [{', '.join(bootable)}] "
                    "or leave firmware out",
                )
            )
    if arch == "arm64" and kind == "uki":
        found.append(
            (("output", "kind"), f"kind uki cannot be built for {arch}{why} yet: it needs systemd's arm64 EFI stub")
        )
    if arch == "arm64" and kind in ("image", "installer") and disk_format == "ova":
        found.append(
            (
                ("output", "image", "format"),
                f"format ova cannot be built for {arch}{why}: its OVF describes a BIOS x86 virtual machine "
                "(IDE disk, E1000 NIC); arm64 disks can be raw, qcow2, vhd or vmdk",
            )
        )
    return found


def _disk_size_problems(text: str) -> list[str]:
    try:
        size = parse_size(text)
    except InputError:
        return [f"disk_size '{text}' must be a size such as 2GiB, 1536MiB or 4G"]
    if size < 256 << 20:
        return [f"disk_size {text} is too small: at least 256MiB (EFI, BOOT and room to grow)"]
    if size % 512:
        return [f"disk_size {text} is {size} bytes, not a whole number of 512-byte sectors"]
    return []


def rules(data: dict[str, Any]) -> list[tuple[Path_, str]]:
    """Checks across fields: options that only make sense for some outputs, files that must exist."""
    found: list[tuple[Path_, str]] = []
    output = data["output"]
    kind = output["kind"]
    if "image" in output and kind not in ("image", "installer"):
        found.append((("output", "image"), f"output.image options apply to kinds image and installer, not {kind}"))
    if kind == "installer" and set(output.get("image", {})) - {"disk_size"}:
        found.append(
            (("output", "image"), "an installer takes only output.image.disk_size (it installs a raw disk layout)")
        )
    out_format = output.get("out_format", "raw")
    if out_format != "raw" and kind not in ("image", "iso"):
        found.append(
            (("output", "out_format"), f"out_format {out_format} applies to image and iso outputs, not {kind}")
        )
    if out_format == ".tar.gz" and kind != "image":
        found.append((("output", "out_format"), "out_format .tar.gz wraps a disk image: use it with kind image"))
    image = output.get("image", {})
    if "disk_size" in image:
        found += [(("output", "image", "disk_size"), problem) for problem in _disk_size_problems(image["disk_size"])]
    if "firmware" in output and kind not in BOOTED_KINDS:
        found.append(
            (("output", "firmware"), f"output.firmware applies to kinds {', '.join(BOOTED_KINDS)}, not {kind}")
        )
    arch = data.get("arch", DEFAULT_ARCH)
    found += arch_rules(arch, kind, output.get("firmware"), image.get("format", "raw"), "")
    found += _secureboot_rules(data, kind, arch)
    inputs = data.get("input", {})
    if "initramfs" in inputs and "package" in inputs["initramfs"]:
        found.append(
            (
                ("input", "initramfs"),
                "input.initramfs takes a path; the initramfs is otherwise assembled from input.init and input.rootfs",
            )
        )
    if "initramfs" in inputs and ({"packages", "extensions", "rootfs"} & set(inputs)):
        found.append(
            (
                ("input", "initramfs"),
                "a prebuilt input.initramfs cannot take rootfs, packages or extensions: they go into an assembled one",
            )
        )
    if "machine_config" in data.get("customization", {}) and "initramfs" in inputs:
        found.append(
            (
                ("customization", "machine_config"),
                "an embedded machine_config needs an assembled initramfs, not input.initramfs",
            )
        )
    return found


# Outputs `secureboot: true` can put behind the signed chain (outputs.kinds).
SECUREBOOT_KINDS = kinds_where(secureboot=True)


def _secureboot_rules(data: dict[str, Any], kind: str, arch: str) -> list[tuple[Path_, str]]:
    """What `secureboot: true` needs: a kind with a boot chain, UEFI only, amd64."""
    if not data.get("secureboot"):
        return []
    found: list[tuple[Path_, str]] = []
    if kind not in SECUREBOOT_KINDS:
        hint = " (a uki output is signed whenever the profile has keys)" if kind == "uki" else ""
        found.append((("secureboot",), f"secureboot applies to kinds {', '.join(SECUREBOOT_KINDS)}, not {kind}{hint}"))
    for index, name in enumerate(data["output"].get("firmware", [])):
        if name == "bios":
            found.append(
                (("output", "firmware", index), "firmware bios cannot boot securely: drop it (secureboot is UEFI only)")
            )
    if arch != "amd64":
        found.append(
            (
                ("secureboot",),
                f"secureboot is built for amd64 only so far: {arch} needs systemd's {arch} EFI stub and shim",
            )
        )
    return found
