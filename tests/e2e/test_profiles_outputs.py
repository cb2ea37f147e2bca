"""Every shipped profile through `kiln image`, twice: the same bytes, the right formats, a manifest and an SBOM.

Both runs use the same package outputs from the store (building the kernel twice would take
half an hour here); everything the imager derives from them (rootfs, initramfs, ISO, disks,
every format and compression, the installer image) is made from scratch in each run.
"""

from __future__ import annotations

import json
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.e2e.conftest import PROFILES, kiln

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory, every_profile: Path) -> tuple[Path, Path]:
    """All profiles written twice: the session's run, and one more with one job."""
    second = tmp_path_factory.mktemp("second")
    kiln("image", *PROFILES, "--out", str(second), "--jobs", "1", timeout=3600)
    return every_profile, second


def manifest(directory: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((directory / "manifest.json").read_text())
    return data


def info(path: Path, fmt: str | None = None) -> dict[str, object]:
    command = ["qemu-img", "info", "--output=json", *(["-f", fmt] if fmt else []), str(path)]
    data: dict[str, object] = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return data


def test_every_artifact_is_byte_identical_across_runs(two_runs: tuple[Path, Path]) -> None:
    first, second = two_runs
    for name in PROFILES:
        a, b = manifest(first / name), manifest(second / name)
        assert a["artifacts"], f"{name} wrote nothing"
        assert a["artifacts"] == b["artifacts"], f"{name} differs between runs"
        assert (first / name / "sbom.spdx.json").read_bytes() == (second / name / "sbom.spdx.json").read_bytes()


def test_manifests_name_inputs_and_the_sbom_lists_the_rootfs(two_runs: tuple[Path, Path]) -> None:
    first, _ = two_runs
    data = manifest(first / "metal")
    inputs = data["inputs"]
    assert isinstance(inputs, dict)
    assert {"kernel", "init", "machined", "kmod"} <= set(inputs["packages"])
    assert "kiln.platform=metal" in inputs["cmdline"]
    sbom = json.loads((first / "metal" / "sbom.spdx.json").read_text())
    assert {"kernel", "machined", "util-linux", "e2fsprogs"} <= {p["name"] for p in sbom["packages"]}


def test_cloud_formats(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    first, _ = two_runs
    assert info(first / "openstack/openstack-amd64.qcow2")["format"] == "qcow2"
    assert info(first / "nocloud/nocloud-amd64.raw", "raw")["virtual-size"] == 1 << 30
    assert info(first / "vultr/vultr-amd64.raw", "raw")["virtual-size"] == 1 << 30
    # azure: a fixed VHD, whole MiB, footer cookie and disk type 2 (fixed)
    vhd = first / "azure/azure-amd64.vhd"
    assert info(vhd, "vpc")["format"] == "vpc"
    footer = vhd.read_bytes()[-512:]
    assert footer[:8] == b"conectix"
    assert struct.unpack(">I", footer[60:64])[0] == 2
    assert (vhd.stat().st_size - 512) % (1 << 20) == 0
    # vmware: an OVA (tar) holding the OVF descriptor first, then a streamOptimized VMDK
    with tarfile.open(first / "vmware/vmware-amd64.ova") as ova:
        names = ova.getnames()
        assert names[0].endswith(".ovf") and any(n.endswith(".vmdk") for n in names)
        ova.extractall(tmp_path, filter="data")
    vmdk = next(tmp_path.glob("*.vmdk"))
    assert info(vmdk, "vmdk")["format-specific"]["data"]["create-type"] == "streamOptimized"  # type: ignore[index]
    # gcp: disk.raw as the only member of a GNU tar, gzip-compressed
    with tarfile.open(first / "gcp/gcp-amd64.raw.tar.gz") as tar:
        assert tar.getnames() == ["disk.raw"]
        assert tar.getmember("disk.raw").size == 1 << 30
    # aws, digital-ocean, hcloud: compressed raw disks holding the GPT
    for path, tool in (
        (first / "aws/aws-amd64.raw.zst", "zstd"),
        (first / "metal/metal-amd64.raw.zst", "zstd"),
        (first / "digital-ocean/digital-ocean-amd64.raw.gz", "gzip"),
        (first / "hcloud/hcloud-amd64.raw.xz", "xz"),
    ):
        head = subprocess.run(f"{tool} -dc {path} | head -c 1024", shell=True, capture_output=True).stdout
        assert head[512:520] == b"EFI PART", path


def test_iso_pxe_and_installer_outputs(two_runs: tuple[Path, Path]) -> None:
    first, _ = two_runs
    assert (first / "iso/metal-amd64.iso").stat().st_size > 0
    assert {p.name for p in (first / "pxe").iterdir()} >= {"vmlinuz", "initramfs.zst", "boot.ipxe"}
    installer = {p.name for p in (first / "installer").iterdir()}
    assert {"installer-amd64.tar", "installer-amd64"} <= installer


# Each shipped profile's top-level artifacts: `<platform>-<arch>.<format>[.<compression>]`, as the
# peers name theirs (the PXE files name each other, so they keep the names the iPXE script loads).
GOLDEN_NAMES = {
    "aws": ["aws-amd64.raw.zst"],
    "azure": ["azure-amd64.vhd"],
    "digital-ocean": ["digital-ocean-amd64.raw.gz"],
    "gcp": ["gcp-amd64.raw.tar.gz"],
    "hcloud": ["hcloud-amd64.raw.xz"],
    "installer": ["installer-amd64", "installer-amd64.tar"],
    "iso": ["metal-amd64.iso"],
    "metal": ["metal-amd64.raw.zst"],
    "nocloud": ["nocloud-amd64.raw"],
    "openstack": ["openstack-amd64.qcow2"],
    "pxe": ["boot.ipxe", "initramfs.zst", "vmlinuz"],
    "vmware": ["vmware-amd64.ova"],
    "vultr": ["vultr-amd64.raw"],
}


def test_artifact_names_and_one_sha256sums_over_the_release(two_runs: tuple[Path, Path]) -> None:
    first, second = two_runs
    assert sorted(GOLDEN_NAMES) == sorted(PROFILES)
    for name, expected in GOLDEN_NAMES.items():
        top = sorted({str(a["path"]).split("/")[0] for a in manifest(first / name)["artifacts"]})  # type: ignore[attr-defined]
        assert top == expected, name
    sums = (first / "SHA256SUMS").read_text()
    listed = {line.split("  ", 1)[1] for line in sums.splitlines()}
    assert {"metal/metal-amd64.raw.zst", "gcp/gcp-amd64.raw.tar.gz", "iso/manifest.json"} <= listed
    assert {f"{p}/sbom.cdx.json" for p in PROFILES} | {f"{p}/sbom.spdx.json" for p in PROFILES} <= listed
    checked = subprocess.run(["sha256sum", "--strict", "--quiet", "-c", "SHA256SUMS"], cwd=first, capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sums == (second / "SHA256SUMS").read_text()  # the release's checksums are reproducible too
    # each directory's provenance records when it ran: present, and never among what is compared
    assert all((first / p / "provenance.intoto.json").is_file() for p in PROFILES)
    assert "provenance.intoto.json" not in sums
