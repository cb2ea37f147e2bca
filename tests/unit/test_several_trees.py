"""Several package trees loaded as one (`--pkgs STOCK --pkgs MINE`): an extension author's tree beside the stock one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.build.cache_keys import compute_keys
from kiln.core.errors import InputError, InputErrors
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
STOCK = ROOT / "tests/fixtures/buildgraph/pkgs"
AMD64 = Platform.parse("linux/amd64")

MINE = """\
name: greet-extra
variant: stage0
version: "2.0"
description: the author's package, on the stock library, with a source of its own project
dependencies:
  - stage: greet-lib
    to: /deps
steps:
  - sources:
      - path: src/extra.c
        destination: extra.c
    build:
      - gcc -c extra.c -o extra.o
finalize:
  - from: /tmp/build
    to: /
"""


def author_tree(tmp_path: Path, pkg: str = MINE, **files: str) -> Path:
    """An author's project: pkgs/greet-extra/pkg.yaml, src/extra.c, and any other files (path -> text)."""
    project = tmp_path / "author"
    (project / "pkgs/greet-extra").mkdir(parents=True)
    (project / "pkgs/greet-extra/pkg.yaml").write_text(pkg)
    (project / "src").mkdir()
    (project / "src/extra.c").write_text("int extra(void) { return 1; }\n")
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    return project / "pkgs"


def errors_of(roots: list[Path]) -> list[str]:
    with pytest.raises((InputError, InputErrors)) as caught:
        load_tree(roots, AMD64)
    error = caught.value
    return [str(e) for e in (error.errors if isinstance(error, InputErrors) else [error])]


def test_the_author_tree_builds_on_the_stock_one_with_its_own_sources(tmp_path: Path) -> None:
    mine = author_tree(tmp_path)
    tree = load_tree([STOCK, mine], AMD64)
    assert tree.roots == [STOCK.resolve(), mine.resolve()]
    extra, lib = tree.packages["greet-extra"], tree.packages["greet-lib"]
    assert tree.project_root_of(extra) == mine.resolve().parent
    assert tree.project_root_of(lib) == STOCK.resolve().parent
    keys = compute_keys(Graph(tree))
    (mine.parent / "src/extra.c").write_text("int extra(void) { return 2; }\n")
    changed = compute_keys(Graph(load_tree([STOCK, mine], AMD64)))
    assert changed["greet-extra"] != keys["greet-extra"]  # the author's own file is the source
    assert changed["greet-lib"] == keys["greet-lib"]
    assert tree.package_context(extra)["greeting"] == tree.variables["greeting"]  # stock vars reach it


def test_a_name_defined_by_two_trees_names_both_places(tmp_path: Path) -> None:
    mine = author_tree(tmp_path, MINE.replace("name: greet-extra", "name: greet-lib"))
    (message,) = errors_of([STOCK, mine])
    assert message.startswith(f"{mine.resolve()}/greet-extra/pkg.yaml:1: duplicate package name 'greet-lib'")
    assert "buildgraph/pkgs/greet-lib/pkg.yaml:1)" in message and "one package tree" in message


def test_a_later_tree_may_add_variables_but_not_change_one(tmp_path: Path) -> None:
    mine = author_tree(tmp_path, **{"pkgs/vars.yaml": "extra_flag: on\n\ngreeting: hijacked\n"})
    (message,) = errors_of([STOCK, mine])
    assert message.startswith(f"{mine.resolve()}/vars.yaml:3: variable 'greeting' is already set by {STOCK.resolve()}")
    added = author_tree(tmp_path / "b", **{"pkgs/vars.yaml": "extra_flag: on\n"})
    assert load_tree([STOCK, added], AMD64).variables["extra_flag"] is True


def test_only_the_first_tree_defines_the_seed(tmp_path: Path) -> None:
    mine = author_tree(tmp_path, **{"pkgs/stage0.yaml": (STOCK / "stage0.yaml").read_text()})
    (message,) = errors_of([STOCK, mine])
    assert message.startswith(f"{mine.resolve()}/stage0.yaml:1: only the first package tree")


@pytest.mark.parametrize("second", ["same", "inside"])
def test_overlapping_trees_are_refused(tmp_path: Path, second: str) -> None:
    stock = tmp_path / "pkgs"
    shutil.copytree(STOCK, stock)
    other = stock if second == "same" else stock / "greet-lib"
    (message,) = errors_of([stock, other])
    assert "overlap: give each tree once" in message


def test_the_project_file_names_the_trees_and_the_cli_loads_them(tmp_path: Path) -> None:
    mine = author_tree(tmp_path)
    project = mine.parent
    shutil.copytree(STOCK.parent, tmp_path / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    (project / "kiln-project.yaml").write_text("pkgs: [../kiln/pkgs, pkgs]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KILN_CACHE": str(tmp_path / "cache")}
    kiln = [sys.executable, "-m", "kiln.cli"]
    done = subprocess.run([*kiln, "validate", "--json"], cwd=project, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["packages"] == 6  # five stock packages and the author's
    clash = author_tree(tmp_path / "c", MINE.replace("name: greet-extra", "name: greet-app"))
    done = subprocess.run(
        [*kiln, "validate", "--pkgs", str(STOCK), "--pkgs", str(clash)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "duplicate package name 'greet-app'" in done.stderr
    assert "Traceback" not in done.stderr
