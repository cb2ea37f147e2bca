"""kiln.core.paths.join_inside and the finalize copy on plain directories: spec paths stay inside their tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.build.runners.mounter import overlay_options
from kiln.core.errors import BuildError
from kiln.core.paths import PathEscape, join_inside, spec_parts
from kiln.core.treecopy import finalize_tree


@pytest.fixture
def root(tmp_path: Path) -> Path:
    top = tmp_path / "root"
    (top / "usr/lib").mkdir(parents=True)
    (top / "lib").symlink_to("usr/lib")
    (top / "abs").symlink_to("/usr")
    (top / "up").symlink_to("../../../../..")
    (top / "host").symlink_to(str(tmp_path))
    (top / "loop").symlink_to("loop")
    (top / "file").write_text("f")
    return top


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/", ""),
        ("", ""),
        ("/usr/lib", "usr/lib"),
        ("usr//./lib/", "usr/lib"),
        ("/lib/x", "usr/lib/x"),
        ("/abs/lib", "usr/lib"),
        ("/up/usr", "usr"),
        ("/host/root", None),
        ("/missing/deeper", "missing/deeper"),
        ("/a:b,c", "a:b,c"),
    ],
)
def test_links_resolve_inside_the_root(root: Path, path: str, expected: str | None) -> None:
    joined = join_inside(root, path)
    assert joined.is_relative_to(root)
    assert ".." not in joined.parts
    if expected is not None:
        assert joined == root / expected


def test_host_absolute_link_is_taken_as_a_path_of_the_root(root: Path, tmp_path: Path) -> None:
    assert join_inside(root, "/host/x") == root.joinpath(*tmp_path.parts[1:], "x")


def test_last_component_kept_when_not_followed(root: Path) -> None:
    assert join_inside(root, "/lib", follow_last=False) == root / "lib"
    assert join_inside(root, "/lib/", follow_last=False) == root / "lib"
    assert join_inside(root, "/lib") == root / "usr/lib"


@pytest.mark.parametrize("path", ["/x\n/../../../../", "/../etc", "a/../../b", "..", "/ok/\x7f", "/tab\there", "\x00"])
def test_dot_dot_and_control_characters_are_refused(root: Path, path: str) -> None:
    with pytest.raises(PathEscape):
        join_inside(root, path)
    with pytest.raises(PathEscape):
        spec_parts(path)


def test_symlink_loops_are_refused(root: Path) -> None:
    with pytest.raises(PathEscape, match="too many levels"):
        join_inside(root, "/loop/x")


def test_overlay_options_refuse_separators() -> None:
    assert overlay_options(["/a", "/b"], "/u", "/w") == "lowerdir=/a:/b,upperdir=/u,workdir=/w"
    for bad in ("/x:/etc", "/x,upperdir=/etc", "/x\\:y", "/x\ny"):
        with pytest.raises(BuildError, match="overlay"):
            overlay_options(["/a", bad], "/u", "/w")
        with pytest.raises(BuildError):
            overlay_options(["/a"], bad, "/w")


def test_finalize_never_leaves_root_or_out(tmp_path: Path) -> None:
    """The unit-level twin of tests/integration/test_hostile_build.py, on plain directories."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("HOST")
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "payload").mkdir(parents=True)
    (root / "payload/f").write_text("new")
    (root / "evil").symlink_to(host)
    (root / "out").mkdir()
    (root / "out/etc").symlink_to(host)
    (root / "out/flink").symlink_to(host / "secret")
    out.mkdir()
    finalize_tree(root, [("/out", "/"), ("/payload", "/etc"), ("/payload/f", "/flink"), ("/evil", "/e")], out)
    assert sorted(os.listdir(host)) == ["secret"] and (host / "secret").read_text() == "HOST"
    assert (out / "etc").readlink() == host and (out / "e").readlink() == host
    assert (out.joinpath(*host.parts[1:]) / "f").read_text() == "new"
    assert (out / "flink").read_text() == "new" and not (out / "flink").is_symlink()
    with pytest.raises(BuildError, match="finalize: /evil/secret does not exist in the build root"):
        finalize_tree(root, [("/evil/secret", "/s")], out)
    with pytest.raises(PathEscape):
        finalize_tree(root, [("/payload", "/../x")], out)


def test_finalize_keeps_hard_links_modes_and_times(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "t/bin").mkdir(parents=True)
    (root / "t/bin/a").write_text("x")
    os.link(root / "t/bin/a", root / "t/b")
    (root / "t/bin/a").chmod(0o4755)
    os.utime(root / "t/bin/a", ns=(1, 123456789))
    (root / "t").chmod(0o700)
    out.mkdir()
    finalize_tree(root, [("/t", "/")], out)
    assert os.path.samefile(out / "bin/a", out / "b")
    assert (out / "bin/a").stat().st_mode & 0o7777 == 0o4755
    assert (out / "bin/a").stat().st_mtime_ns == 123456789
    assert out.stat().st_mode & 0o777 == 0o700
