"""`kiln install` refuses a disk that holds data unless --wipe, and a disk in use even with --wipe.

On real loop devices, through kiln.installer.install.install_disk (what `kiln install` runs) and
one run of `kiln install` itself (kiln.cli.main, its profile build replaced by the machined built
here). Signatures come from the real tools where installed (pvcreate, mdadm, mkfs.ntfs,
mkfs.exfat, mkfs.f2fs, mkfs.ext4, mkswap, mkfs.vfat); where a tool or the kernel driver it needs
is missing, the stub tests write the signature's bytes where the tool writes them, and say so.
The image is a small GPT made with the real sfdisk; machined is built with the host's `go build`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import InputError
from kiln.installer.install import install_disk
from tests.integration import services
from tests.integration.test_installer import build_machined

pytestmark = pytest.mark.integration

MIB = 1 << 20
IMAGE_SIZE = 8 * MIB
TARGET_SIZE = 64 * MIB  # mkfs.f2fs's smallest is a little over 32 MiB


@pytest.fixture(scope="module")
def machined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_machined(tmp_path_factory.mktemp("machined"))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("image") / "disk.raw"
    with path.open("wb") as out:
        out.truncate(IMAGE_SIZE)
    subprocess.run(
        ["sfdisk", "--quiet", str(path)], input="label: gpt\nstart=2048, size=4096, name=BOOT\n", text=True, check=True
    )
    with path.open("r+b") as out:
        out.seek(2048 * 512)
        out.write(b"kiln image " * 1000)
    return path


def run(*argv: str, stdin: str | None = None) -> None:
    subprocess.run(list(argv), input=stdin, text=True, capture_output=True, check=True)


class Disk:
    """A loop device over a sparse backing file, and what to undo (md arrays, VGs, mounts, swap)."""

    def __init__(self, device: str, backing: Path, undo: contextlib.ExitStack) -> None:
        self.device, self.backing, self.undo = device, backing, undo

    def write(self, offset: int, data: bytes) -> None:
        """Bytes at offset (negative: from the end), through the device, flushed."""
        with open(self.device, "r+b", buffering=0) as dev:
            dev.seek(offset if offset >= 0 else TARGET_SIZE + offset)
            dev.write(data)
            os.fsync(dev.fileno())

    def add_partitions(self) -> str:
        """An MBR with one partition, added with partx (the kernel here may parse no table itself)."""
        run("sfdisk", "--quiet", "--no-reread", self.device, stdin="label: dos\nstart=2048, size=32768, type=83\n")
        part = f"{self.device}p1"
        if not os.path.exists(part):
            run("partx", "--add", self.device)
        self.undo.callback(subprocess.run, ["partx", "--delete", self.device], capture_output=True)
        assert os.path.exists(part), f"{part} did not appear"
        return part


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    with services.loop_device(tmp_path / "target.img", TARGET_SIZE) as device, contextlib.ExitStack() as undo:
        yield Disk(device, tmp_path / "target.img", undo)


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        services.unavailable(tool, "scripts/setup-host.sh installs it")
    assert found is not None
    return found


def refused(machined: Path, image: Path, disk: Disk, *named: str, wipe: bool = False) -> str:
    """Install must refuse with one line naming each of `named`, and write nothing."""
    before = disk.backing.read_bytes()
    with pytest.raises(InputError) as caught:
        install_disk(machined, image, Path(disk.device), wipe=wipe)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"install: refusing to install onto {disk.device}: "), message
    for what in named:
        assert what in message, message
    assert disk.backing.read_bytes() == before, "a refused install wrote to the disk"
    return message


def refused_then_wiped(machined: Path, image: Path, disk: Disk, *named: str) -> None:
    message = refused(machined, image, disk, *named)
    assert message.endswith("; pass --wipe to overwrite it"), message
    install_disk(machined, image, Path(disk.device), wipe=True)
    with disk.backing.open("rb") as got:
        assert got.read(IMAGE_SIZE) == image.read_bytes()
        got.seek(TARGET_SIZE - MIB)
        assert got.read(MIB) == bytes(MIB)


# --- real tools ------------------------------------------------------------------------------------------


def md_driver() -> bool:
    return os.path.exists("/proc/mdstat")


def make_lvm_pv(disk: Disk) -> None:
    need("pvcreate")
    disk.undo.callback(subprocess.run, ["pvremove", "-ff", "-y", disk.device], capture_output=True)
    run("pvcreate", "-q", "-ff", "-y", disk.device)


def make_md_member(disk: Disk) -> None:
    need("mdadm")
    if not md_driver():  # a kernel's make, not a missing package: skipped even in CI
        pytest.skip("no md driver in this kernel (CONFIG_BLK_DEV_MD); md_1_2_stub covers the bytes")
    array = f"/dev/md/kiln-test-{uuid.uuid4().hex[:8]}"
    run(
        "mdadm",
        "--create",
        array,
        "--run",
        "--metadata=1.2",
        "--level=1",
        "--raid-devices=2",
        "--force",
        disk.device,
        "missing",
    )
    run("mdadm", "--stop", array)  # stopped: a member with its superblock, not in use


REAL_TOOLS: dict[str, tuple[Callable[[Disk], None], str]] = {
    "LVM2_member": (make_lvm_pv, "an LVM2 physical volume (LVM2_member)"),
    "linux_raid_member": (make_md_member, "an mdraid array member"),
    "ntfs": (lambda d: run(need("mkfs.ntfs"), "--fast", "--force", "--quiet", d.device), "an NTFS filesystem (ntfs)"),
    "exfat": (lambda d: run(need("mkfs.exfat"), d.device), "an exFAT filesystem (exfat)"),
    "f2fs": (lambda d: run(need("mkfs.f2fs"), "-f", "-q", d.device), "an F2FS filesystem (f2fs)"),
    "ext4": (lambda d: run(need("mkfs.ext4"), "-q", "-F", d.device), "an ext4 filesystem (ext4)"),
    "swap": (lambda d: run(need("mkswap"), d.device), "swap space (swap)"),
    "vfat": (lambda d: run(need("mkfs.vfat"), d.device), "a FAT filesystem (vfat)"),
}


@pytest.mark.parametrize("kind", sorted(REAL_TOOLS))
def test_real_tool_signature_refused_then_wiped(kind: str, machined: Path, image: Path, disk: Disk) -> None:
    make, named = REAL_TOOLS[kind]
    make(disk)
    refused_then_wiped(machined, image, disk, named)


# --- stubbed signatures ----------------------------------------------------------------------------------

MD_1X = (0xA92B4EFC).to_bytes(4, "little") + (1).to_bytes(4, "little")
STUBS: dict[str, tuple[dict[int, bytes], str]] = {
    "md_1_2_stub": ({4096: MD_1X}, "an mdraid array member (metadata 1.x)"),
    "md_1_1_stub": ({0: MD_1X}, "an mdraid array member (metadata 1.x)"),
    "md_1_0_stub": ({-8192: MD_1X}, "an mdraid array member (metadata 1.x)"),
    "md_0_90_stub": ({-65536: (0xA92B4EFC).to_bytes(4, "little")}, "an mdraid array member (metadata 0.90)"),
    "lvm2_sector3_stub": ({1536: b"LABELONE", 1536 + 24: b"LVM2 001"}, "an LVM2 physical volume (LVM2_member)"),
    "bitlocker_stub": ({3: b"-FVE-FS-", 510: b"\x55\xaa"}, "a BitLocker volume (BitLocker)"),
    "ceph_bluestore_stub": ({0: b"bluestore block device\n"}, "a Ceph BlueStore device (ceph_bluestore)"),
    "xfs_stub": ({0: b"XFSB"}, "an XFS filesystem (xfs)"),
    "btrfs_stub": ({65600: b"_BHRfS_M"}, "a btrfs filesystem (btrfs)"),
    "iso9660_stub": ({32769: b"CD001"}, "an ISO 9660 filesystem (iso9660)"),
    "luks_stub": ({0: b"LUKS\xba\xbe"}, "a LUKS volume (crypto_LUKS)"),
    "ntfs_stub": ({3: b"NTFS    ", 510: b"\x55\xaa"}, "an NTFS filesystem (ntfs)"),
    "exfat_stub": ({3: b"EXFAT   ", 510: b"\x55\xaa"}, "an exFAT filesystem (exfat)"),
    "f2fs_stub": ({1024: (0xF2F52010).to_bytes(4, "little")}, "an F2FS filesystem (f2fs)"),
    # libblkid (wipefs) calls a bare boot signature a "dos" table, machined's probe "an MBR boot signature"
    "mbr_signature_stub": ({510: b"\x55\xaa"}, "an MBR "),
}


@pytest.mark.parametrize(
    ("label", "named"), [("gpt", "a GPT partition table (gpt)"), ("dos", "an MBR partition table (dos)")]
)
def test_partition_table_refused_then_wiped(label: str, named: str, machined: Path, image: Path, disk: Disk) -> None:
    run("sfdisk", "--quiet", "--no-reread", disk.device, stdin=f"label: {label}\nstart=2048, size=16384\n")
    refused_then_wiped(machined, image, disk, named)


@pytest.mark.parametrize("kind", sorted(STUBS))
def test_stubbed_signature_refused_then_wiped(kind: str, machined: Path, image: Path, disk: Disk) -> None:
    """Stub: only the signature's magic, written where its tool writes it (for tools not installed here,
    or kernels without the driver); machined's own probe must find it, checksums or not."""
    patches, named = STUBS[kind]
    for offset, data in patches.items():
        disk.write(offset, data)
    refused_then_wiped(machined, image, disk, named)


def write_backup_gpt(disk: Disk, tmp_path: Path) -> None:
    """The last MiB of a disk of the same size partitioned by the real sfdisk: its backup GPT (header at the
    last LBA, entries before it), with nothing at the start (a primary table wiped, its backup left)."""
    other = tmp_path / "gpt.img"
    with other.open("wb") as out:
        out.truncate(TARGET_SIZE)
    run("sfdisk", "--quiet", str(other), stdin="label: gpt\nsize=16MiB\n")
    with other.open("rb") as src:
        src.seek(TARGET_SIZE - MIB)
        disk.write(-MIB, src.read(MIB))


def test_backup_gpt_alone_refused_then_wiped(machined: Path, image: Path, disk: Disk, tmp_path: Path) -> None:
    write_backup_gpt(disk, tmp_path)
    refused_then_wiped(machined, image, disk, "a backup GPT header (gpt)")


def test_lvm_pv_and_backup_gpt_named_together(machined: Path, image: Path, disk: Disk, tmp_path: Path) -> None:
    make_lvm_pv(disk)
    write_backup_gpt(disk, tmp_path)
    message = refused(machined, image, disk)
    assert message == (
        f"install: refusing to install onto {disk.device}: it holds an LVM2 physical volume "
        "(LVM2_member) and a backup GPT header (gpt); pass --wipe to overwrite it"
    )


@pytest.mark.parametrize("where", ["first", "last"])
def test_unrecognised_data_at_an_end_refused_then_wiped(where: str, machined: Path, image: Path, disk: Disk) -> None:
    disk.write(300 * 1024 if where == "first" else -300 * 1024, b"data no probe recognises" * 10)
    refused_then_wiped(machined, image, disk, f"it holds data in its {where} MiB")


def test_empty_disk_accepted(machined: Path, image: Path, disk: Disk, capfd: pytest.CaptureFixture[str]) -> None:
    install_disk(machined, image, Path(disk.device), wipe=False)
    out = capfd.readouterr().out
    assert f"install: {disk.device} is empty (checked by machined's probe and wipefs;" in out
    assert "install: done" in out


# --- in use: refused even with --wipe --------------------------------------------------------------------


@pytest.mark.parametrize("wipe", [False, True])
def test_mounted_partition_refused_even_with_wipe(
    wipe: bool, machined: Path, image: Path, disk: Disk, tmp_path: Path
) -> None:
    part = disk.add_partitions()
    run("mkfs.ext4", "-q", "-F", part)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    run("mount", part, str(mountpoint))
    disk.undo.callback(subprocess.run, ["umount", str(mountpoint)], capture_output=True)
    message = refused(
        machined,
        image,
        disk,
        f"it is in use: {part} is mounted at {mountpoint}",
        "--wipe does not override this",
        wipe=wipe,
    )
    assert "pass --wipe" not in message


def test_swap_partition_refused_even_with_wipe(machined: Path, image: Path, disk: Disk) -> None:
    part = disk.add_partitions()
    run("mkswap", part)
    if subprocess.run(["swapon", part], capture_output=True).returncode != 0:
        pytest.skip("swapon refused here")
    disk.undo.callback(subprocess.run, ["swapoff", part], capture_output=True)
    refused(machined, image, disk, f"{part} is in use as swap", "--wipe does not override this", wipe=True)


def test_exclusively_opened_disk_refused_even_with_wipe(machined: Path, image: Path, disk: Disk) -> None:
    """Nothing in mountinfo, swaps or holders: only the O_EXCL open tells (as for a mount in another
    mount namespace, seen from a container)."""
    fd = os.open(disk.device, os.O_RDONLY | os.O_EXCL)
    disk.undo.callback(os.close, fd)
    refused(
        machined, image, disk, "it is in use: opening it exclusively failed", "--wipe does not override this", wipe=True
    )


def test_device_mapper_holder_refused_even_with_wipe(machined: Path, image: Path, disk: Disk) -> None:
    need("dmsetup")
    name = f"kiln-test-{uuid.uuid4().hex[:8]}"
    if (
        subprocess.run(
            ["dmsetup", "create", name, "--table", f"0 2048 linear {disk.device} 0"], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("no device-mapper in this kernel (CONFIG_BLK_DEV_DM); the Go tests cover a fake /sys")
    disk.undo.callback(subprocess.run, ["dmsetup", "remove", "--retry", name], capture_output=True)
    refused(
        machined, image, disk, "is held by dm-", f"device-mapper {name}", "--wipe does not override this", wipe=True
    )


def test_md_holder_refused_even_with_wipe(machined: Path, image: Path, disk: Disk) -> None:
    need("mdadm")
    if not md_driver():
        pytest.skip("no md driver in this kernel (CONFIG_BLK_DEV_MD); the Go tests cover a fake /sys")
    array = f"/dev/md/kiln-test-{uuid.uuid4().hex[:8]}"
    run(
        "mdadm",
        "--create",
        array,
        "--run",
        "--metadata=1.2",
        "--level=1",
        "--raid-devices=2",
        "--force",
        disk.device,
        "missing",
    )
    disk.undo.callback(subprocess.run, ["mdadm", "--stop", array], capture_output=True)
    refused(machined, image, disk, "(md array)", "--wipe does not override this", wipe=True)


# --- kiln install itself ---------------------------------------------------------------------------------


def machined_tree_without_a_graph(machined: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For `kiln install` run in-process: no graph is loaded and the steps that read one are replaced;
    returns a package tree holding the machined built here, for the stand-in package build to give."""
    from kiln.core.verb import Context
    from kiln.image import checks

    monkeypatch.setattr(Context, "graph", lambda ctx, platform=None: None)
    monkeypatch.setattr(checks, "check_packages", lambda profiles, graph: None)
    monkeypatch.setattr(checks, "with_release_version", lambda profiles, graph: profiles)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    tree = machined.parent / "tree"
    (tree / "usr/sbin").mkdir(parents=True, exist_ok=True)
    if not (tree / "usr/sbin/machined").exists():
        os.link(machined, tree / "usr/sbin/machined")
    return tree


def test_kiln_install_exits_2_on_a_refused_disk(
    machined: Path, image: Path, disk: Disk, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`kiln install --image` with its package build replaced by the machined built here (no graph is
    loaded, so the steps that read it are replaced too)."""
    from types import SimpleNamespace

    from kiln import cli
    from kiln.image import checks, imager

    tree = machined_tree_without_a_graph(machined, monkeypatch)
    built = SimpleNamespace(trees={checks.MACHINED: tree})
    monkeypatch.setattr(imager, "build_packages", lambda *args, **kwargs: built)
    disk.write(4096, MD_1X)
    code = cli.main(["install", "--disk", disk.device, "--image", str(image)])
    assert code == 2
    assert f"refusing to install onto {disk.device}: it holds an mdraid array member" in capfd.readouterr().err
    assert cli.main(["install", "--disk", disk.device, "--image", str(image), "--wipe"]) == 0


def test_kiln_install_checks_the_disk_before_it_builds_the_image(
    machined: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A used disk, a disk smaller than the profile's image and a missing disk are refused after machined
    is built and before the profile's packages or image are: only machined's build is asked for (the
    stand-in records what is asked; no graph is loaded, so the steps that read it are replaced too)."""
    from types import SimpleNamespace

    from kiln import cli
    from kiln.image import checks, imager

    tree = machined_tree_without_a_graph(machined, monkeypatch)
    asked: list[tuple[list[str], tuple[str, ...]]] = []

    def build_packages(profiles: list[Any], graph: object, jobs: object, **kwargs: Any) -> object:
        asked.append(([p.name for p in profiles], kwargs.get("extra", ())))
        return SimpleNamespace(trees={checks.MACHINED: tree})

    def make_images(*args: object) -> None:
        raise AssertionError("the image was built for a disk that is refused")

    monkeypatch.setattr(imager, "build_packages", build_packages)
    monkeypatch.setattr(imager, "make_images", make_images)
    used, small = tmp_path / "used.img", tmp_path / "small.img"
    with used.open("wb") as out:  # as large as metal's disk (1 GiB, profiles/metal.yaml), sparse
        out.truncate(1 << 30)
        out.seek(4096)
        out.write(MD_1X)
    with small.open("wb") as out:
        out.truncate(64 * MIB)
    assert cli.main(["install", "--disk", str(used)]) == 2
    assert f"refusing to install onto {used}: it holds an mdraid array member" in capfd.readouterr().err
    assert cli.main(["install", "--disk", str(small), "--wipe"]) == 2
    assert f"{small} (67108864 bytes) is smaller than the image (1073741824 bytes)" in capfd.readouterr().err
    assert cli.main(["install", "--disk", str(tmp_path / "no-such-disk")]) == 2
    assert "no-such-disk: no such file or directory" in capfd.readouterr().err
    assert asked == [([], (checks.MACHINED,))] * 3
