"""The installer OCI image and `machined install`, with the real Docker engine, loop devices and sfdisk.

Stand-ins (their subject here is format and install, not booting): the "disk image" is a GPT
made with the real sfdisk holding partitions named EFI, BIOS, BOOT and META filled with fake,
recognisable bytes (no GRUB, no filesystems); vmlinuz and initramfs.zst are small fake files;
machined is built from runtime/machined with the host's `go build` (CGO_ENABLED=0, static).
tests/e2e/test_installer_boot.py installs the real image and boots it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.core.errors import BuildError, InputError
from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import build_installer, gzip_with_size, image_tag
from kiln.installer.install import install_disk
from tests.integration import services

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
IMAGE_SIZE = 64 * MIB
TARGET_SIZE = 96 * MIB
EPOCH = 1700000000
VERSION = "0.1.0-test+g1234"
STAND_IN_TABLE = """label: gpt
label-id: 3F1C2B6A-0000-4000-8000-000000000001
start=2048, size=20480, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=EFI
size=2048, type=21686148-6449-6E6F-744E-656564454649, name=BIOS
size=40960, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=BOOT
size=2048, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=META
"""


def build_machined(out: Path) -> Path:
    go = shutil.which("go")
    if go is None:
        services.unavailable("go", "apt-get install golang-go (scripts/setup-host.sh does)")
    assert go is not None
    binary = out / "machined"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath"}
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=ROOT / "runtime/machined", env=env, check=True)
    return binary


def partitions(disk: Path) -> list[dict[str, object]]:
    table = json.loads(
        subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True, text=True, check=True).stdout
    )
    return list(table["partitiontable"]["partitions"])


def stand_in_disk(path: Path) -> Path:
    """A 64 MiB GPT image with EFI, BIOS, BOOT and META, each partition full of its own fake bytes."""
    with path.open("wb") as out:
        out.truncate(IMAGE_SIZE)
    subprocess.run(["sfdisk", "--quiet", str(path)], input=STAND_IN_TABLE, text=True, check=True)
    with path.open("r+b") as out:
        for part in partitions(path):
            out.seek(int(str(part["start"])) * 512)
            out.write(f"fake {part['name']} content ".encode() * 1000)
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[BootAssets, Path, Path]:
    base = tmp_path_factory.mktemp("installer-inputs")
    vmlinuz, initramfs = base / "vmlinuz", base / "initramfs.zst"
    vmlinuz.write_bytes(b"fake kernel " * 1000)
    initramfs.write_bytes(b"fake initramfs " * 1000)
    assets = BootAssets.make(vmlinuz, initramfs, "console=ttyS0", VERSION, EPOCH)
    return assets, stand_in_disk(base / "disk.raw"), build_machined(base)


@pytest.fixture(scope="module")
def built(inputs: tuple[BootAssets, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    assets, disk, machined = inputs
    return build_installer(assets, disk, machined, tmp_path_factory.mktemp("installer-out"), "installer")


def blob(layout: Path, descriptor: dict[str, object], media_type: str) -> bytes:
    """A blob's bytes, checked against its descriptor's digest, size and media type."""
    assert descriptor["mediaType"] == media_type
    digest = str(descriptor["digest"])
    assert digest.startswith("sha256:")
    data = (layout / "blobs/sha256" / digest.removeprefix("sha256:")).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest.removeprefix("sha256:")
    assert len(data) == descriptor["size"]
    return data


def test_oci_layout_is_valid(built: tuple[Path, Path], inputs: tuple[BootAssets, Path, Path]) -> None:
    assets, disk, machined = inputs
    layout, _ = built
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    [entry] = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == f"kiln-installer:{image_tag(VERSION)}"
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(blob(layout, entry, "application/vnd.oci.image.manifest.v1+json"))
    config = json.loads(blob(layout, manifest["config"], "application/vnd.oci.image.config.v1+json"))
    assert config["created"] == "2023-11-14T22:13:20Z"  # EPOCH
    assert all(h["created"] == config["created"] for h in config["history"])
    assert config["config"]["Entrypoint"] == ["/usr/bin/installer"]
    files: dict[str, bytes] = {}
    diff_ids = []
    for layer in manifest["layers"]:
        data = blob(layout, layer, "application/vnd.oci.image.layer.v1.tar+gzip")
        assert data[4:8] == b"\0\0\0\0"  # gzip MTIME 0 (and FLG 0: no name)
        assert data[3] == 0
        tar_bytes = gzip.decompress(data)
        diff_ids.append("sha256:" + hashlib.sha256(tar_bytes).hexdigest())
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == sorted(m.name for m in members)
            for m in members:
                assert (m.uid, m.gid, m.mtime) == (0, 0, EPOCH), m.name
                if m.isfile():
                    extracted = tar.extractfile(m)
                    assert extracted is not None
                    files[m.name] = extracted.read()
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    roles = [layer["annotations"]["dev.kiln.layer"] for layer in manifest["layers"]]
    assert roles == ["kernel", "boot", "disk", "installer"]  # an upgrade pulls all but "disk"
    assert json.loads(files["usr/share/kiln/release.json"]) == {
        "architecture": "amd64",
        "cmdline": assets.cmdline,
        "version": VERSION,
    }
    assert files["usr/bin/installer"] == machined.read_bytes()
    assert files["usr/share/kiln/vmlinuz"] == assets.vmlinuz.read_bytes()
    assert files["usr/share/kiln/initramfs.zst"] == assets.initramfs.read_bytes()
    packed = files["usr/share/kiln/disk.raw.gz"]
    assert gzip.decompress(packed) == disk.read_bytes()
    assert packed[12:24] == b"KS\x08\x00" + IMAGE_SIZE.to_bytes(8, "little")  # the size machined reads


def test_two_builds_give_identical_bytes(
    built: tuple[Path, Path], inputs: tuple[BootAssets, Path, Path], tmp_path: Path
) -> None:
    assets, disk, machined = inputs
    layout, tar = built
    again_layout, again_tar = build_installer(assets, disk, machined, tmp_path, "installer")
    assert again_tar.read_bytes() == tar.read_bytes()
    assert (again_layout / "index.json").read_bytes() == (layout / "index.json").read_bytes()
    with tarfile.open(tar) as archive:
        names = archive.getnames()
        assert names == sorted(names)
        assert {"oci-layout", "index.json", "manifest.json"} <= set(names)
        assert all((m.uid, m.gid, m.mtime, m.uname) == (0, 0, EPOCH, "") for m in archive.getmembers())


# --- the real engine and loop devices ------------------------------------------------------------------


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"docker {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def loaded(built: tuple[Path, Path]) -> Iterator[str]:
    """The tarball loaded into the engine with `docker load`; yields the image reference."""
    if shutil.which("docker") is None or docker("version", check=False).returncode != 0:
        services.unavailable("a Docker engine", "run scripts/ci-services.sh (it starts dockerd)")
    _, tar = built
    reference = f"kiln-installer:{image_tag(VERSION)}"
    out = docker("load", "-i", str(tar)).stdout
    assert f"Loaded image: {reference}" in out
    yield reference
    docker("rmi", "-f", reference, check=False)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An empty 96 MiB disk file attached to a loop device (with partition scanning)."""
    backing = tmp_path / "target.img"
    with services.loop_device(backing, TARGET_SIZE) as device:
        yield device, backing


# `--privileged` asks for every capability; where the engine itself runs without one (this project's
# development VMs lack CAP_SYS_RESOURCE), runc refuses with this, and the run is retried as privileged
# minus that capability: every other capability, all block devices, no seccomp filter.
NO_PRIVILEGED = "unable to apply caps: operation not permitted"
ALMOST_PRIVILEGED = [
    "--cap-add",
    "ALL",
    "--cap-drop",
    "SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--device-cgroup-rule",
    "b *:* rwm",
]


def run_installer(reference: str, device: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The documented command: docker run --rm --privileged -v /dev:/dev IMAGE install --disk DEVICE."""
    command = ["-v", "/dev:/dev", reference, "install", "--disk", device, *extra]
    result = docker("run", "--rm", "--privileged", *command, check=False)
    if result.returncode == 125 and NO_PRIVILEGED in result.stderr:
        result = docker("run", "--rm", *ALMOST_PRIVILEGED, *command, check=False)
    return result


def table_dump(disk: Path) -> list[str]:
    """`sfdisk -d` without what names the file (header line and the device in each partition line)."""
    out = subprocess.run(["sfdisk", "-d", str(disk)], capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if not line.startswith("device:")]
    return [line.split(":", 1)[1] if line.startswith(str(disk)) else line for line in lines]


def assert_installed(image: Path, disk: Path) -> None:
    """Same partition table and the same bytes in every partition."""
    assert table_dump(disk) == table_dump(image)
    with image.open("rb") as want, disk.open("rb") as got:
        for part in partitions(image):
            start, size = int(str(part["start"])) * 512, int(str(part["size"])) * 512
            want.seek(start)
            got.seek(start)
            assert got.read(size) == want.read(size), part["name"]


def test_docker_run_installs_onto_loop_device(
    loaded: str, loop: tuple[str, Path], inputs: tuple[BootAssets, Path, Path]
) -> None:
    device, backing = loop
    _, disk, _ = inputs
    result = run_installer(loaded, device)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "install: writing /usr/share/kiln/disk.raw.gz (gzip, 64 MiB)" in result.stdout
    assert "install: 100% (64/64 MiB)" in result.stdout
    assert f"re-read {device}'s partition table" in result.stdout
    assert_installed(disk, backing)
    assert backing.stat().st_size == TARGET_SIZE


def test_disk_with_partitions_refused_without_wipe(
    loaded: str, loop: tuple[str, Path], inputs: tuple[BootAssets, Path, Path]
) -> None:
    device, backing = loop
    _, disk, _ = inputs
    subprocess.run(
        ["sfdisk", "--quiet", device], input="label: dos\nstart=2048, size=8192, type=83\n", text=True, check=True
    )
    before = backing.read_bytes()
    refused = run_installer(loaded, device)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"install: refusing to install onto {device}: it holds an MBR partition table (dos); "
        "pass --wipe to overwrite it\n"
    )
    assert backing.read_bytes() == before
    accepted = run_installer(loaded, device, "--wipe")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "--wipe: overwriting an MBR partition table (dos)" in accepted.stdout
    assert_installed(disk, backing)


# --- on the host: kiln.installer.install runs the same binary ------------------------------------------


def test_install_disk_on_host(
    inputs: tuple[BootAssets, Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    _, disk, machined = inputs
    target = tmp_path / "disk.img"
    with target.open("wb") as out:
        out.truncate(TARGET_SIZE)
    install_disk(machined, disk, target, wipe=False)
    assert "install: done" in capfd.readouterr().out
    assert_installed(disk, target)

    with pytest.raises(InputError, match=r"holds a GPT partition table \(gpt\); pass --wipe"):
        install_disk(machined, disk, target, wipe=False)
    install_disk(machined, disk, target, wipe=True)
    assert_installed(disk, target)

    small = tmp_path / "small.img"
    with small.open("wb") as out:
        out.truncate(IMAGE_SIZE // 2)
    with pytest.raises(InputError, match="is smaller than the image"):
        install_disk(machined, disk, small, wipe=False)

    # A gzip image without the size field is inflated once before writing: corruption is a refusal.
    corrupt = tmp_path / "corrupt.raw.gz"
    packed = bytearray(gzip.compress(disk.read_bytes(), mtime=0))
    packed[-8] ^= 0xFF  # the CRC32: the data inflates, the check fails
    corrupt.write_bytes(bytes(packed))
    with pytest.raises(InputError, match="invalid checksum"):
        install_disk(machined, corrupt, target, wipe=True)
    # With oci.gzip_with_size's size field the write starts at once; corruption found at the end is
    # a failed install (exit 1).
    sized = tmp_path / "sized.raw.gz"
    gzip_with_size(disk, sized)
    packed = bytearray(sized.read_bytes())
    packed[-8] ^= 0xFF
    sized.write_bytes(bytes(packed))
    with pytest.raises(BuildError, match="invalid checksum"):
        install_disk(machined, sized, target, wipe=True)
