"""End-to-end, arm64: cross-built on this amd64 host, booted in qemu-system-aarch64 (TCG, AAVMF).

Nothing is stubbed. `kiln image --platform linux/arm64` builds the arm64 packages through the
graph (the cross seed, toolchain-seed as a cross toolchain, the kernel from config-arm64, the
userland, init and machined with GOARCH=arm64) and writes the metal disk, the ISO, the PXE
directory and the installer. Each boots through AAVMF and GRUB's arm64-efi build to the ready line;
the installer container (an arm64 image, run by the Docker engine through qemu-user's binfmt
handler) writes a disk that boots; a second assembly gives the same bytes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.boot.qemu import READY, boot, machine_for
from kiln.boot.unpack import uncompressed
from kiln.image.outputs.installer import image_tag
from tests.e2e.conftest import kiln
from tests.integration import services
from tests.integration.test_installer import docker, run_installer, table_dump

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
PROFILES = ("metal", "iso", "pxe", "installer")
# The cloud profiles that offer arm64 machines: assembled, compared, and nocloud booted.
CLOUDS = ("aws", "gcp", "azure", "hcloud", "openstack", "nocloud")
DISK_SIZE = 2 << 30


@pytest.fixture(scope="module")
def arm64_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arm64 kernel + initramfs (the first arm64 test builds the arm64 packages: cold, 20+ minutes)."""
    out = tmp_path_factory.mktemp("arm64-kernel")
    kiln("image", "--platform", "linux/arm64", "--kind", "kernel,initramfs", "--out", str(out), timeout=5400)
    return out


@pytest.fixture(scope="module")
def arm64_profiles(tmp_path_factory: pytest.TempPathFactory, arm64_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("arm64-profiles")
    kiln("image", *PROFILES, *CLOUDS, "--platform", "linux/arm64", "--out", str(out), timeout=3600)
    return out


def manifest(directory: Path) -> dict[str, object]:
    return dict(json.loads((directory / "manifest.json").read_text()))


def only_artifact(directory: Path, suffix: str) -> Path:
    found = [a["path"] for a in manifest(directory)["artifacts"] if str(a["path"]).endswith(suffix)]  # type: ignore[attr-defined]
    assert len(found) == 1, f"{directory}: expected one {suffix} artifact, got {found}"
    return directory / str(found[0])


def boot_to_ready(artifact: Path, log: Path, **options: object) -> str:
    machine = machine_for(artifact)
    assert machine.arch == "arm64", f"{artifact} was not recognised as arm64"
    for name, value in options.items():
        setattr(machine, name, value)
    booted = boot(machine, READY, BOOT_TIMEOUT, log)
    assert booted.ok, f"{artifact}: {booted.reason}; console:\n" + "\n".join(booted.tail)
    assert booted.line is not None
    print(f"{artifact.name}: ready after {booted.seconds:.1f} s")
    return log.read_text(errors="replace")


def test_arm64_kernel_and_initramfs_boot(arm64_dir: Path, tmp_path: Path) -> None:
    text = boot_to_ready(arm64_dir, tmp_path / "console.log")
    assert "Booting Linux on physical CPU" in text, "not an arm64 kernel's banner"
    banner = next(line for line in text.splitlines() if "Linux version" in line)
    assert "aarch64-linux-gnu-gcc" in banner or "aarch64-kiln-linux-musl-gcc" in banner, banner


@pytest.mark.parametrize(("profile", "suffix"), [("metal", ".raw.zst"), ("iso", ".iso")])
def test_arm64_disk_and_iso_boot_through_grub(arm64_profiles: Path, tmp_path: Path, profile: str, suffix: str) -> None:
    """The shipped metal disk is zstd-compressed: unpacked as `kiln boot` unpacks it (boot.unpack)."""
    artifact = uncompressed(only_artifact(arm64_profiles / profile, suffix), tmp_path)
    text = boot_to_ready(artifact, tmp_path / "console.log")  # the unpacked disk's arch: from its contents
    assert "Kiln" in text, "GRUB's Kiln menu entry never showed"
    assert "ttyAMA0" in text


def test_arm64_pxe_boots_over_tftp(arm64_profiles: Path, tmp_path: Path) -> None:
    pxe = arm64_profiles / "pxe"
    assert (pxe / "bootaa64.efi").is_file()
    text = boot_to_ready(pxe, tmp_path / "console.log")
    assert "Booting Linux on physical CPU" in text


def test_the_arm64_nocloud_image_boots_on_its_platform(arm64_profiles: Path, tmp_path: Path) -> None:
    text = boot_to_ready(only_artifact(arm64_profiles / "nocloud", ".raw"), tmp_path / "console.log")
    ready = next(line for line in text.splitlines() if line.startswith("machined ready:"))
    assert ready.endswith("platform=nocloud"), ready


def test_arm64_outputs_are_reproducible(arm64_profiles: Path, tmp_path: Path) -> None:
    """The arm64 profiles assembled again give the same bytes. The clouds' disks differ from metal's
    only in their command line and in format and compression code that is not per arch, which the
    amd64 profiles' two runs check (tests/e2e/test_profiles_outputs.py): not assembled a third time."""
    again = tmp_path / "again"
    kiln("image", *PROFILES, "--platform", "linux/arm64", "--out", str(again), timeout=3600)
    for profile in PROFILES:
        first, second = manifest(arm64_profiles / profile), manifest(again / profile)
        assert first["artifacts"] == second["artifacts"], f"{profile}: the two assemblies differ"
        assert first["inputs"] == second["inputs"]


@pytest.fixture(scope="module")
def arm64_installer(arm64_profiles: Path) -> Iterator[str]:
    if shutil.which("docker") is None or docker("version", check=False).returncode != 0:
        services.unavailable("a Docker engine", "run scripts/ci-services.sh (it starts dockerd)")
    tar = only_artifact(arm64_profiles / "installer", ".tar")
    loaded = docker("load", "-i", str(tar)).stdout
    reference = loaded.rsplit("Loaded image: ", 1)[-1].strip()
    assert reference.endswith(":" + image_tag(str(manifest(arm64_profiles / "installer")["profile"]["version"])))  # type: ignore[index]
    assert docker("image", "inspect", "-f", "{{.Architecture}}", reference).stdout.strip() == "arm64"
    yield reference
    docker("rmi", "-f", reference, check=False)


def test_the_arm64_installer_writes_a_disk_that_boots(arm64_installer: str, tmp_path: Path) -> None:
    disk = tmp_path / "installed.raw"
    with services.loop_device(disk, DISK_SIZE) as device:
        result = run_installer(arm64_installer, device)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any("EFI" in line for line in table_dump(disk))
    text = boot_to_ready(disk, tmp_path / "console.log", arch="arm64")
    assert "disk: using /dev/vda" in text, "machined did not take the installed disk"
