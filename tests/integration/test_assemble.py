"""Kernel + initramfs assembly from package trees with the real tools (mksquashfs, cpio, zstd).

The trees are made by hand here instead of by the graph, so this runs in seconds; the
end-to-end tests assemble from real package builds and boot the result.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from kiln.core.errors import BuildError
from kiln.rootfs.assemble import Inputs, assemble
from kiln.rootfs.extension import Manifest

pytestmark = pytest.mark.integration
EPOCH = 1704067200


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, Path]:
    return {
        "kernel": tree(tmp_path / "kernel", {"boot/vmlinuz": "bzImage", "usr/lib/modules/6.1.0/modules.order": ""}),
        "init": tree(tmp_path / "init", {"init": "#init"}),
        "fhs": tree(
            tmp_path / "fhs",
            {
                "usr/lib/os-release": "ID=kiln\n",
                "etc/hostname": "kiln\n",
                "usr/include/junk.h": "",
                "usr/share/man/man8/x.8": "",
            },
        ),
        "machined": tree(tmp_path / "machined", {"usr/sbin/machined": "#machined"}),
        "hello": tree(
            tmp_path / "hello",
            {
                "usr/local/bin/hello": "hi",
                "usr/local/lib/kiln/services/hello.json": '{"name": "hello", "command": "/usr/local/bin/hello"}',
            },
        ),
        "bad": tree(tmp_path / "bad", {"etc/passwd": "root::0:0"}),
    }


HELLO = Manifest("hello", "1.0", "Kiln", "says hello", ">=0.1,<1")


def members(initramfs: Path) -> list[str]:
    raw = subprocess.run(["zstd", "-dc", str(initramfs)], capture_output=True, check=True).stdout
    listing = subprocess.run(["cpio", "-it", "--quiet"], input=raw, capture_output=True, check=True).stdout
    return listing.decode().split()


def test_kernel_and_initramfs_are_written_and_reproducible(trees: dict[str, Path], tmp_path: Path) -> None:
    inputs = Inputs(trees, ["fhs", "machined"], [(HELLO, "hello")])
    report = assemble(inputs, tmp_path / "one", EPOCH, lambda _: None)
    assemble(inputs, tmp_path / "two", EPOCH, lambda _: None)
    for name in ("vmlinuz", "initramfs.zst"):
        one = hashlib.sha256((tmp_path / "one" / name).read_bytes()).hexdigest()
        two = hashlib.sha256((tmp_path / "two" / name).read_bytes()).hexdigest()
        assert one == two, name
    assert (tmp_path / "one/vmlinuz").read_text() == "bzImage"
    assert members(tmp_path / "one/initramfs.zst") == ["extensions", "extensions/01-hello.sqsh", "init", "rootfs.sqsh"]
    assert report.sizes["initramfs.zst"] > 0 and "extensions/01-hello.sqsh" in report.sizes
    assert not list((tmp_path / "one").glob("kiln-image-*")), "the work dir is cleaned up"


def test_rootfs_is_pruned_and_layer_carries_its_manifest(trees: dict[str, Path], tmp_path: Path) -> None:
    assemble(Inputs(trees, ["fhs", "machined"], [(HELLO, "hello")]), tmp_path / "out", EPOCH, lambda _: None)
    raw = subprocess.run(["zstd", "-dc", str(tmp_path / "out/initramfs.zst")], capture_output=True, check=True)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["cpio", "-id", "--quiet"], input=raw.stdout, cwd=unpacked, check=True)
    rootfs = subprocess.run(
        ["unsquashfs", "-l", str(unpacked / "rootfs.sqsh")], capture_output=True, text=True, check=True
    ).stdout
    assert "squashfs-root/usr/sbin/machined" in rootfs
    assert "squashfs-root/usr/lib/modules/6.1.0" in rootfs
    assert "junk.h" not in rootfs and "man8" not in rootfs and "vmlinuz" not in rootfs
    layer = unpacked / "extensions/01-hello.sqsh"
    subprocess.run(["unsquashfs", "-d", str(tmp_path / "layer"), str(layer)], capture_output=True, check=True)
    manifest = json.loads((tmp_path / "layer/usr/local/lib/kiln/extensions/hello.json").read_text())
    assert manifest == {
        "name": "hello",
        "version": "1.0",
        "author": "Kiln",
        "description": "says hello",
        "compatibility": ">=0.1,<1",
    }


def test_extension_outside_allowed_paths_is_refused(trees: dict[str, Path], tmp_path: Path) -> None:
    bad = Manifest("bad", "1", "x", "", ">=0.1")
    with pytest.raises(BuildError, match=r"extension 'bad' puts files outside .*: /etc/passwd"):
        assemble(Inputs(trees, ["fhs"], [(bad, "bad")]), tmp_path / "out", EPOCH, lambda _: None)


def test_incompatible_extension_is_refused(trees: dict[str, Path], tmp_path: Path) -> None:
    old = Manifest("hello", "1.0", "Kiln", "", "<0.1")
    with pytest.raises(BuildError, match=r"extension 'hello' needs Kiln <0.1, this is Kiln 0.1.0"):
        assemble(Inputs(trees, ["fhs"], [(old, "hello")]), tmp_path / "out", EPOCH, lambda _: None)


def test_conflicting_packages_are_named(trees: dict[str, Path], tmp_path: Path) -> None:
    tree(trees["machined"], {"etc/hostname": "other\n"})
    with pytest.raises(BuildError, match=r"/etc/hostname is in both 'fhs' and 'machined'"):
        assemble(Inputs(trees, ["fhs", "machined"]), tmp_path / "out", EPOCH, lambda _: None)
