"""`kiln image --platform linux/amd64,linux/arm64`: the naming rules, one directory and one manifest per
profile, file inputs per arch, the refusals, and an installer's image index over both arches.

Kernels and initramfs are small stand-ins (an arm64 Image header where arm64 needs one); the kinds
written here (kernel, initramfs, and installer layouts from build_installer) need no boot tools.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import BuildError, InputError, InputErrors
from kiln.image.arch import split_platforms
from kiln.image.imager import Built, make_images
from kiln.image.manifest import write_manifest
from kiln.image.multiarch import (
    PlatformBuild,
    arch_name,
    check_versions,
    make_platform_images,
    merge_profile,
    resolve_platforms,
)
from kiln.image.outputs.installer import INDEX_TYPE, MANIFEST_TYPE
from kiln.image.profile import load_profile, load_profiles, resolve_platform
from kiln.installer.image_layout import open_layout
from kiln.installer.release import read_releases
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import Result
from tests.unit.test_release_push import EPOCH, make_layout

ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = ["linux/amd64", "linux/arm64"]


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def stand_ins(directory: Path) -> None:
    """vmlinuz-amd64 (any bytes), vmlinuz-arm64 (an arm64 Image header) and initramfs.zst."""
    header = bytearray(64)
    header[0:2] = b"MZ"
    header[0x38:0x3C] = b"ARM\x64"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vmlinuz-amd64").write_bytes(b"amd64 kernel stand-in\n" * 500)
    (directory / "vmlinuz-arm64").write_bytes(bytes(header) + b"arm64 kernel stand-in\n" * 500)
    (directory / "initramfs.zst").write_bytes(b"initramfs stand-in\n" * 500)


PER_ARCH = """
platform: metal
version: 0.1.0
input:
  kernel:
    path:
      amd64: vmlinuz-amd64
      arm64: vmlinuz-arm64
  initramfs: {path: initramfs.zst}
output: {kind: KIND}
"""


def per_arch_profile(directory: Path, kind: str, name: str | None = None) -> Path:
    stand_ins(directory)
    return write(directory, f"{name or kind}.yaml", PER_ARCH.replace("KIND", kind))


# --- names -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arch", "expected"),
    [
        ("disk.raw", "amd64", "disk-amd64.raw"),
        ("disk.qcow2", "arm64", "disk-arm64.qcow2"),
        ("disk.raw.xz", "amd64", "disk-amd64.raw.xz"),
        ("disk.raw.tar.gz", "arm64", "disk-arm64.raw.tar.gz"),
        ("kiln-arm64.iso", "arm64", "kiln-arm64.iso"),  # names its arch already
        ("kiln-amd64.iso", "amd64", "kiln-amd64.iso"),
        ("sbom.spdx.json", "arm64", "sbom-arm64.spdx.json"),
        ("sbom.cdx.json", "arm64", "sbom-arm64.cdx.json"),
        ("vmlinuz", "arm64", "vmlinuz-arm64"),
        ("initramfs.zst", "amd64", "initramfs-amd64.zst"),
        ("installer.tar", "amd64", "installer-amd64.tar"),
        ("installer", "arm64", "installer-arm64"),  # an OCI layout directory
        ("kiln-1.0.raw", "amd64", "kiln-1.0-amd64.raw"),  # "0" is no extension
        ("xarm64.raw", "arm64", "xarm64-arm64.raw"),  # arm64 inside a word is not the arch
        ("disk_arm64.raw", "arm64", "disk_arm64.raw"),
        ("disk.ARM64.raw", "arm64", "disk.ARM64.raw"),
    ],
)
def test_the_arch_goes_before_the_extensions(name: str, arch: str, expected: str) -> None:
    assert arch_name(name, arch) == expected


def test_platform_lists() -> None:
    assert split_platforms(None) is None
    assert split_platforms("linux/arm64") == ["linux/arm64"]
    assert split_platforms("linux/amd64,linux/arm64") == PLATFORMS
    assert split_platforms(" linux/arm64 , linux/amd64,linux/arm64,") == ["linux/arm64", "linux/amd64"]
    with pytest.raises(InputError, match="unsupported platform 'linux/riscv64'"):
        split_platforms("linux/amd64,linux/riscv64")
    with pytest.raises(InputError, match="names no platform"):
        split_platforms(",")


# --- profiles for several platforms ------------------------------------------------------------------------------


def errors_of(call: Callable[[], object]) -> list[str]:
    try:
        call()
    except InputErrors as many:
        return [str(e) for e in many.errors]
    except InputError as one:
        return [str(one)]
    raise AssertionError("no error")


def test_a_profile_that_pins_its_arch_is_refused_for_a_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    arm = load_profile(write(tmp_path, "arm.yaml", "platform: metal\narch: arm64\noutput: {kind: iso}\n"))
    bare = load_profile(write(tmp_path, "bare.yaml", "platform: metal\noutput: {kind: iso}\n"))
    assert errors_of(lambda: resolve_platforms([bare, arm], PLATFORMS)) == [
        "arm.yaml:2: arch arm64 pins the profile to linux/arm64, but --platform linux/amd64,linux/arm64 also asks "
        "for linux/amd64: a profile with arch: is built for that arch only (leave arch out of the profile to build "
        "it for every platform listed, or build it with --platform linux/arm64)"
    ]
    resolved = resolve_platforms([bare], PLATFORMS)
    assert {p: [x.arch for x in ps] for p, ps in resolved.items()} == {
        "linux/amd64": ["amd64"],
        "linux/arm64": ["arm64"],
    }
    assert resolved["linux/arm64"][0].cmdline() == "console=ttyAMA0 kiln.platform=metal"


def test_what_one_arch_cannot_boot_is_refused_for_that_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    hybrid = load_profile(
        write(tmp_path, "h.yaml", "platform: metal\noutput:\n  kind: iso\n  firmware: [bios, uefi]\n")
    )
    assert errors_of(lambda: resolve_platforms([hybrid], PLATFORMS)) == [
        "h.yaml:4: firmware bios cannot be built for arm64 (--platform linux/arm64): arm64 machines boot UEFI only; "
        "write firmware: [uefi] or leave firmware out"
    ]


def test_file_inputs_per_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    profile = load_profile(per_arch_profile(tmp_path, "iso"))
    assert (profile.arch, profile.kernel.path, profile.kernel.package) == ("amd64", tmp_path / "vmlinuz-amd64", None)
    arm = resolve_platform([profile], "linux/arm64")[0]
    assert (arm.arch, arm.kernel.path, arm.initramfs) == (
        "arm64",
        tmp_path / "vmlinuz-arm64",
        tmp_path / "initramfs.zst",
    )
    assert arm.packages_to_build() == ["grub-efi-arm64"]  # no kernel package, no rootfs to assemble

    only_arm = write(tmp_path, "only.yaml", "platform: metal\ninput:\n  kernel:\n    path: {arm64: vmlinuz-arm64}\n"
                     "output: {kind: kernel}\n")  # fmt: skip
    loaded = load_profile(only_arm)  # no arch: amd64 may never be asked for
    assert resolve_platform([loaded], "linux/arm64")[0].kernel.path == tmp_path / "vmlinuz-arm64"
    message = (
        "only.yaml:4: input.kernel.path names a file for arm64 only, not amd64: add amd64: <file> "
        "(or build it for linux/arm64)"
    )
    assert errors_of(lambda: resolve_platform([loaded], None)) == [message]
    assert errors_of(lambda: resolve_platforms([loaded], PLATFORMS)) == [message]
    pinned = write(tmp_path, "pinned.yaml", "arch: amd64\n" + only_arm.read_text())
    assert errors_of(lambda: load_profile(pinned)) == [message.replace("only.yaml:4", "pinned.yaml:5")]
    missing = write(tmp_path, "m.yaml", "platform: metal\ninput:\n  kernel:\n    path: {amd64: nowhere}\n"
                    "output: {kind: kernel}\n")  # fmt: skip
    assert errors_of(lambda: load_profile(missing)) == [f"m.yaml:4: input.kernel: no such file {tmp_path}/nowhere"]
    bad = write(
        tmp_path, "b.yaml", "platform: metal\ninput:\n  kernel:\n    path: {riscv64: x}\noutput: {kind: kernel}\n"
    )
    assert errors_of(lambda: load_profile(bad)) == ["b.yaml:4: unknown key 'riscv64' in input.kernel.path"]


def test_every_platform_must_give_a_profile_one_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    bare = load_profile(write(tmp_path, "bare.yaml", "platform: metal\noutput: {kind: iso}\n"))
    resolved = resolve_platforms([bare], PLATFORMS)
    check_versions({p: [replace(x, version="1.0.0")] for p, [x] in resolved.items()})
    versions = {"linux/amd64": "1.0.0", "linux/arm64": "1.1.0"}
    differing = {p: [replace(x, version=versions[p])] for p, [x] in resolved.items()}
    assert errors_of(lambda: check_versions(differing)) == [
        "bare.yaml:1: profile bare gets a different version per platform (linux/amd64 1.0.0, linux/arm64 1.1.0): "
        "its outputs are one release; set version: in the profile"
    ]


def test_the_cli_refuses_before_anything_is_built(kiln: Callable[..., Result], tmp_path: Path) -> None:
    write(tmp_path, "x86.yaml", "platform: metal\narch: amd64\noutput: {kind: iso}\n")
    result = kiln("image", "x86.yaml", "--platform", "linux/amd64,linux/arm64", "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2
    assert result.err.startswith("x86.yaml:2: arch amd64 pins the profile to linux/amd64, but --platform ")
    result = kiln("image", "--platform", "linux/amd64,linux/arm64", "--pkgs", str(ROOT / "pkgs"))
    assert result.code == 2
    assert "several platforms need profiles" in result.err
    result = kiln("image", "x86.yaml", "--platform", "linux/amd64,linux/s390x", "--pkgs", str(ROOT / "pkgs"))
    assert (result.code, result.err.strip()) == (
        2,
        "unsupported platform 'linux/s390x': choose one of linux/amd64, linux/arm64",
    )


# --- one directory per profile ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graphs() -> dict[str, Graph]:
    return {p: Graph(load_tree(ROOT / "pkgs", Platform.parse(p))) for p in PLATFORMS}


def platform_builds(profiles: list[Path], graphs: dict[str, Graph]) -> list[PlatformBuild]:
    loaded = load_profiles([str(p) for p in profiles], Path("."))
    resolved = resolve_platforms(loaded, PLATFORMS)
    return [PlatformBuild(p, resolved[p], Built(graphs[p], {}, {}, EPOCH)) for p in PLATFORMS]


def tree(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def outputs(directory: Path) -> dict[str, str]:
    """tree() without the provenance: it records the run's start and end, so two runs differ there."""
    return {name: digest for name, digest in tree(directory).items() if not name.endswith("provenance.intoto.json")}


def test_two_platforms_write_one_directory_and_one_manifest(tmp_path: Path, graphs: dict[str, Graph]) -> None:
    inputs = tmp_path / "inputs"
    profiles = [per_arch_profile(inputs, "kernel"), per_arch_profile(inputs, "initramfs")]
    out = tmp_path / "out"
    (out / "kernel").mkdir(parents=True)
    (out / "kernel" / "stale").write_text("from an earlier run")
    said: list[str] = []
    results, times = make_platform_images(platform_builds(profiles, graphs), out, 2, said.append)

    assert sorted(p.name for p in out.iterdir()) == ["initramfs", "kernel"]  # no staging left, the old one gone
    assert [r.name for r in results] == ["kernel", "initramfs"]
    assert sorted(tree(out / "kernel")) == [
        "kernel-amd64",
        "kernel-arm64",
        "manifest.json",
        "provenance.intoto.json",
        "sbom-amd64.cdx.json",
        "sbom-amd64.spdx.json",
        "sbom-arm64.cdx.json",
        "sbom-arm64.spdx.json",
    ]
    assert sorted(tree(out / "initramfs")) == [
        "initramfs-amd64.zst",
        "initramfs-arm64.zst",
        "manifest.json",
        "provenance.intoto.json",
        "sbom-amd64.cdx.json",
        "sbom-amd64.spdx.json",
        "sbom-arm64.cdx.json",
        "sbom-arm64.spdx.json",
    ]
    assert (out / "kernel/kernel-arm64").read_bytes() == (inputs / "vmlinuz-arm64").read_bytes()
    assert [t.platform for t in times] == PLATFORMS
    assert "linux/arm64: writing images" in said and "arm64: kernel: writing kernel output" in said
    assert any(line.startswith("linux/amd64: ") and "(packages 0.0 s, images " in line for line in said)

    manifest = json.loads((out / "kernel/manifest.json").read_text())
    assert sorted(manifest) == ["artifacts", "inputs", "platforms", "profile"]
    assert manifest["profile"] == {
        "arches": ["amd64", "arm64"],
        "kind": "kernel",
        "name": "kernel",
        "platform": "metal",
        "version": "0.1.0",
    }
    amd = {"path": "kernel-amd64", "arch": "amd64"}
    arm = {"path": "kernel-arm64", "arch": "arm64"}
    assert [{k: a[k] for k in ("path", "arch")} for a in manifest["artifacts"]] == [amd, arm]
    assert manifest["artifacts"] == results[0].artifacts
    assert sorted(manifest["platforms"]) == PLATFORMS
    assert manifest["platforms"]["linux/arm64"]["cmdline"] == "console=ttyAMA0 kiln.platform=metal"
    assert manifest["platforms"]["linux/amd64"]["cmdline"] == "console=ttyS0 kiln.platform=metal"
    # the inputs every platform shares; the rest per platform
    assert sorted(manifest["inputs"]) == ["initramfs_sha256", "packages", "profile_sha256", "source_date_epoch"]
    # one provenance over the merged directory: its files as subjects, both platforms as parameters
    provenance = json.loads((out / "kernel/provenance.intoto.json").read_text())
    subjects = [subject["name"] for subject in provenance["subject"]]
    assert subjects == sorted(set(tree(out / "kernel")) - {"provenance.intoto.json"})
    assert provenance["predicate"]["buildDefinition"]["externalParameters"]["platforms"] == PLATFORMS
    sbom = json.loads((out / "kernel/sbom-arm64.spdx.json").read_text())
    assert sbom["name"] == "kiln-kernel-0.1.0"

    # Each arch's files are the bytes a single-platform run writes, under its name.
    for part in platform_builds(profiles, graphs):
        single = make_images(part.profiles, part.built, tmp_path / part.arch, 1, lambda _: None)
        for result in single:
            for artifact in result.artifacts:
                named = arch_name(artifact["path"], part.arch)
                assert tree(out / result.profile.name)[named] == artifact["sha256"]

    # The same inputs again: the same bytes.
    again, _ = make_platform_images(platform_builds(profiles, graphs), tmp_path / "again", 2, lambda _: None)
    assert outputs(tmp_path / "again/kernel") == outputs(out / "kernel")
    assert again[1].artifacts == results[1].artifacts


def test_a_signed_profile_gets_one_sha256sums_over_both_platforms(tmp_path: Path, graphs: dict[str, Graph]) -> None:
    """Each platform's run signs its own directory; the merged one is signed once, over the merged names."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kiln.signing.release import verify_directory

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (keys / "release.key").write_bytes(pem)
    (keys / "release.key").chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (keys / "release.pub").write_bytes(public)
    profile = per_arch_profile(tmp_path / "inputs", "kernel")
    profile.write_text(profile.read_text() + f"keys: {{path: {keys}}}\n")
    out = tmp_path / "out"
    make_platform_images(platform_builds([profile], graphs), out, 1, lambda _: None)
    assert "SHA256SUMS-amd64" not in tree(out / "kernel")
    assert sorted(verify_directory(out / "kernel", keys / "release.pub")) == [
        "kernel-amd64",
        "kernel-arm64",
        "manifest.json",
        "sbom-amd64.cdx.json",
        "sbom-amd64.spdx.json",
        "sbom-arm64.cdx.json",
        "sbom-arm64.spdx.json",
    ]


def fake_single_output(directory: Path, arch: str, files: dict[str, bytes], kind: str) -> Path:
    """A profile's single-platform directory as make_images leaves it: files, manifest.json, the SBOM."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    (directory / "sbom.spdx.json").write_text(f'{{"sbom": "{arch}"}}')
    identity = {"name": "p", "arch": arch, "platform": "metal", "version": "1.0.0", "kind": kind}
    write_manifest(directory, identity, {"cmdline": f"console for {arch}", "source_date_epoch": EPOCH})
    return directory


def test_files_that_name_each_other_stay_together(tmp_path: Path) -> None:
    made = {
        "linux/amd64": fake_single_output(
            tmp_path / "a", "amd64", {"vmlinuz": b"k", "initramfs.zst": b"i", "boot.ipxe": b"x"}, "pxe"
        ),
        "linux/arm64": fake_single_output(
            tmp_path / "b", "arm64", {"vmlinuz": b"K", "grub.cfg": b"g", "bootaa64.efi": b"e"}, "pxe"
        ),
    }
    listed = merge_profile("p", "pxe", made, tmp_path / "out")
    assert [(a["path"], a["arch"]) for a in listed] == [
        ("pxe-amd64/boot.ipxe", "amd64"),
        ("pxe-amd64/initramfs.zst", "amd64"),
        ("pxe-amd64/vmlinuz", "amd64"),
        ("pxe-arm64/bootaa64.efi", "arm64"),
        ("pxe-arm64/grub.cfg", "arm64"),
        ("pxe-arm64/vmlinuz", "arm64"),
    ]
    assert (tmp_path / "out/pxe-arm64/vmlinuz").read_bytes() == b"K"
    assert json.loads((tmp_path / "out/sbom-arm64.spdx.json").read_text()) == {"sbom": "arm64"}
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["inputs"] == {"source_date_epoch": EPOCH}
    assert manifest["platforms"]["linux/arm64"] == {"cmdline": "console for arm64", "source_date_epoch": EPOCH}


def test_a_name_taken_twice_is_refused(tmp_path: Path) -> None:
    made = {
        "linux/amd64": fake_single_output(tmp_path / "a", "amd64", {"x-amd64.raw": b"a", "x.raw": b"b"}, "image"),
        "linux/arm64": fake_single_output(tmp_path / "b", "arm64", {"x.raw": b"c"}, "image"),
    }
    with pytest.raises(BuildError, match=r"the amd64 output x\.raw would be named x-amd64\.raw, which is taken"):
        merge_profile("p", "image", made, tmp_path / "out")


# --- an installer for both arches: one image index ---------------------------------------------------------------


def installer_outputs(base: Path) -> dict[str, Path]:
    """Two single-platform installer directories (the layout `installer/` and `installer.tar`)."""
    made = {}
    for arch in ("amd64", "arm64"):
        layout, tar = make_layout(base / f"layout-{arch}", version="1.4.0", arch=arch)
        files: dict[str, bytes] = {}
        directory = base / f"single-{arch}"
        directory.mkdir(parents=True)
        shutil.copytree(layout, directory / "installer")
        shutil.copyfile(tar, directory / "installer.tar")
        made[f"linux/{arch}"] = fake_single_output(directory, arch, files, "installer")
    return made


def index_of(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "index.json").read_bytes()))


def test_an_installer_gets_one_index_over_both_arches(tmp_path: Path) -> None:
    listed = merge_profile("installer", "installer", installer_outputs(tmp_path / "one"), tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "installer-amd64",
        "installer-amd64.tar",
        "installer-arm64",
        "installer-arm64.tar",
        "installer-index.tar",
        "installer-oci",
        "manifest.json",
        "sbom-amd64.spdx.json",
        "sbom-arm64.spdx.json",
    ]
    index = index_of(out / "installer-oci")
    assert index["mediaType"] == INDEX_TYPE and index["schemaVersion"] == 2
    assert [(m["mediaType"], m["platform"]) for m in index["manifests"]] == [
        (MANIFEST_TYPE, {"architecture": "amd64", "os": "linux"}),
        (MANIFEST_TYPE, {"architecture": "arm64", "os": "linux"}),
    ]
    for arch, entry in zip(("amd64", "arm64"), index["manifests"], strict=True):
        assert entry == index_of(out / f"installer-{arch}")["manifests"][0]  # the same manifest, by digest

    # Blobs by digest, once: the union of both images' blobs, those they share (the disk layer) once.
    wanted: set[str] = set()
    for arch in ("amd64", "arm64"):
        wanted |= {p.name for p in (out / f"installer-{arch}/blobs/sha256").iterdir()}
    stored = {p.name for p in (out / "installer-oci/blobs/sha256").iterdir()}
    assert stored == wanted
    assert len(stored) < 2 * len(list((out / "installer-amd64/blobs/sha256").iterdir()))

    with tarfile.open(out / "installer-index.tar") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and "index.json" in names and "oci-layout" in names
    assert "manifest.json" not in names  # no docker-archive: docker load takes the single-arch tarballs
    assert {(m.uid, m.gid, m.mtime, m.uname) for m in members} == {(0, 0, EPOCH, "")}
    assert {n.removeprefix("blobs/sha256/") for n in names if n.startswith("blobs/sha256/")} == stored

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["artifacts"] == listed
    no_arch = sorted({a["path"].split("/")[0] for a in listed if "arch" not in a})
    assert no_arch == ["installer-index.tar", "installer-oci"]
    by_path = {a["path"]: a for a in listed}
    assert by_path["installer-arm64.tar"]["arch"] == "arm64"
    assert by_path["installer-amd64/index.json"]["arch"] == "amd64"

    # What `kiln release push` reads: two releases of one version, from the directory and the tarball.
    for source in (out / "installer-oci", out / "installer-index.tar"):
        with open_layout(source) as layout:
            releases = read_releases(layout)
            assert [(r.architecture, r.version.text) for r in releases] == [("amd64", "1.4.0"), ("arm64", "1.4.0")]

    # The same inputs give the same bytes.
    merge_profile("installer", "installer", installer_outputs(tmp_path / "two"), tmp_path / "again")
    assert outputs(tmp_path / "again") == outputs(out)


def test_the_cli_writes_both_platforms_and_says_how_long_each_took(
    kiln: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kiln image PROFILE --platform linux/amd64,linux/arm64 [--json]` end to end (nothing to build: the
    kernel and initramfs are files)."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    per_arch_profile(tmp_path, "kernel", "k")
    both = ("--platform", "linux/amd64,linux/arm64", "--pkgs", str(ROOT / "pkgs"))
    result = kiln("image", "k.yaml", *both, "--out", "out")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("k: out/k/ (linux/amd64 ") and ", linux/arm64 " in lines[0]
    assert "  amd64  kernel-amd64  " in lines[1] and "  arm64  kernel-arm64  " in lines[2]
    assert lines[3].startswith("linux/amd64: ") and "(packages " in lines[3] and lines[4].startswith("linux/arm64: ")
    assert lines[5] == "checksums of every artifact in out/: out/SHA256SUMS"
    assert "linux/arm64: packages ready in " in result.err
    # one SHA256SUMS at the top of --out: every artifact, manifest and SBOM, checked by coreutils itself
    listed = [line.split("  ", 1)[1] for line in (tmp_path / "out/SHA256SUMS").read_text().splitlines()]
    assert listed == [
        "k/kernel-amd64",
        "k/kernel-arm64",
        "k/manifest.json",
        "k/sbom-amd64.cdx.json",
        "k/sbom-amd64.spdx.json",
        "k/sbom-arm64.cdx.json",
        "k/sbom-arm64.spdx.json",
    ]
    checked = subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=tmp_path / "out", capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "out/k/kernel-arm64").write_bytes(b"changed")
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "out", capture_output=True).returncode

    result = kiln("image", "k.yaml", *both, "--out", "out", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert list(summary) == ["k"]
    assert sorted(summary["k"]["platforms"]) == PLATFORMS
    assert [(a["path"], a["arch"]) for a in summary["k"]["artifacts"]] == [
        ("kernel-amd64", "amd64"),
        ("kernel-arm64", "arm64"),
    ]
    assert summary["k"]["artifacts"] == json.loads((tmp_path / "out/k/manifest.json").read_text())["artifacts"]

    # One platform: the single-platform layout, as before.
    result = kiln("image", "k.yaml", "--platform", "linux/arm64", "--pkgs", str(ROOT / "pkgs"), "--out", "one")
    assert result.code == 0, result.err
    assert sorted(p.name for p in (tmp_path / "one/k").iterdir()) == [
        "kernel-arm64",
        "manifest.json",
        "provenance.intoto.json",
        "sbom.cdx.json",
        "sbom.spdx.json",
    ]
    assert json.loads((tmp_path / "one/k/manifest.json").read_text())["profile"]["arch"] == "arm64"
