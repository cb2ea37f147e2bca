"""Which GRUB boots an output (assets.Loader), what the seed includes, and refusing a kernel of the other arch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kiln.core.errors import BuildError, InputError
from kiln.image.arch import check_kernel_arch, loader_for
from kiln.image.assets import BootAssets, Loader
from kiln.image.outputs.grub import grub_config, slots_config
from kiln.image.profile import load_profile, resolve_platform

EPOCH = 1704067200


def files(tmp_path: Path) -> tuple[Path, Path]:
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initramfs.zst"
    kernel.write_bytes(b"kernel")
    initrd.write_bytes(b"initrd")
    return kernel, initrd


def arm64_image(path: Path) -> Path:
    """An arm64 kernel Image's header: the EFI stub's MZ, then the ARM\\x64 magic at 0x38."""
    header = bytearray(64)
    header[0:2] = b"MZ"
    header[0x38:0x3C] = b"ARM\x64"
    path.write_bytes(bytes(header) + b"stand-in kernel body")
    return path


def test_the_default_loader_is_amd64s_host_grub_and_leaves_the_seed_alone(tmp_path: Path) -> None:
    """amd64 assets keep the seed they always had, so every amd64 GUID and serial stays the same."""
    kernel, initrd = files(tmp_path)
    plain = BootAssets.make(kernel, initrd, "console=ttyS0", "0.1.0", EPOCH)
    amd64 = BootAssets.make(
        kernel, initrd, "console=ttyS0", "0.1.0", EPOCH, loader=Loader.for_arch("amd64", ("bios", "uefi"))
    )
    assert plain.loader == Loader() and plain.seed == amd64.seed
    assert Loader.for_arch("amd64", ("uefi", "bios")) == Loader()  # one order: the same choice, the same seed
    assert (plain.loader.efi_target, plain.loader.efi_binary, str(plain.loader.efi_dir)) == (
        "x86_64-efi",
        "BOOTX64.EFI",
        "/usr/lib/grub/x86_64-efi",
    )
    assert plain.loader.bios and plain.loader.uefi and plain.loader.serial_console


def test_an_arm64_loader_is_uefi_only_and_changes_the_seed(tmp_path: Path) -> None:
    kernel, initrd = files(tmp_path)
    arm64 = Loader.for_arch("arm64", ("uefi",), tmp_path / "grub")
    assert (arm64.efi_target, arm64.efi_binary, arm64.efi_dir) == ("arm64-efi", "BOOTAA64.EFI", tmp_path / "grub")
    assert arm64.uefi and not arm64.bios and not arm64.serial_console
    plain = BootAssets.make(kernel, initrd, "console=ttyAMA0", "0.1.0", EPOCH)
    made = BootAssets.make(kernel, initrd, "console=ttyAMA0", "0.1.0", EPOCH, loader=arm64)
    assert made.seed != plain.seed
    # the seed holds the loader's arch and firmware, never its directory (store paths differ between hosts)
    moved = BootAssets.make(
        kernel, initrd, "console=ttyAMA0", "0.1.0", EPOCH, loader=Loader.for_arch("arm64", ("uefi",), Path("/x"))
    )
    assert moved.seed == made.seed
    uefi_only = BootAssets.make(
        kernel, initrd, "console=ttyS0", "0.1.0", EPOCH, loader=Loader.for_arch("amd64", ("uefi",))
    )
    assert uefi_only.seed != BootAssets.make(kernel, initrd, "console=ttyS0", "0.1.0", EPOCH).seed
    with pytest.raises(ValueError, match="boots UEFI only"):
        Loader.for_arch("arm64", ("bios", "uefi"), tmp_path)
    with pytest.raises(ValueError, match="needs its EFI modules"):
        Loader.for_arch("arm64", ("uefi",))


def test_arm64_menus_leave_the_console_to_the_firmware(tmp_path: Path) -> None:
    """GRUB's `serial --unit=0` is amd64's COM1; on arm64 UEFI's console already is the serial port."""
    kernel, initrd = files(tmp_path)
    arm64 = Loader.for_arch("arm64", ("uefi",), tmp_path)
    assets = BootAssets.make(kernel, initrd, "console=ttyAMA0", "0.1.0", EPOCH, loader=arm64)
    assert grub_config(assets, "/boot/vmlinuz", "/boot/initramfs.zst") == textwrap.dedent(
        """\
        set default=0
        set timeout=1
        menuentry "Kiln 0.1.0" {
            linux /boot/vmlinuz console=ttyAMA0
            initrd /boot/initramfs.zst
        }
        """
    )
    amd64 = BootAssets.make(kernel, initrd, "console=ttyS0", "0.1.0", EPOCH)
    assert grub_config(amd64, "/k", "/i").startswith("serial --unit=0 --speed=115200\n")
    assert slots_config(serial=False) == slots_config().split("terminal_output console serial\n", 1)[1]


def test_loader_for_a_profile(tmp_path: Path) -> None:
    """amd64: the host's GRUB with the profile's firmware; arm64: the grub-efi-arm64 tree from the store."""
    (tmp_path / "p.yaml").write_text("platform: metal\noutput:\n  kind: iso\n  firmware: [uefi]\n")
    (tmp_path / "k.yaml").write_text("platform: metal\noutput: {kind: kernel}\n")
    store = tmp_path / "store-entry"
    trees = {"grub-efi-arm64": store}
    amd64 = load_profile(tmp_path / "p.yaml")
    assert loader_for(amd64, trees) == Loader.for_arch("amd64", ("uefi",))
    arm64 = resolve_platform([amd64], "linux/arm64")[0]
    assert loader_for(arm64, trees) == Loader.for_arch("arm64", ("uefi",), store / "usr/lib/grub/arm64-efi")
    kernel_only = resolve_platform([load_profile(tmp_path / "k.yaml")], "linux/arm64")[0]
    assert loader_for(kernel_only, trees) == Loader()  # no boot loader in a kernel output


def test_a_kernel_of_the_other_arch_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    image = arm64_image(tmp_path / "Image")
    bzimage = tmp_path / "bzImage"
    bzimage.write_bytes(b"\0" * 0x202 + b"HdrS" + b"\0" * 64)
    (tmp_path / "arm.yaml").write_text(
        "platform: metal\narch: arm64\ninput:\n  kernel: {path: bzImage}\noutput: {kind: iso}\n"
    )
    (tmp_path / "x86.yaml").write_text("platform: metal\ninput:\n  kernel: {path: Image}\noutput: {kind: iso}\n")
    arm, x86 = load_profile(tmp_path / "arm.yaml"), load_profile(tmp_path / "x86.yaml")
    check_kernel_arch(arm, image)
    check_kernel_arch(x86, bzimage)
    with pytest.raises(InputError) as caught:
        check_kernel_arch(arm, bzimage)
    assert str(caught.value).startswith("arm.yaml:4: input.kernel ")
    assert "is not an arm64 Image (no ARM\\x64 magic at offset 0x38), but the profile is for arm64" in str(caught.value)
    with pytest.raises(InputError, match=r"x86.yaml:3: .*the kernel is an arm64 Image, but the profile is for amd64"):
        check_kernel_arch(x86, image)
    (tmp_path / "pkg.yaml").write_text("platform: metal\narch: arm64\noutput: {kind: iso}\n")
    with pytest.raises(BuildError, match=r"package kernel's /boot/vmlinuz is not an arm64 Image"):
        check_kernel_arch(load_profile(tmp_path / "pkg.yaml"), bzimage)
