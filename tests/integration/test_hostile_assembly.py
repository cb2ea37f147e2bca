"""Image assembly over hostile package trees with the real tools (mksquashfs, cpio, zstd, strip, the host's
depmod from kmod): each case plants one link pointing at a canary file or directory outside the work dir,
and Kiln either refuses it by name or keeps it as a link, and never reads, writes, removes, chmods or
re-times the canary."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.core.errors import BuildError
from kiln.core.nofollow import LinkRefused
from kiln.rootfs import extension
from kiln.rootfs.assemble import Inputs, assemble
from kiln.rootfs.extension import MANIFEST_DIR, Manifest
from tests.unit.hostile_tree import Canary

pytestmark = pytest.mark.integration
EPOCH = 1704067200
HELLO = Manifest("hello", "1.0", "Kiln", "says hello", ">=0.1,<1")


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    host = Canary(tmp_path / "host")
    tree(host.root, {"doc/kept": "host docs\n", "include/kept.h": "host header\n"})
    shutil.copy2("/bin/true", host.root / "true")  # an ELF strip would rewrite
    host.snapshot()
    return host


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, Path]:
    work = tmp_path / "pkgs"
    return {
        "kernel": tree(work / "kernel", {"boot/vmlinuz": "bzImage", "usr/lib/modules/6.1.0/modules.order": ""}),
        "init": tree(work / "init", {"init": "#init"}),
        "fhs": tree(work / "fhs", {"usr/lib/os-release": "ID=kiln\n", "usr/share/man/man8/x.8": ""}),
        "evil": tree(work / "evil", {"usr/sbin/evil": "#evil"}),
        "hello": tree(work / "hello", {"usr/local/bin/hello": "hi"}),
    }


def link(at: Path, target: Path) -> None:
    """`at` (whatever the package had there first) made a link to `target`."""
    if at.is_dir() and not at.is_symlink():
        shutil.rmtree(at)
    elif at.exists():
        at.unlink()
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


def run(trees: dict[str, Path], out: Path, extensions: bool = True) -> None:
    layers = [(HELLO, "hello")] if extensions else []
    assemble(Inputs(trees, ["fhs", "evil"], layers), out, EPOCH, lambda _: None)


KEPT: list[tuple[str, Callable[[dict[str, Path], Canary], None]]] = [
    # prune once removed host directories through a package's link: usr/share/doc -> host's doc
    ("usr/share", lambda t, c: link(t["fhs"] / "usr/share", c.root)),
    ("toolchain", lambda t, c: link(t["evil"] / "toolchain", c.root / "include")),
    ("usr/local/include", lambda t, c: link(t["evil"] / "usr/local/include", c.root / "include")),
    ("a host ELF for strip", lambda t, c: link(t["evil"] / "usr/bin/true", c.root / "true")),
    ("a .a for prune", lambda t, c: link(t["evil"] / "usr/lib/libhost.a", c.file)),
    ("an extension's link", lambda t, c: link(t["hello"] / "usr/local/bin/host", c.dir)),
]


@pytest.mark.parametrize("plant", [p for _, p in KEPT], ids=[i for i, _ in KEPT])
def test_links_a_package_keeps_are_copied_as_links_and_never_followed(
    trees: dict[str, Path], tmp_path: Path, canary: Canary, plant: Callable[[dict[str, Path], Canary], None]
) -> None:
    plant(trees, canary)
    run(trees, tmp_path / "out")
    canary.check()
    assert (tmp_path / "out/initramfs.zst").is_file()


REFUSED: list[tuple[str, Callable[[dict[str, Path], Canary], None], str]] = [
    ("init", lambda t, c: link(t["init"] / "init", c.file), "/init"),
    (
        "vmlinuz",
        lambda t, c: link(t["kernel"] / "boot/vmlinuz", c.file),
        "/boot/vmlinuz",
    ),
    (
        "kernel modules",
        lambda t, c: link(t["kernel"] / "usr/lib/modules", c.dir),
        "/usr/lib/modules",
    ),
    (
        "a modules index",
        lambda t, c: link(t["kernel"] / "usr/lib/modules/6.1.0/modules.dep", c.file),
        "/usr/lib/modules/6.1.0/modules.dep",
    ),
    (
        "the extension manifest",
        lambda t, c: link(t["hello"] / MANIFEST_DIR / "hello.json", c.file),
        f"/{MANIFEST_DIR}/hello.json",
    ),
    ("the manifest directory", lambda t, c: link(t["hello"] / MANIFEST_DIR, c.dir), f"/{MANIFEST_DIR}"),
]


@pytest.mark.parametrize(("plant", "named"), [(p, n) for _, p, n in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_links_where_kiln_reads_or_writes_are_refused_by_name(
    trees: dict[str, Path],
    tmp_path: Path,
    canary: Canary,
    plant: Callable[[dict[str, Path], Canary], None],
    named: str,
) -> None:
    plant(trees, canary)
    with pytest.raises(LinkRefused, match=f": {named} is a symbolic link where Kiln needs"):
        run(trees, tmp_path / "out")
    canary.check()


def test_a_package_cannot_merge_into_a_host_directory_through_an_earlier_link(
    trees: dict[str, Path], tmp_path: Path, canary: Canary
) -> None:
    link(trees["fhs"] / "usr/sbin", canary.dir)
    with pytest.raises(BuildError, match=r"rootfs conflict: usr/sbin is a directory in 'evil' but not in 'fhs'"):
        run(trees, tmp_path / "out", extensions=False)
    canary.check()


def module_tree(root: Path, release: str) -> Path:
    """A stand-in module (depmod indexes what it can read and warns on the rest) under `release`."""
    return tree(root, {f"usr/lib/modules/{release}/extra/hello.ko": "not an ELF\n"})


def test_depmod_indexes_only_kilns_merged_copy(trees: dict[str, Path], tmp_path: Path, canary: Canary) -> None:
    """The host's depmod over the rootfs's and the extension's modules: index files in the layer, nothing
    outside; the merged copy it ran on is removed."""
    rootfs = tree(tmp_path / "rootfs", {"usr/lib/modules/6.1.0/modules.order": ""})
    layer = module_tree(tmp_path / "layer", "6.1.0")
    link(layer / "usr/local/bin/host", canary.dir)  # a link outside the modules stays out of depmod's copy
    dest = tmp_path / "work/index"
    assert extension.modules_layer(rootfs, [layer], dest) == dest
    made = sorted(p.name for p in (dest / "usr/lib/modules/6.1.0").iterdir())
    assert "modules.dep" in made and "modules.order" not in made
    assert not (tmp_path / "work/index.merged").exists()
    canary.check()


def test_a_version_that_looks_like_an_option_reaches_depmod_as_a_version(tmp_path: Path, canary: Canary) -> None:
    """`depmod -b DIR -a` would be an option (every module of the running kernel); after `--` it is a bad
    version, which depmod refuses."""
    if shutil.which("depmod") is None:
        pytest.skip("depmod (kmod) is not installed")
    rootfs = tree(tmp_path / "rootfs", {"usr/lib/modules/-a/modules.order": ""})
    layer = module_tree(tmp_path / "layer", "-a")
    with pytest.raises(BuildError, match=r"depmod for -a failed .*Bad version passed -a"):
        extension.modules_layer(rootfs, [layer], tmp_path / "work/index")
    canary.check()


def test_the_real_depmod_is_on_this_host() -> None:
    """The tests above prove what they say only with kmod's depmod."""
    found = shutil.which("depmod") or shutil.which("/usr/sbin/depmod")
    assert found is not None
    assert "kmod" in subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout
