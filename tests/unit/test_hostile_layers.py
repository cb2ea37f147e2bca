"""Extension layers on hostile trees (kiln.rootfs.extension): the copy, Kiln's manifest and the modules
checks never follow a link the extension planted; each case points one link at a canary outside the
work dir, which must stay as it was. depmod itself runs in tests/integration/test_hostile_assembly.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.core.errors import BuildError
from kiln.core.nofollow import LinkRefused
from kiln.rootfs import extension
from kiln.rootfs.extension import MANIFEST_DIR, Manifest
from tests.unit.hostile_tree import Canary

HELLO = Manifest("hello", "1.0", "Kiln", "says hello", ">=0.1,<1")


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    return Canary(tmp_path / "host")


def ext(tmp_path: Path) -> Path:
    tree = tmp_path / "ext"
    (tree / "usr/local/bin").mkdir(parents=True)
    (tree / "usr/local/bin/hello").write_text("hi\n")
    return tree


def test_the_manifest_is_never_written_through_a_link_on_its_path(tmp_path: Path, canary: Canary) -> None:
    """The install step linked /out/usr/local/lib/kiln/extensions/hello.json to a host file."""
    tree = ext(tmp_path)
    (tree / MANIFEST_DIR).mkdir(parents=True)
    (tree / MANIFEST_DIR / "hello.json").symlink_to(canary.file)
    with pytest.raises(LinkRefused, match=f"extension 'hello': /{MANIFEST_DIR}/hello.json is a symbolic link"):
        extension.layer_tree(tree, HELLO, tmp_path / "work/layer")
    canary.check()


@pytest.mark.parametrize("linked", ["usr/local/lib", "usr/local/lib/kiln", MANIFEST_DIR])
def test_a_linked_directory_on_the_manifest_path_is_refused(tmp_path: Path, canary: Canary, linked: str) -> None:
    tree = ext(tmp_path)
    (tree / linked).parent.mkdir(parents=True, exist_ok=True)
    (tree / linked).symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match=f"/{linked} is a symbolic link where Kiln needs a directory"):
        extension.layer_tree(tree, HELLO, tmp_path / "work/layer")
    canary.check()


def test_a_layer_keeps_the_extensions_own_links_as_links(tmp_path: Path, canary: Canary) -> None:
    tree = ext(tmp_path)
    (tree / "usr/local/bin/host").symlink_to(canary.file)
    layer = extension.layer_tree(tree, HELLO, tmp_path / "work/layer")
    assert os.readlink(layer / "usr/local/bin/host") == str(canary.file)
    assert (layer / MANIFEST_DIR / "hello.json").read_text() == HELLO.to_json()
    assert (layer / "usr/local/bin/hello").read_text() == "hi\n"
    canary.check()


def test_paths_are_checked_without_entering_a_link(tmp_path: Path, canary: Canary) -> None:
    tree = ext(tmp_path)
    (tree / "usr/local/etc").symlink_to(canary.dir)
    extension.check_paths("hello", tree)  # a link under /usr/local is the extension's own business
    (tree / "etc").symlink_to(canary.dir)
    with pytest.raises(BuildError, match=r"puts files outside .*: /etc$"):
        extension.check_paths("hello", tree)


@pytest.mark.parametrize(
    "planted",
    ["usr/lib/modules", "usr/lib/modules/6.1.0", "usr/lib/modules/6.1.0/extra/evil.ko", "usr/lib/modules/6.1.0/x"],
)
def test_a_link_in_the_modules_is_refused_before_anything_reads_it(
    tmp_path: Path, canary: Canary, planted: str
) -> None:
    """module_files (the vermagic check), has_modules and modules_layer (depmod's copy) refuse it by name."""
    tree = ext(tmp_path)
    (tree / "usr/lib/modules/6.1.0/extra").mkdir(parents=True, exist_ok=True)
    (tree / "usr/lib/modules/6.1.0/extra/ok.ko").write_bytes(b"vermagic=6.1.0\0")
    target = tree / planted
    if target.exists():
        os.rename(target, tmp_path / "aside")
    target.symlink_to(canary.dir)
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib/modules/6.1.0").mkdir(parents=True)
    for check in (
        lambda: extension.module_files(tree),
        lambda: extension.has_modules(tree),
        lambda: extension.modules_layer(rootfs, [tree], tmp_path / "work/index"),
    ):
        with pytest.raises(LinkRefused, match=f"kernel modules: /{planted} is a symbolic link"):
            check()
    assert not (tmp_path / "work/index.merged").exists(), "the merged copy was left behind"
    canary.check()


def test_the_kernels_modules_behind_a_link_are_refused_too(tmp_path: Path, canary: Canary) -> None:
    kernel = tmp_path / "kernel"
    (kernel / "usr/lib").mkdir(parents=True)
    (kernel / "usr/lib/modules").symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match="/usr/lib/modules is a symbolic link"):
        extension.kernel_release(kernel)
    canary.check()
