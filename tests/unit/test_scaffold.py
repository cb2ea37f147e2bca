"""`kiln init --extension`: what it writes loads as a valid extension on the real stock tree (no build)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.core.errors import InputError
from kiln.pkg.loader import load_tree
from kiln.pkg.scaffold import create_extension
from kiln.pkg.variables import Platform
from kiln.rootfs.extension import manifest_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ["service", "module"])
@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_both_kinds_load_beside_the_stock_tree(tmp_path: Path, kind: str, platform: str) -> None:
    project = tmp_path / "ext"
    written = create_extension("my-ext", project, ROOT / "pkgs", kind, "tests", "1.4.2")
    assert {p.relative_to(project).parts[0] for p in written} == {"kiln-project.yaml", "README.md", "pkgs"}
    tree = load_tree([ROOT / "pkgs", project / "pkgs"], Platform.parse(platform))
    package = tree.packages["my-ext"]
    manifest = manifest_for(package)
    assert (manifest.author, manifest.compatibility) == ("tests", ">=1.4,<1.5")
    if kind == "module":
        assert (manifest.modules, manifest.kernel) == (("my_ext",), ">=6.1,<6.2")
        assert [d.stage for d in package.dependencies] == ["kernel-build"]
        assert (project / "pkgs/my-ext/src/Kbuild").read_text() == "obj-m := my_ext.o\n"
    else:
        assert (project / "pkgs/my-ext/my-ext.json").exists() and not package.dependencies


def test_the_project_names_the_stock_tree_relative_to_itself(tmp_path: Path) -> None:
    stock = tmp_path / "kiln/pkgs"
    stock.mkdir(parents=True)
    create_extension("svc", tmp_path / "work/svc", stock, "service", "me", "0.9.0")
    assert (tmp_path / "work/svc/kiln-project.yaml").read_text().endswith("pkgs: [../../kiln/pkgs, pkgs]\n")


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("Bad_Name", "service", "extension name 'Bad_Name'"),
        ("-x", "service", "extension name '-x'"),
        ("ok", "daemon", "--kind daemon: choose service or module"),
    ],
)
def test_bad_names_and_kinds_write_nothing(tmp_path: Path, name: str, kind: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        create_extension(name, tmp_path / "new", ROOT / "pkgs", kind, "me", "1.0.0")
    assert not (tmp_path / "new").exists()


def test_a_used_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="is not an empty directory"):
        create_extension("ok", tmp_path, ROOT / "pkgs", "service", "me", "1.0.0")
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
