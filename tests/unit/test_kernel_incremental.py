"""pkgs/kernel/incremental.sh, run for real on a small tree: kbuild's mtimes follow content.

The script runs inside the kernel's build root; here it runs with the host's sh, coreutils and
findutils (the same GNU tools stage0 has) on a made-up source and object tree, which is all it
reads: the stamp's compiler line comes from a ccache.conf written by the test.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "pkgs/kernel/incremental.sh"
EPOCH = 1_000_000


class Tree:
    def __init__(self, base: Path) -> None:
        self.src = base / "src"
        self.obj = base / "obj"
        self.conf = base / "ccache.conf"
        self.tmp = base / "tmp"
        (self.src / "kernel").mkdir(parents=True)
        self.tmp.mkdir()
        (self.src / "kernel/fork.c").write_text("int fork;\n")
        (self.src / "Makefile").write_text("VERSION = 6\n")
        self.compiler("string:one")

    def compiler(self, check: str) -> None:
        self.conf.write_text(f"max_size = 4G\ncompiler_check = {check}\n")

    def run(self, mode: str) -> str:
        env = {
            "PATH": os.environ["PATH"],
            "LC_ALL": "C.UTF-8",
            "CCACHE_CONFIGPATH": str(self.conf),
            "SOURCE_DATE_EPOCH": str(EPOCH),
            "ARCH": "x86",
            "TMPDIR": str(self.tmp),
        }
        script = SCRIPT.read_text().replace("/tmp/kiln-", f"{self.tmp}/kiln-")  # the root's /tmp, here
        result = subprocess.run(
            ["sh", "-c", script, "incremental.sh", mode, str(self.src), str(self.obj)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def good_build(self) -> None:
        """begin, an object made, end: what a successful kernel build does."""
        self.run("begin")
        (self.obj / "fork.o").write_text("object")
        self.run("end")


def mtime(path: Path) -> int:
    return int(path.lstat().st_mtime)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def test_an_unchanged_source_is_older_than_its_kept_object(tree: Tree) -> None:
    assert "object tree empty" in tree.run("begin")
    (tree.obj / "fork.o").write_text("object")
    tree.run("end")
    out = tree.run("begin")
    assert "object tree kept; 0 source files changed" in out
    assert mtime(tree.src / "kernel/fork.c") == EPOCH < mtime(tree.obj / "fork.o")  # make rebuilds nothing


def test_a_changed_source_is_newer_than_every_kept_object(tree: Tree) -> None:
    tree.good_build()
    (tree.src / "kernel/fork.c").write_text("int fork = 1;\n")
    assert "1 source files changed" in tree.run("begin")
    assert mtime(tree.src / "kernel/fork.c") >= mtime(tree.obj / "fork.o")
    assert mtime(tree.src / "Makefile") == EPOCH


def test_a_change_reverted_before_a_good_build_is_still_seen(tree: Tree) -> None:
    """A failed build does not save its list: the file is compared with the last good build's."""
    tree.good_build()
    (tree.src / "kernel/fork.c").write_text("int fork = 1;\n")
    tree.run("begin")  # ... and the build fails
    (tree.src / "kernel/fork.c").write_text("int fork = 2;\n")
    assert "1 source files changed" in tree.run("begin")


def test_what_an_unfinished_build_wrote_is_deleted_but_kconfig_output(tree: Tree) -> None:
    tree.good_build()
    tree.run("begin")
    (tree.obj / "half.o").write_text("half-written by a killed compile")
    (tree.obj / "include/config").mkdir(parents=True)
    (tree.obj / "include/config/FOO").write_text("")
    (tree.obj / ".config").write_text("CONFIG_FOO=y\n")
    tree.run("begin")  # no `end` came
    assert not (tree.obj / "half.o").exists()
    assert (tree.obj / "fork.o").exists()  # from the last good build
    assert (tree.obj / "include/config/FOO").exists() and (tree.obj / ".config").exists()


def test_another_compiler_empties_the_tree(tree: Tree) -> None:
    tree.good_build()
    tree.compiler("string:two")
    assert "object tree empty" in tree.run("begin")
    assert not (tree.obj / "fork.o").exists()


def test_a_tree_without_a_good_build_list_is_emptied(tree: Tree) -> None:
    tree.good_build()
    (tree.obj / ".kiln-sources").unlink()
    assert "object tree empty" in tree.run("begin")
    assert not (tree.obj / "fork.o").exists()
