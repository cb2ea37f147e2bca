"""Profiles: the shipped ones load, and each kind of bad profile gets its exact file:line message."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import yaml

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors
from kiln.core.sizes import parse_size
from kiln.image.imager import check_packages, with_release_version
from kiln.image.profile import CONFIG_PATH, find_profile, load_profile, load_profiles
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
    assert load_profile(PROFILES / "gcp.yaml").file_name == "disk.raw"


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
            "p.yaml:2: output kind 'disk' is not one of iso, image, pxe, installer, kernel, initramfs",
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
            "p.yaml:3: kernel_args must be a list, not a string",
        ),
        (
            "platform: Metal\noutput: {kind: iso}\n",
            "p.yaml:1: platform 'Metal' must be lower-case letters, digits and '-'",
        ),
        ("output: {kind: iso}\n", "p.yaml:1: missing required key 'platform'"),
        (
            "platform: metal\narch: arm64\noutput: {kind: iso}\n",
            "p.yaml:2: arch arm64: only amd64 images can be built so far (arm64 boot assets validate but no arm64 "
            "bootloader output exists yet)",
        ),
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
            "p.yaml:3: 'Bad' is not a package name",
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
    with pytest.raises(InputError) as caught:
        check_packages([profile], graph)
    assert str(caught.value).endswith("p.yaml:5: unknown package 'wireguardd'")


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
        "bad.yaml:2: output kind 'floppy' is not one of iso, image, pxe, installer, kernel, initramfs"
    )
    result = kiln("image", "iso", "--extension", "kmod", "--profiles-dir", str(PROFILES), "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2 and "apply without profiles" in result.err


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
    assert "openstack.yaml:5: profile openstack writes image (qcow2, raw): kiln install needs a raw" in result.err


def test_a_profile_without_a_version_takes_the_machined_package_version(tmp_path: Path) -> None:
    """Release metadata must agree with what machined reports (`--set kiln_version=` included),
    or upgrades compare the wrong numbers."""
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64"), {"kiln_version": "7.1.0"}))
    bare = load_profile(write(tmp_path, "platform: metal\noutput: {kind: iso}\n", "bare.yaml"))
    pinned = load_profile(write(tmp_path, "platform: metal\nversion: 9.9.9\noutput: {kind: iso}\n", "pinned.yaml"))
    assert bare.version == ""
    assert [p.version for p in with_release_version([bare, pinned], graph)] == ["7.1.0", "9.9.9"]
