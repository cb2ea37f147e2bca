"""End-to-end: the installer image installs the real disk image, and the installed disk boots.

The kernel + initramfs are conftest's `image_dir` (built through the graph) and the disk image is
build_raw's, so what boots is the real system. Only the installer's own /usr/bin/installer is
machined built with the host's `go build` (CGO_ENABLED=0): the same source as the image's machined,
which is the one that boots. The installer tarball is `docker load`ed into the real engine and run
as documented (`docker run --rm --privileged -v /dev:/dev ... install --disk /dev/loopN`) onto a loop
device over an empty disk file twice the image's size; the file then boots under SeaBIOS, and
machined must move the backup GPT to the disk's end and put STATE and EPHEMERAL in the free space.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln import __version__
from kiln.boot.qemu import READY, boot, machine_for
from kiln.image.assets import BootAssets
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.installer import build_installer, image_tag
from tests.integration import services
from tests.integration.test_installer import build_machined, docker, run_installer, table_dump

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
EPOCH = 1704067200
IMAGE_SIZE = 1 << 30
DISK_SIZE = 2 << 30


@pytest.fixture(scope="module")
def installer(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The installer image loaded into the engine; yields its reference and the raw image it holds."""
    if shutil.which("docker") is None or docker("version", check=False).returncode != 0:
        services.unavailable("a Docker engine", "run scripts/ci-services.sh (it starts dockerd)")
    work = tmp_path_factory.mktemp("installer")
    assets = BootAssets.make(image_dir / "vmlinuz", image_dir / "initramfs.zst", "console=ttyS0", __version__, EPOCH)
    raw = build_raw(assets, work / "disk.raw", IMAGE_SIZE)
    _, tar = build_installer(assets, raw, build_machined(work), work / "out", "installer")
    print(f"installer.tar: {tar.stat().st_size / (1 << 20):.1f} MiB")
    reference = f"kiln-installer:{image_tag(__version__)}"
    assert f"Loaded image: {reference}" in docker("load", "-i", str(tar)).stdout
    yield reference, raw
    docker("rmi", "-f", reference, check=False)


def test_installed_disk_boots(installer: tuple[str, Path], tmp_path: Path) -> None:
    reference, raw = installer
    disk = tmp_path / "installed.raw"
    with services.loop_device(disk, DISK_SIZE) as device:
        result = run_installer(reference, device)
    assert result.returncode == 0, result.stdout + result.stderr
    assert table_dump(disk) == table_dump(raw)

    log = tmp_path / "boot.log"
    booted = boot(machine_for(disk), READY, BOOT_TIMEOUT, log)
    assert booted.ok, f"{booted.reason}; console:\n" + "\n".join(booted.tail)
    text = log.read_text(errors="replace")
    assert f"Kiln {__version__}" in text, "GRUB's Kiln menu entry never showed"
    assert "disk: using /dev/vda" in text, "machined did not take the installed disk"
    assert "disk: created EPHEMERAL on /dev/vda" in text, "machined did not partition the free space"
    assert booted.line is not None and "var=/dev/vda" in booted.line, f"/var is not on the disk: {booted.line}"
    print(f"installed disk: ready after {booted.seconds:.1f} s")
