"""`kiln image` for two platforms at once: the ISO, the raw disk, the PXE directory and the installer for
amd64 and arm64 in one directory per profile, made with the real tools, each arch's files the bytes a
single-platform run writes, twice the same bytes, and what `kiln boot` and `kiln release push` read.

Packages: GRUB's arm64 EFI modules from pkgs/grub-efi-arm64 built through `kiln build` into a store
holding the shared test seed (as tests/integration/test_arm64_outputs.py does: it only unpacks a
.deb); machined is an ELF header standing in for each arch (the installer only reads its header).
Kernels and initramfs are stand-ins given per arch in the profiles (input.kernel.path: {amd64, arm64}).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from kiln.boot.arch import content_arch, detect
from kiln.image.imager import Built, make_images
from kiln.image.multiarch import PlatformBuild, arch_name, make_platform_images, resolve_platforms
from kiln.image.profile import load_profiles
from kiln.installer.image_layout import open_layout
from kiln.installer.release import read_releases
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.integration.conftest import ROOT
from tests.integration.test_arm64_outputs import stand_ins
from tests.unit.test_release_push import fake_static_elf

pytestmark = pytest.mark.integration

EPOCH = 1704067200
PLATFORMS = ["linux/amd64", "linux/arm64"]
PROFILE = """\
platform: metal
version: 0.3.0
input:
  kernel: {path: {amd64: vmlinuz-amd64, arm64: vmlinuz-arm64}}
  initramfs: {path: initramfs.zst}
"""
OUTPUTS = {
    "iso": "output: {kind: iso}\n",
    "metal": "output:\n  kind: image\n  image: {disk_size: 256MiB}\n",
    "pxe": "output: {kind: pxe}\n",
    "installer": "output:\n  kind: installer\n  image: {disk_size: 256MiB}\n",
}


@pytest.fixture(scope="module")
def parts(grub_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> list[PlatformBuild]:
    """The four profiles resolved for both platforms, with what each platform's graph would have built."""
    inputs = tmp_path_factory.mktemp("inputs")
    kernel, initramfs = stand_ins(inputs / "arm64")
    shutil.copyfile(kernel, inputs / "vmlinuz-arm64")
    shutil.copyfile(initramfs, inputs / "initramfs.zst")
    (inputs / "vmlinuz-amd64").write_bytes(b"amd64 kernel stand-in\n" * 4000)
    for name, output in OUTPUTS.items():
        (inputs / f"{name}.yaml").write_text(PROFILE + output)
    profiles = load_profiles([str(inputs / f"{name}.yaml") for name in OUTPUTS], inputs)
    resolved = resolve_platforms(profiles, PLATFORMS)
    built = []
    for platform in PLATFORMS:
        arch = Platform.parse(platform).arch
        machined = inputs / f"machined-{arch}/usr/sbin/machined"
        machined.parent.mkdir(parents=True)
        fake_static_elf(machined, arch)
        trees = {"machined": machined.parents[2], **({"grub-efi-arm64": grub_tree} if arch == "arm64" else {})}
        keys = {name: hashlib.sha256(f"{name} {arch}".encode()).hexdigest() for name in trees}
        graph = Graph(load_tree(ROOT / "pkgs", Platform.parse(platform)))
        built.append(PlatformBuild(platform, resolved[platform], Built(graph, trees, keys, EPOCH)))
    return built


def tree(directory: Path) -> dict[str, str]:
    """Every file's sha256, but the provenance's: it records when it was written (docs/reproducibility.md)."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).as_posix() != "provenance.intoto.json"
    }


def top(directory: Path) -> list[str]:
    return sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())


def test_both_platforms_in_one_directory_per_profile(parts: list[PlatformBuild], tmp_path: Path) -> None:
    out = tmp_path / "out"
    said: list[str] = []
    results, times = make_platform_images(parts, out, 2, said.append)
    assert [r.name for r in results] == list(OUTPUTS)
    assert [t.platform for t in times] == PLATFORMS
    assert top(out) == ["installer/", "iso/", "metal/", "pxe/"]
    sboms = [
        "manifest.json",
        "provenance.intoto.json",
        "sbom-amd64.cdx.json",
        "sbom-amd64.spdx.json",
        "sbom-arm64.cdx.json",
        "sbom-arm64.spdx.json",
    ]
    assert top(out / "iso") == ["manifest.json", "metal-amd64.iso", "metal-arm64.iso", *sboms[1:]]
    assert top(out / "metal") == ["manifest.json", "metal-amd64.raw", "metal-arm64.raw", *sboms[1:]]
    assert top(out / "pxe") == [*sboms[:2], "pxe-amd64/", "pxe-arm64/", *sboms[2:]]
    assert top(out / "pxe/pxe-arm64") == ["boot.ipxe", "bootaa64.efi", "grub.cfg", "initramfs.zst", "vmlinuz"]
    assert top(out / "pxe/pxe-amd64") == ["boot.ipxe", "initramfs.zst", "vmlinuz"]
    assert top(out / "installer") == [
        "installer-amd64.tar",
        "installer-amd64/",
        "installer-arm64.tar",
        "installer-arm64/",
        "installer-index.tar",
        "installer-oci/",
        *sboms,
    ]

    # Each arch's files: the bytes a single-platform run writes, under the arch's name.
    for part in parts:
        single = tmp_path / f"single-{part.arch}"
        for result in make_images(part.profiles, part.built, single, 2, lambda _: None):
            merged = tree(out / result.profile.name)
            for artifact in result.artifacts:
                first, sep, rest = artifact["path"].partition("/")
                named = f"pxe-{part.arch}/{artifact['path']}" if result.profile.kind == "pxe" else None
                named = named or arch_name(first, part.arch) + sep + rest
                assert merged[named] == artifact["sha256"], named

    # What `kiln boot` reads: the manifest's arch per artifact, and the artifacts' own bytes agree.
    for arch in ("amd64", "arm64"):
        for path in (f"iso/metal-{arch}.iso", f"metal/metal-{arch}.raw", f"pxe/pxe-{arch}"):
            found = detect(out / path)
            assert found is not None and found.name == arch and "manifest.json" in found.why, path
        own = content_arch(out / f"metal/metal-{arch}.raw")  # its EFI system partition's loader
        assert own is not None and own.name == arch
    manifest = json.loads((out / "metal/manifest.json").read_text())
    assert [(a["path"], a["arch"]) for a in manifest["artifacts"]] == [
        ("metal-amd64.raw", "amd64"),
        ("metal-arm64.raw", "arm64"),
    ]
    assert manifest["platforms"]["linux/arm64"]["packages"] == {"grub-efi-arm64": parts[1].built.keys["grub-efi-arm64"]}
    assert manifest["platforms"]["linux/amd64"]["packages"] == {}

    # What `kiln release push` reads from the installer's index.
    with open_layout(out / "installer/installer-index.tar") as layout:
        assert [(r.architecture, r.version.text) for r in read_releases(layout)] == [
            ("amd64", "0.3.0"),
            ("arm64", "0.3.0"),
        ]

    # Again: the same bytes, the previous directories replaced whole.
    before = {name: tree(out / name) for name in OUTPUTS}
    (out / "iso/left-over").write_text("from before")
    make_platform_images(parts, out, 2, lambda _: None)
    assert {name: tree(out / name) for name in OUTPUTS} == before
    make_platform_images(parts, tmp_path / "again", 2, lambda _: None)
    assert {name: tree(tmp_path / "again" / name) for name in OUTPUTS} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
