"""Profiles: the shipped ones load, and each kind of bad profile gets its exact file:line message."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import yaml

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, Location
from kiln.core.sizes import parse_size
from kiln.image.checks import check_packages, with_release_version
from kiln.image.order import expected_cost
from kiln.image.profile import CONFIG_PATH, Profile, find_profile, load_profile, load_profiles, resolve_platform
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import Result

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "profiles"
CLOUDS = ("aws", "gcp", "azure", "digital-ocean", "openstack", "nocloud", "vmware", "hcloud", "vultr")


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def messages(path: Path) -> list[str]:
    try:
        load_profile(path)
    except InputErrors as many:
        return [str(e) for e in many.errors]
    except InputError as one:
        return [str(one)]
    raise AssertionError(f"{path} loaded without error")


def test_every_shipped_profile_validates_against_the_json_schema() -> None:
    validator = jsonschema.Draft202012Validator(schema.load_schema("profile.schema.json", "kiln.image"))
    files = sorted(PROFILES.glob("*.yaml"))
    assert {f.stem for f in files} >= {"iso", "metal", "pxe", "installer", *CLOUDS}
    for file in files:
        validator.validate(yaml.safe_load(file.read_text()))
        assert load_profile(file).name == file.stem


def test_shipped_cloud_profiles_have_their_platform_format_and_console() -> None:
    expected = {
        "aws": ("raw", ".zst"),
        "gcp": ("raw", ".tar.gz"),
        "azure": ("vhd", "raw"),
        "digital-ocean": ("raw", ".gz"),
        "openstack": ("qcow2", "raw"),
        "nocloud": ("raw", "raw"),
        "vmware": ("ova", "raw"),
        "hcloud": ("raw", ".xz"),
        "vultr": ("raw", "raw"),
    }
    for name, (disk_format, out_format) in expected.items():
        profile = load_profile(PROFILES / f"{name}.yaml")
        assert (profile.kind, profile.disk_format, profile.out_format) == ("image", disk_format, out_format), name
        assert profile.platform == name
        assert f"kiln.platform={name}" in profile.cmdline().split()
        assert any(a.startswith("console=ttyS0") for a in profile.cmdline().split()), name
    # <platform>-<arch>.<format>, then out_format's suffix (the tarball holds disk.raw, outputs.image.GCP_MEMBER)
    assert load_profile(PROFILES / "gcp.yaml").file_name == "gcp-amd64.raw"
    assert load_profile(PROFILES / "azure.yaml").for_arch("arm64").file_name == "azure-arm64.vhd"
    metal = load_profile(PROFILES / "metal.yaml")
    assert (metal.file_name, metal.out_format) == ("metal-amd64.raw", ".zst")


def test_each_kind_names_its_one_artifact(tmp_path: Path) -> None:
    """What write_output writes and the factory serves: one name, from the profile."""
    named = {name: load_profile(PROFILES / f"{name}.yaml").artifact_name for name in ("metal", "gcp", "hcloud", "iso")}
    assert named == {
        "metal": "metal-amd64.raw.zst",
        "gcp": "gcp-amd64.raw.tar.gz",
        "hcloud": "hcloud-amd64.raw.xz",
        "iso": "metal-amd64.iso",
    }
    assert load_profile(PROFILES / "azure.yaml").for_arch("arm64").artifact_name == "azure-arm64.vhd"
    for kind, expected in (("kernel", "kernel-amd64"), ("initramfs", "initramfs-amd64.zst"), ("pxe", "")):
        assert load_profile(write(tmp_path, f"platform: metal\noutput: {{kind: {kind}}}\n")).artifact_name == expected
    uki = write(tmp_path, "platform: metal\noutput: {kind: uki}\n")
    assert load_profile(uki).artifact_name == "metal-amd64-uki.efi"
    secure = write(tmp_path, "platform: metal\nsecureboot: true\noutput: {kind: iso}\n")
    assert load_profile(secure).artifact_name == "metal-amd64-secureboot.iso"
    assert load_profile(PROFILES / "installer.yaml").artifact_name == ""


def test_defaults_and_command_line(tmp_path: Path) -> None:
    profile = load_profile(
        write(
            tmp_path,
            """
        platform: metal
        customization:
          kernel_args: [quiet]
          machine_config: {hostname: node-1}
        output: {kind: image}
    """,
        )
    )
    assert (profile.name, profile.arch, profile.disk_size, profile.disk_format) == ("p", "amd64", 1 << 30, "raw")
    assert profile.cmdline() == f"quiet kiln.platform=metal kiln.config={CONFIG_PATH}"
    assert profile.kernel.package == "kernel"
    assert profile.packages_to_build()[:2] == ["kernel", "init"]
    assert "machined" in profile.packages_to_build()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "platform: metal\noutput: {kind: disk}\n",
            "p.yaml:2: output kind 'disk' is not one of iso, image, pxe, installer, kernel, initramfs, uki",
        ),
        ("platform: metal\noutptu: {kind: iso}\n", "p.yaml:2: unknown key 'outptu' (did you mean 'output'?)"),
        (
            "platform: metal\noutput:\n  kind: image\n  image: {format: vdi}\n",
            "p.yaml:4: image format 'vdi' is not one of raw, qcow2, vhd, vmdk, ova",
        ),
        (
            "platform: metal\noutput:\n  kind: image\n  image:\n    disk_size: huge\n",
            "p.yaml:5: disk_size 'huge' must be a size such as 2GiB, 1536MiB or 4G",
        ),
        (
            "platform: metal\noutput:\n  kind: image\n  image:\n    disk_size: 10MiB\n",
            "p.yaml:5: disk_size 10MiB is too small: at least 256MiB (EFI, BOOT and room to grow)",
        ),
        (
            "platform: metal\noutput:\n  kind: image\n  image:\n    disk_size: 1000000001B\n",
            "p.yaml:5: disk_size 1000000001B is 1000000001 bytes, not a whole number of 512-byte sectors",
        ),
        (
            "platform: metal\noutput:\n  kind: iso\n  image: {format: raw}\n",
            "p.yaml:4: output.image options apply to kinds image and installer, not iso",
        ),
        (
            "platform: metal\noutput:\n  kind: pxe\n  out_format: .zst\n",
            "p.yaml:4: out_format .zst applies to image and iso outputs, not pxe",
        ),
        (
            "platform: metal\ncustomization:\n  kernel_args: console=ttyS0\noutput: {kind: iso}\n",
            "p.yaml:3: kernel_args must be a list or a mapping, not a string",
        ),
        (
            "platform: metal\ncustomization:\n  kernel_args: {riscv64: [quiet]}\noutput: {kind: iso}\n",
            "p.yaml:3: unknown key 'riscv64' in customization.kernel_args",
        ),
        (
            "platform: metal\noutput:\n  kind: iso\n  firmware: [uefi, coreboot]\n",
            "p.yaml:4: firmware 'coreboot' is not one of bios, uefi",
        ),
        (
            "platform: metal\noutput:\n  kind: kernel\n  firmware: [uefi]\n",
            "p.yaml:4: output.firmware applies to kinds iso, image, pxe, installer, not kernel",
        ),
        (
            "platform: metal\narch: arm64\noutput:\n  kind: iso\n  firmware: [uefi, bios]\n",
            "p.yaml:5: firmware bios cannot be built for arm64: arm64 machines boot UEFI only; "
            "write firmware: [uefi] or leave firmware out",
        ),
        (
            "platform: metal\narch: arm64\noutput:\n  kind: image\n  firmware:\n    - bios\n",
            "p.yaml:6: firmware bios cannot be built for arm64",
        ),
        (
            "platform: metal\narch: arm64\noutput:\n  kind: pxe\n  firmware: [bios]\n",
            "p.yaml:5: firmware bios cannot be built for arm64",
        ),
        (
            "platform: vmware\narch: arm64\noutput:\n  kind: image\n  image: {format: ova}\n",
            "p.yaml:5: format ova cannot be built for arm64: its OVF describes a BIOS x86 virtual machine",
        ),
        (
            "platform: Metal\noutput: {kind: iso}\n",
            "p.yaml:1: platform 'Metal' must be lower-case letters, digits and '-'",
        ),
        ("output: {kind: iso}\n", "p.yaml:1: missing required key 'platform'"),
        ("platform: metal\noutput: {kind: iso\n", "p.yaml:3: YAML syntax: did not find expected ',' or '}'"),
        (
            "platform: metal\nplatform: aws\noutput: {kind: iso}\n",
            "p.yaml:2: duplicate key 'platform' (first at line 1)",
        ),
        (
            "platform: metal\ninput:\n  kernel: {path: nowhere/vmlinuz}\noutput: {kind: iso}\n",
            "p.yaml:3: input.kernel: no such file",
        ),
        (
            "platform: metal\ninput:\n  extensions: [Bad]\noutput: {kind: iso}\n",
            "p.yaml:3: 'Bad' is neither a package name nor an extension reference",
        ),
    ],
)
def test_bad_profiles_name_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    found = messages(write(tmp_path, text))
    assert any(m.startswith(expected) for m in found), found


def test_all_errors_are_reported_at_once(tmp_path: Path) -> None:
    found = messages(write(tmp_path, "platform: metal\nverison: '1'\noutput:\n  kind: image\n  image: {format: x}\n"))
    assert len(found) == 2
    assert "unknown key 'verison' (did you mean 'version'?)" in found[0]


def test_profiles_by_name_by_path_and_unknown(tmp_path: Path) -> None:
    assert find_profile("iso", PROFILES) == PROFILES / "iso.yaml"
    path = write(tmp_path, "platform: metal\noutput: {kind: iso}\n", "mine.yaml")
    assert find_profile(str(path), PROFILES) == path
    with pytest.raises(InputError, match=r"unknown profile 'meta' \(did you mean 'metal'\?\)"):
        find_profile("meta", PROFILES)
    with pytest.raises(InputError, match="profile name 'iso' is also used by"):
        load_profiles(
            ["iso", str(write(tmp_path, "name: iso\nplatform: x\noutput: {kind: pxe}\n", "b.yaml"))], PROFILES
        )


def test_unknown_package_points_at_the_profile_line(tmp_path: Path) -> None:
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64")))
    profile = load_profile(
        write(
            tmp_path,
            """
        platform: metal
        input:
          extensions:
            - kmod
            - wireguardd
        output: {kind: iso}
    """,
        )
    )
    with pytest.raises(InputErrors) as caught:
        check_packages([profile], graph)
    # errors are sorted by file path, and where the clone lives decides which path sorts first
    assert sorted(str(e).split("/")[-1] for e in caught.value.errors) == [
        "p.yaml:5: unknown package 'wireguardd'",
        "pkg.yaml:1: package 'kmod' is not a system extension: add an `extension:` section with author and "
        "compatibility",
    ]


def test_disk_size_reads_as_the_cache_flags_do(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("platform: metal\noutput:\n  kind: image\n  image:\n    disk_size: 20GB\n")
    assert load_profile(file).disk_size == 20 * 10**9


def test_sizes() -> None:
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1536MiB") == 1536 << 20
    assert parse_size("4G") == 4 << 30
    assert parse_size("20GB") == 20 * 10**9  # as `kiln cache gc --max-size` reads it: one grammar
    with pytest.raises(InputError, match="invalid size"):
        parse_size("4 parsecs")


def test_cli_bad_profile_exits_2_without_traceback(kiln: Callable[..., Result], tmp_path: Path) -> None:
    write(tmp_path, "platform: metal\noutput: {kind: floppy}\n", "bad.yaml")
    result = kiln("image", "bad.yaml", "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2
    assert result.err.strip() == (
        "bad.yaml:2: output kind 'floppy' is not one of iso, image, pxe, installer, kernel, initramfs, uki"
    )
    result = kiln("image", "iso", "--package", "kmod", "--profiles-dir", str(PROFILES), "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2 and "apply without profiles" in result.err


@pytest.mark.parametrize(
    ("extension", "message"),
    [
        ("kmod", "pkgs/kmod/pkg.yaml:1: package 'kmod' is not a system extension"),
        ("oci://127.0.0.1:5000/ext", "invalid extension reference 'oci://127.0.0.1:5000/ext'"),
        ("oci://127.0.0.1:5000/Ext:1", "invalid extension reference"),
    ],
)
def test_an_extension_for_profiles_is_checked_before_any_build(
    kiln: Callable[..., Result], extension: str, message: str
) -> None:
    """--extension with profiles adds a layer to each; one that cannot be a layer is refused first (exit 2)."""
    pkgs = str(ROOT / "pkgs")
    result = kiln("image", "iso", "--extension", extension, "--profiles-dir", str(PROFILES), "--pkgs", pkgs)
    assert result.code == 2 and message in result.err, result.err


def test_install_refuses_a_profile_that_is_not_a_raw_disk(kiln: Callable[..., Result]) -> None:
    result = kiln(
        "install",
        "--disk",
        "x.img",
        "--profile",
        "openstack",
        "--profiles-dir",
        str(PROFILES),
        "--pkgs",
        str(ROOT / "pkgs"),
    )
    assert result.code == 2
    assert "openstack.yaml:8: profile openstack writes image (qcow2, raw): kiln install needs a raw" in result.err


def test_every_profile_takes_the_release_version_and_one_that_differs_is_refused(tmp_path: Path) -> None:
    """Release metadata must agree with what machined reports (`--set kiln_version=` included),
    or upgrades compare the wrong numbers: a release has one version."""
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64"), {"kiln_version": "7.1.0"}))
    assert graph.tree.packages["machined"].version == "7.1.0"
    bare = load_profile(write(tmp_path, "platform: metal\noutput: {kind: iso}\n", "bare.yaml"))
    same = load_profile(write(tmp_path, "platform: metal\nversion: 7.1.0\noutput: {kind: iso}\n", "same.yaml"))
    other = load_profile(write(tmp_path, "platform: metal\nversion: 9.9.9\noutput: {kind: iso}\n", "other.yaml"))
    assert bare.version == ""
    assert [p.version for p in with_release_version([bare, same], graph)] == ["7.1.0", "7.1.0"]
    with pytest.raises(InputError) as info:
        with_release_version([bare, other], graph)
    assert info.value.location == Location(str(tmp_path / "other.yaml"), 2)
    assert "version 9.9.9 differs from the release's version 7.1.0" in str(info.value)


ARM64_CLOUDS = ("aws", "gcp", "azure", "hcloud", "openstack", "nocloud")


def refusals(profiles: list[Profile], platform: str | None) -> list[str]:
    try:
        resolve_platform(profiles, platform)
    except InputErrors as many:
        return [str(e) for e in many.errors]
    except InputError as one:
        return [str(one)]
    raise AssertionError("resolved without error")


def test_arch_comes_from_the_profile_else_platform_else_amd64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    bare = load_profile(write(tmp_path, "platform: metal\noutput: {kind: iso}\n", "bare.yaml"))
    arm = load_profile(write(tmp_path, "platform: metal\narch: arm64\noutput: {kind: iso}\n", "arm.yaml"))
    assert (bare.arch, bare.arch_given, arm.arch, arm.arch_given) == ("amd64", False, "arm64", True)
    # no --platform: each profile's own arch (amd64 when it names none)
    assert [p.arch for p in resolve_platform([bare, arm], None)] == ["amd64", "arm64"]
    # --platform decides for a profile without arch:, and agrees with one that has it
    assert [p.arch for p in resolve_platform([bare, arm], "linux/arm64")] == ["arm64", "arm64"]
    assert resolve_platform([bare], "linux/amd64") == [bare]


def test_arch_and_platform_that_disagree_are_refused_at_the_arch_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    arm = load_profile(write(tmp_path, "platform: metal\narch: arm64\noutput: {kind: iso}\n", "arm.yaml"))
    amd = load_profile(write(tmp_path, "# x86 only\narch: amd64\nplatform: metal\noutput: {kind: iso}\n", "amd.yaml"))
    assert refusals([arm], "linux/amd64") == [
        "arm.yaml:2: arch arm64 disagrees with --platform linux/amd64: a profile's arch and --platform must agree "
        "(leave arch out of the profile to let --platform choose)"
    ]
    assert refusals([amd, arm], "linux/arm64") == [
        "amd.yaml:2: arch amd64 disagrees with --platform linux/arm64: a profile's arch and --platform must agree "
        "(leave arch out of the profile to let --platform choose)"
    ]
    assert refusals([arm], "linux/riscv64") == [
        "unsupported platform 'linux/riscv64': choose one of linux/amd64, linux/arm64"
    ]


def test_what_arm64_cannot_boot_is_refused_when_platform_chooses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile without arch: is checked for amd64 when loaded, and again for the arch --platform gives."""
    monkeypatch.chdir(tmp_path)
    hybrid = load_profile(
        write(tmp_path, "platform: metal\noutput:\n  kind: iso\n  firmware: [bios, uefi]\n", "h.yaml")
    )
    ova = load_profile(write(tmp_path, "platform: x\noutput:\n  kind: image\n  image: {format: ova}\n", "o.yaml"))
    assert hybrid.firmware == ("bios", "uefi")
    assert refusals([hybrid, ova], "linux/arm64") == [
        "h.yaml:4: firmware bios cannot be built for arm64 (--platform linux/arm64): arm64 machines boot UEFI only; "
        "write firmware: [uefi] or leave firmware out",
        "o.yaml:4: format ova cannot be built for arm64 (--platform linux/arm64): its OVF describes a BIOS x86 "
        "virtual machine (IDE disk, E1000 NIC); arm64 disks can be raw, qcow2, vhd or vmdk",
    ]


def test_cli_refuses_a_profile_whose_arch_disagrees_with_platform(kiln: Callable[..., Result], tmp_path: Path) -> None:
    """Exit 2 and file:line before anything is built (the graph is not even loaded)."""
    write(tmp_path, "platform: metal\narch: amd64\noutput: {kind: iso}\n", "x86.yaml")
    write(tmp_path, "platform: metal\noutput:\n  kind: image\n  firmware: [bios]\n", "legacy.yaml")
    result = kiln("image", "x86.yaml", "--platform", "linux/arm64", "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2
    assert result.err.strip() == (
        "x86.yaml:2: arch amd64 disagrees with --platform linux/arm64: a profile's arch and --platform must agree "
        "(leave arch out of the profile to let --platform choose)"
    )
    result = kiln("image", "legacy.yaml", "--platform", "linux/arm64", "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2
    assert result.err.startswith("legacy.yaml:4: firmware bios cannot be built for arm64 (--platform linux/arm64)")


def test_kernel_args_and_firmware_defaults_per_arch(tmp_path: Path) -> None:
    bare = load_profile(write(tmp_path, "platform: metal\noutput: {kind: iso}\n"))
    arm = resolve_platform([bare], "linux/arm64")[0]
    assert (bare.kernel_args, bare.firmware) == (("console=ttyS0",), ("bios", "uefi"))
    assert (arm.kernel_args, arm.firmware) == (("console=ttyAMA0",), ("uefi",))
    assert arm.cmdline() == "console=ttyAMA0 kiln.platform=metal"
    mapped = load_profile(
        write(
            tmp_path,
            "platform: metal\ncustomization:\n  kernel_args:\n    arm64: [quiet]\noutput: {kind: image}\n",
            "m.yaml",
        )
    )
    assert mapped.kernel_args == ("console=ttyS0",)  # amd64 names none: the default
    assert resolve_platform([mapped], "linux/arm64")[0].kernel_args == ("quiet",)
    listed = load_profile(write(tmp_path, "platform: metal\ncustomization: {kernel_args: [a]}\noutput: {kind: pxe}\n"))
    assert resolve_platform([listed], "linux/arm64")[0].kernel_args == ("a",)  # a list serves every arch


def test_arm64_boot_loaders_come_from_the_grub_package(tmp_path: Path) -> None:
    """Outputs with a boot loader build grub-efi-arm64 on arm64; kernel and initramfs outputs do not."""
    for kind in ("iso", "image", "pxe", "installer"):
        profile = resolve_platform(
            [load_profile(write(tmp_path, f"platform: m\noutput: {{kind: {kind}}}\n"))], "linux/arm64"
        )
        assert profile[0].packages_to_build()[-1] == "grub-efi-arm64", kind
        assert "grub-efi-arm64" not in profile[0].asset_packages()
    for kind in ("kernel", "initramfs"):
        profile = resolve_platform(
            [load_profile(write(tmp_path, f"platform: m\noutput: {{kind: {kind}}}\n"))], "linux/arm64"
        )
        assert "grub-efi-arm64" not in profile[0].packages_to_build(), kind
    amd64 = load_profile(write(tmp_path, "platform: m\noutput: {kind: iso}\n"))
    assert amd64.packages_to_build() == amd64.asset_packages()


def test_shipped_profiles_offer_arm64_where_the_platform_has_it() -> None:
    """The arm64 clouds (and metal, iso, pxe, installer) build for arm64 with the arm64 console; the others refuse."""
    consoles = {"aws": "console=ttyS0,115200n8"}  # Graviton's UART is a 16550: ttyS0 on both arches
    names = (*ARM64_CLOUDS, "metal", "iso", "pxe", "installer")
    loaded = [load_profile(PROFILES / f"{name}.yaml") for name in names]
    for profile in resolve_platform(loaded, "linux/arm64"):
        args = profile.cmdline().split()
        expected = consoles.get(profile.name, "console=ttyAMA0")
        assert any(a.startswith(expected) for a in args), (profile.name, args)
        if profile.name not in consoles:
            assert not any(a.startswith("console=ttyS") for a in args), (profile.name, args)
        assert profile.firmware == ("uefi",)
    azure = resolve_platform([load_profile(PROFILES / "azure.yaml")], "linux/arm64")[0]
    assert "earlycon" in azure.kernel_args  # earlyprintk= is x86's; earlycon finds the PL011 from SPCR
    for name in ("digital-ocean", "vultr", "vmware"):
        profile = load_profile(PROFILES / f"{name}.yaml")
        assert profile.arch_given and profile.arch == "amd64"
        with pytest.raises(InputError, match=rf"{name}.yaml:\d+: arch amd64 disagrees with --platform linux/arm64"):
            resolve_platform([profile], "linux/arm64")


def test_a_tree_without_the_arm64_grub_package_is_refused_at_the_profile(tmp_path: Path) -> None:
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/arm64")))
    del graph.tree.packages["grub-efi-arm64"]
    profile = load_profile(write(tmp_path, "platform: metal\narch: arm64\noutput: {kind: iso}\n"))
    with pytest.raises(InputError) as caught:
        check_packages([profile], graph)
    assert str(caught.value).endswith("p.yaml:2: unknown package 'grub-efi-arm64': arm64 outputs take GRUB from it")


def test_a_release_starts_its_longest_profiles_first() -> None:
    names = sorted(p.stem for p in PROFILES.glob("*.yaml"))
    profiles = load_profiles(names, PROFILES)
    order = [p.name for p in sorted(profiles, key=expected_cost, reverse=True)]
    assert order[:3] == ["installer", "hcloud", "digital-ocean"]  # two gzips, xz, gzip
    assert order.index("azure") < order.index("metal") < order.index("iso")
    assert order[-1] == "openstack"  # qemu-img skips the holes
