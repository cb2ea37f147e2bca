"""rootfs trees and their archives with the real tools: mksquashfs, unsquashfs, cpio, zstd."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from kiln.core.errors import BuildError
from kiln.rootfs.archive import cpio_newc, mksquashfs
from kiln.rootfs.tree import Part, check_minimal, largest_files, merge, prune, strip_binaries

pytestmark = pytest.mark.integration

EPOCH = 1704067200


def make(root: Path, files: Mapping[str, str | bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_prune_and_conflicts(tmp_path: Path) -> None:
    a = make(
        tmp_path / "a",
        {
            "usr/bin/tool": "a",
            "usr/include/x.h": "h",
            "usr/lib/libx.a": "ar",
            "usr/share/man/man1/tool.1": "man",
            "etc/os-release": "ID=kiln",
        },
    )
    b = make(tmp_path / "b", {"usr/sbin/other": "b"})
    owners = merge([Part("a", a), Part("b", b)], tmp_path / "root")
    assert owners["usr/sbin/other"] == "b"
    removed = prune(tmp_path / "root")
    assert "usr/include" in removed and "usr/lib/libx.a" in removed and "usr/share/man" in removed
    assert (tmp_path / "root/usr/bin/tool").read_text() == "a"
    clash = make(tmp_path / "c", {"usr/bin/tool": "c"})
    with pytest.raises(BuildError, match=r"/usr/bin/tool is in both 'a' and 'c'"):
        merge([Part("a", a), Part("c", clash)], tmp_path / "root2")


def test_shell_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "root", {"bin/sh": "#!"})
    with pytest.raises(BuildError, match="bin/sh"):
        check_minimal(root)


def test_strip_shrinks_a_real_binary(tmp_path: Path) -> None:
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void){puts("hi");return 0;}\n')
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    subprocess.run(["gcc", "-g", "-O2", "-o", str(root / "usr/bin/hello"), str(source)], check=True)
    before = (root / "usr/bin/hello").stat().st_size
    assert strip_binaries(root) == 1
    assert (root / "usr/bin/hello").stat().st_size < before
    assert subprocess.run([str(root / "usr/bin/hello")], capture_output=True, text=True).stdout == "hi\n"
    assert largest_files(root, 1)[0][1] == "/usr/bin/hello"


def test_strip_uses_the_binutils_of_each_files_arch(tmp_path: Path) -> None:
    """An arm64 rootfs is stripped on this amd64 host: the native strip refuses aarch64 files."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (tmp_path / "start.s").write_text(".globl _start\n_start:\n  mov x0, #0\n  ret\n")
    subprocess.run(
        ["aarch64-linux-gnu-as", "-g", "-o", str(tmp_path / "start.o"), str(tmp_path / "start.s")], check=True
    )
    subprocess.run(["aarch64-linux-gnu-ld", "-o", str(root / "usr/bin/tiny"), str(tmp_path / "start.o")], check=True)
    before = subprocess.run(
        ["aarch64-linux-gnu-readelf", "-S", str(root / "usr/bin/tiny")], capture_output=True, text=True
    )
    assert ".debug_line" in before.stdout
    assert strip_binaries(root) == 1
    after = subprocess.run(
        ["aarch64-linux-gnu-readelf", "-S", str(root / "usr/bin/tiny")], capture_output=True, text=True
    )
    assert ".debug_line" not in after.stdout
    assert "ARM aarch64" in subprocess.run(["file", str(root / "usr/bin/tiny")], capture_output=True, text=True).stdout


def test_an_elf_for_another_machine_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    riscv = bytearray(64)
    riscv[:6] = b"\x7fELF\x02\x01"
    riscv[18:20] = (0xF3).to_bytes(2, "little")
    (root / "usr/bin/odd").write_bytes(bytes(riscv))
    with pytest.raises(BuildError, match="/usr/bin/odd: an ELF file for machine 0xf3"):
        strip_binaries(root)


def test_squashfs_is_reproducible_and_root_owned(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "usr/bin/tool": os.urandom(50000),
        "etc/os-release": "ID=kiln\n",
        "usr/lib/x/y": "z",
    }
    first = make(tmp_path / "one", files)
    second = make(tmp_path / "two", files)
    os.chown(second / "etc/os-release", 1000, 1000)
    os.utime(second / "usr/bin/tool", (1, 1))
    a = mksquashfs(first, tmp_path / "a.sqsh", EPOCH)
    b = mksquashfs(second, tmp_path / "b.sqsh", EPOCH)
    assert sha(a) == sha(b)
    listing = subprocess.run(["unsquashfs", "-lln", str(a)], capture_output=True, text=True, check=True).stdout
    assert "0/0" in listing and "1000/1000" not in listing
    assert "2024-01-01" in listing


def test_initramfs_cpio_is_reproducible(tmp_path: Path) -> None:
    files = {"init": os.urandom(1000), "rootfs.sqsh": os.urandom(2000)}
    first = make(tmp_path / "one", files)
    second = make(tmp_path / "two", dict(reversed(list(files.items()))))
    (first / "init").chmod(0o755)
    (second / "init").chmod(0o755)
    a = cpio_newc(first, tmp_path / "a.zst", EPOCH)
    b = cpio_newc(second, tmp_path / "b.zst", EPOCH)
    assert sha(a) == sha(b)
    raw = subprocess.run(["zstd", "-dc", str(a)], capture_output=True, check=True).stdout
    listing = subprocess.run(["cpio", "-itv", "--quiet"], input=raw, capture_output=True, check=True).stdout.decode()
    names = [line.split()[-1] for line in listing.splitlines()]
    assert names == ["init", "rootfs.sqsh"]
    assert all(" root " in line or " 0 " in line for line in listing.splitlines())
