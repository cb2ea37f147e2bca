"""What a profile's arch decides about its images: which GRUB boots them, and which kernel fits.

amd64 images boot the host's GRUB (BIOS and UEFI, or the firmware the profile chose); arm64 images
boot UEFI only with GRUB's arm64 EFI modules from the grub-efi-arm64 package's store tree. A kernel
of the other arch is refused before it is written into an image that could never boot it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kiln.core import nofollow
from kiln.core.errors import BuildError, InputError, InputErrors, KilnError
from kiln.image.assets import Loader
from kiln.image.profile import Profile
from kiln.image.profile_rules import BOOTED_KINDS
from kiln.pkg.variables import Platform


def loader_for(profile: Profile, trees: Mapping[str, Path]) -> Loader:
    """The GRUB that boots the profile's outputs: the host's on amd64; on arm64 the EFI modules of
    the grub-efi-arm64 package's output, as the store holds it (`trees`: store trees by package)."""
    if profile.kind not in BOOTED_KINDS:
        return Loader()  # kernel and initramfs outputs hold no boot loader
    if profile.loader_package is None:
        return Loader.for_arch(profile.arch, profile.firmware)
    tree = trees[profile.loader_package]
    # grub-mkimage reads this directory with the host's view: no link on the way to it or in it
    nofollow.refuse_links(tree, ARM64_EFI_MODULES, what=f"package '{profile.loader_package}'")
    return Loader.for_arch(profile.arch, profile.firmware, tree / ARM64_EFI_MODULES)


ARM64_EFI_MODULES = "usr/lib/grub/arm64-efi"


# An arm64 kernel Image's header carries this magic at offset 0x38 (Documentation/arch/arm64/booting.rst).
ARM64_IMAGE_MAGIC = (0x38, b"ARM\x64")


def check_kernel_arch(profile: Profile, vmlinuz: Path) -> None:
    """Refuse a kernel of the other arch before it is written into an image that could not boot it.

    arm64 kernels must be an Image (GRUB's arm64 loader boots nothing else); a kernel that is an
    arm64 Image is refused for amd64. (amd64 kernels are not checked further: tests use stand-ins.)
    """
    offset, magic = ARM64_IMAGE_MAGIC
    with vmlinuz.open("rb") as stream:
        stream.seek(offset)
        is_arm64 = stream.read(len(magic)) == magic
    if is_arm64 == (profile.arch == "arm64"):
        return
    what = "is an arm64 Image" if is_arm64 else "is not an arm64 Image (no ARM\\x64 magic at offset 0x38)"
    if profile.kernel.path is not None:
        raise InputError(
            f"input.kernel {profile.kernel.path}: the kernel {what}, but the profile is for {profile.arch}",
            profile.location("input", "kernel"),
        )
    kernel = f"package {profile.kernel.package}'s /boot/vmlinuz"
    raise BuildError(f"{profile.name}: {kernel} {what}, but the profile is for {profile.arch}")


def check_kernel_files(profiles: list[Profile]) -> None:
    """Kernels given as files (input.kernel.path) fit their profile's arch: input errors, all at once,
    before any output is written (a packaged kernel is checked once assembled)."""
    errors: list[KilnError] = []
    for profile in profiles:
        if profile.kernel.path is not None:
            try:
                check_kernel_arch(profile, profile.kernel.path)
            except InputError as exc:
                errors.append(exc)
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)


def split_platforms(text: str | None) -> list[str] | None:
    """--platform's value: None when not given, else its comma-separated platforms, each checked, in the
    order given, each once (`linux/amd64,linux/arm64`)."""
    if text is None:
        return None
    platforms = [part.strip() for part in text.split(",") if part.strip()]
    if not platforms:
        raise InputError(
            f"--platform {text!r} names no platform: give linux/amd64, linux/arm64 or both, comma-separated"
        )
    for platform in platforms:
        Platform.parse(platform)
    return list(dict.fromkeys(platforms))
