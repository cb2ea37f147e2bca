"""kiln.core.nofollow: every write, chmod, utime, rename, walk and copy stays in the tree it was given,
with a planted link per case pointing at a canary file or directory outside it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from kiln.core import nofollow
from kiln.core.errors import BuildError
from kiln.core.nofollow import LinkRefused
from tests.unit.hostile_tree import Canary


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    return Canary(tmp_path / "host")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "tree/usr/lib").mkdir(parents=True)
    (tmp_path / "tree/usr/lib/real").write_bytes(b"real\n")
    return tmp_path / "tree"


def test_a_link_on_the_way_is_refused_by_name_and_nothing_is_written(tree: Path, canary: Canary) -> None:
    (tree / "usr/local").symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match=r"manifest: /usr/local is a symbolic link where Kiln needs a directory"):
        nofollow.write_in(tree, "usr/local/lib/kiln/x.json", b"{}", what="manifest")
    canary.check()


def test_a_link_where_the_file_goes_is_refused(tree: Path, canary: Canary) -> None:
    (tree / "usr/lib/x.json").symlink_to(canary.file)
    with pytest.raises(LinkRefused, match=r"/usr/lib/x.json is a symbolic link where Kiln needs a file"):
        nofollow.write_in(tree, "usr/lib/x.json", b"{}")
    canary.check()
    assert (tree / "usr/lib/x.json").is_symlink()


def test_a_write_replaces_a_file_by_a_new_inode_with_its_mode_and_times(tree: Path) -> None:
    os.link(tree / "usr/lib/real", tree / "store-copy")
    with nofollow.opened_dir(tree, "usr/lib") as fd:
        nofollow.write_at(fd, "real", b"new\n", "/usr/lib/real", mode=0o640, times_ns=(5, 7_000_000_000))
    info = (tree / "usr/lib/real").stat()
    assert (tree / "usr/lib/real").read_bytes() == b"new\n" and (tree / "store-copy").read_bytes() == b"real\n"
    assert (info.st_mode & 0o777, info.st_mtime_ns) == (0o640, 7_000_000_000)
    assert sorted(os.listdir(tree / "usr/lib")) == ["real"], "a temporary file was left behind"


def test_planted_temporary_names_are_never_opened(tree: Path, canary: Canary, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary name is new each time (O_EXCL): a link planted at a guessed name is skipped over."""
    names = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda _n: next(names))
    (tree / "usr/lib/.real.kiln-aaaa").symlink_to(canary.file)
    with nofollow.opened_dir(tree, "usr/lib") as fd:
        nofollow.write_at(fd, "real", b"new\n", "/usr/lib/real")
    canary.check()
    assert (tree / "usr/lib/real").read_bytes() == b"new\n"


def test_a_walk_lists_links_and_never_enters_them(tree: Path, canary: Canary) -> None:
    (tree / "usr/lib/host").symlink_to(canary.dir)
    seen = {entry.rel: entry.is_link for entry in nofollow.walk(tree)}
    assert seen == {"usr": False, "usr/lib": False, "usr/lib/host": True, "usr/lib/real": False}
    with pytest.raises(LinkRefused, match="/usr/lib/host"):
        nofollow.refuse_links(tree, "usr", what="modules")


def test_a_walk_below_a_link_is_refused(tree: Path, canary: Canary) -> None:
    (tree / "usr/share").symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match="/usr/share is a symbolic link"):
        list(nofollow.walk(tree, "usr/share"))


def test_chmod_and_times_never_reach_a_links_target(tree: Path, canary: Canary) -> None:
    (tree / "usr/lib/to-file").symlink_to(canary.file)
    with nofollow.opened_dir(tree, "usr/lib") as fd:
        with pytest.raises(LinkRefused, match="/usr/lib/to-file"):
            nofollow.set_mode_at(fd, "to-file", 0o777, "/usr/lib/to-file")
        nofollow.set_times_at(fd, "to-file", (3, 3))
    canary.check()
    assert (tree / "usr/lib/to-file").lstat().st_mtime_ns == 3


def test_remove_tree_never_removes_through_a_link(tree: Path, canary: Canary) -> None:
    (tree / "usr/share").symlink_to(canary.root)
    assert not nofollow.remove_tree_in(tree, "usr/share/host-dir")
    assert not nofollow.remove_tree_in(tree, "usr/share")
    canary.check()
    (tree / "usr/include/sub").mkdir(parents=True)
    (tree / "usr/include/sub/host").symlink_to(canary.dir)
    assert nofollow.remove_tree_in(tree, "usr/include")
    assert not (tree / "usr/include").exists()
    canary.check()


def test_a_copy_keeps_links_as_links_or_refuses_them(tree: Path, tmp_path: Path, canary: Canary) -> None:
    (tree / "usr/lib/host").symlink_to(canary.dir)
    (tmp_path / "out").mkdir()
    nofollow.copy_tree(tree, "usr", tmp_path / "out", "copy", what="layer")
    assert os.readlink(tmp_path / "out/copy/lib/host") == str(canary.dir)
    with pytest.raises(LinkRefused, match="modules: /usr/lib/host is a symbolic link"):
        nofollow.copy_tree(tree, "usr", tmp_path / "out", "again", links=False, what="modules")
    assert not (tmp_path / "out/again").exists()
    (tmp_path / "out/planted").symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match="/planted is a symbolic link"):
        nofollow.copy_tree(tree, "usr", tmp_path / "out", "planted", what="layer")
    canary.check()


def test_a_file_copy_and_read_refuse_a_link_and_anything_not_a_file(tree: Path, tmp_path: Path, canary: Canary) -> None:
    (tree / "init").symlink_to(canary.file)
    os.mkfifo(tree / "fifo")
    with pytest.raises(LinkRefused, match="init: /init is a symbolic link where Kiln needs a file"):
        nofollow.copy_file_in(tree, "init", tmp_path / "init", mode=0o755, what="init")
    with pytest.raises(BuildError, match="/fifo is not a regular file"):
        nofollow.read_in(tree, "fifo")
    with pytest.raises(BuildError, match="over 0 MiB"):
        nofollow.read_in(tree, "usr/lib/real", limit=1)
    nofollow.copy_file_in(tree, "usr/lib/real", tmp_path / "copied", mode=0o755)
    assert (tmp_path / "copied").read_bytes() == b"real\n" and (tmp_path / "copied").stat().st_mode & 0o777 == 0o755
    canary.check()


def test_paths_from_a_spec_never_climb_out(tree: Path) -> None:
    with pytest.raises(BuildError, match=r"'\.\.' component"):
        nofollow.write_in(tree, "usr/../../escape", b"")
    assert not (tree.parent / "escape").exists()


def test_a_refusal_names_the_entry_with_its_control_characters_escaped(tree: Path, canary: Canary) -> None:
    (tree / "usr/lib/\x1b[2Jevil").symlink_to(canary.dir)
    with pytest.raises(LinkRefused) as refused:
        nofollow.refuse_links(tree, "usr", what="modules")
    assert "/usr/lib/\\x1b[2Jevil is a symbolic link" in str(refused.value)
