"""The rootfs userland of Kiln's own pkgs/, built for real with the seed toolchain (toolchain-seed).

The small musl packages, built with the seed toolchain into the default store (on a cold machine
about 5 minutes on 2 idle cores: util-linux and xfsprogs are the longest, at about 1.5 minutes
each; the end-to-end tier's images need the same packages, so whichever tier runs first builds
them and the other finds them stored). The exported binaries are checked to be static (no
PT_INTERP, no PT_DYNAMIC) and run on the host.
Then every one of them, and machined, is rebuilt with `kiln build --check` and compared file for
file with the stored output (about 3 minutes on 2 cores; the kernel, Go and the full toolchain
take too long for CI and are proven by bench/repro.py).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kiln import __version__
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

PACKAGES = ["fhs", "init", "ca-certificates", "dosfstools", "kmod", "e2fsprogs", "util-linux", "xfsprogs"]

BINARIES = {
    "init": ["init"],
    "dosfstools": ["usr/sbin/mkfs.fat", "usr/sbin/fsck.fat", "usr/sbin/fatlabel"],
    "kmod": ["usr/bin/kmod"],
    "e2fsprogs": ["usr/sbin/mke2fs", "usr/sbin/e2fsck", "usr/sbin/tune2fs", "usr/sbin/resize2fs"],
    "util-linux": ["usr/sbin/sfdisk", "usr/sbin/blkid"],
    "xfsprogs": ["usr/sbin/mkfs.xfs", "usr/sbin/xfs_repair", "usr/sbin/xfs_growfs", "usr/sbin/xfs_db"],
}

PT_DYNAMIC, PT_INTERP = 2, 3


def program_headers(path: Path) -> list[int]:
    """The p_type of each program header of a 64-bit little-endian ELF file."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit LE ELF"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]


def run(*args: str | Path) -> str:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real pkgs/ packages this test needs, built into the default store; returns the export dir.

    The default store is the one the end-to-end tier builds its images from (tests/e2e, which
    `make test` runs beside this tier), so on a cold machine each of these packages is built once,
    from the seed, by whichever tier asks first (the other waits on its build lock), and a package
    whose inputs change is rebuilt.
    """
    out = tmp_path_factory.mktemp("userland") / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "build", *PACKAGES, "--jobs", "2", "--json", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    statuses = {name: info["status"] for name, info in json.loads(result.stdout)["packages"].items()}
    assert set(statuses) >= {*PACKAGES, "toolchain-seed"}, statuses
    assert all(status in ("built", "cached") for status in statuses.values()), statuses
    return out


@pytest.mark.parametrize("package", sorted(BINARIES))
def test_binaries_are_static(built: Path, package: str) -> None:
    for rel in BINARIES[package]:
        headers = program_headers(built / package / rel)
        assert PT_INTERP not in headers, f"{package}: {rel} asks for a dynamic loader"
        assert PT_DYNAMIC not in headers, f"{package}: {rel} is dynamically linked"


def test_binaries_run_on_the_host(built: Path, tmp_path: Path) -> None:
    assert f"kiln-init {__version__}" in run(built / "init/init", "--version")
    assert "kmod version 30" in run(built / "kmod/usr/bin/kmod", "--version")
    assert "2.38.1" in run(built / "util-linux/usr/sbin/sfdisk", "--version")
    assert "2.38.1" in run(built / "util-linux/usr/sbin/blkid", "-V")

    fat = tmp_path / "fat.img"
    run(built / "dosfstools/usr/sbin/mkfs.fat", "-C", "-n", "KILNFAT", fat, "8192")
    run(built / "dosfstools/usr/sbin/fsck.fat", "-n", fat)

    ext4 = tmp_path / "ext4.img"
    env_conf = built / "e2fsprogs/etc/mke2fs.conf"
    assert env_conf.is_file()
    subprocess.run(["truncate", "-s", "16M", str(ext4)], check=True)
    result = subprocess.run(
        [str(built / "e2fsprogs/usr/sbin/mke2fs"), "-F", "-q", "-t", "ext4", "-L", "KILNSTATE", str(ext4)],
        env={"MKE2FS_CONFIG": str(env_conf)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    run(built / "e2fsprogs/usr/sbin/e2fsck", "-fn", ext4)

    # util-linux's blkid reads what e2fsprogs and dosfstools wrote
    probe = run(built / "util-linux/usr/sbin/blkid", "-p", ext4)
    assert 'LABEL="KILNSTATE"' in probe and 'TYPE="ext4"' in probe
    assert 'TYPE="vfat"' in run(built / "util-linux/usr/sbin/blkid", "-p", fat)

    # xfsprogs (built on liburcu and libinih from the same package, libuuid from util-linux)
    xfs = tmp_path / "xfs.img"
    subprocess.run(["truncate", "-s", "300M", str(xfs)], check=True)  # mkfs.xfs's minimum
    run(built / "xfsprogs/usr/sbin/mkfs.xfs", "-q", "-L", "KILNXFS", xfs)
    run(built / "xfsprogs/usr/sbin/xfs_repair", "-n", "-f", xfs)
    assert 'label = "KILNXFS"' in run(built / "xfsprogs/usr/sbin/xfs_db", "-r", "-c", "label", xfs)
    probe = run(built / "util-linux/usr/sbin/blkid", "-p", xfs)
    assert 'LABEL="KILNXFS"' in probe and 'TYPE="xfs"' in probe


def test_fhs_and_ca_certificates(built: Path) -> None:
    os_release = (built / "fhs/usr/lib/os-release").read_text()
    assert f'VERSION_ID="{__version__}"' in os_release
    assert os.readlink(built / "fhs/etc/os-release") == "../usr/lib/os-release"
    assert os.readlink(built / "fhs/sbin") == "usr/sbin"
    bundle = (built / "ca-certificates/etc/ssl/certs/ca-certificates.crt").read_text()
    assert bundle.count("-----BEGIN CERTIFICATE-----") > 100


def test_libblkid_is_there_for_dependents(built: Path) -> None:
    sysroot = built / "util-linux/sysroot/usr"
    assert (sysroot / "lib/libblkid.a").is_file()
    assert (sysroot / "include/blkid/blkid.h").is_file()
    assert "Version: 2.38.1" in (sysroot / "lib/pkgconfig/blkid.pc").read_text()


def test_the_rootfs_packages_rebuild_byte_identical(built: Path) -> None:
    """`kiln build --check` on every package of the rootfs that builds in about two minutes or less
    (machined from an empty Go cache, so its step cache is proven not to leak into the output)."""
    targets = [*PACKAGES, "machined"]
    result = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "build", "--check", *targets, "--jobs", "2", "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    report = json.loads(result.stdout)["packages"]
    differing = {name: info["differences"][:3] for name, info in report.items() if not info["reproducible"]}
    assert result.returncode == 0 and not differing, f"{differing}\n{result.stderr[-3000:]}"
    assert sorted(report) == sorted(targets)
    assert all(info["files"] > 0 for info in report.values())
