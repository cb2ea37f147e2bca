"""A local source edited while a build runs is refused, not stored under the key of its old contents."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiln.build.builder import Builder
from kiln.build.cache_keys import compute_keys
from kiln.build.session import NoRunner
from kiln.build.sources.download import Fetcher
from kiln.build.store import Store
from kiln.core.errors import BuildError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/buildgraph"


def builder(root: Path, tmp_path: Path) -> Builder:
    graph = Graph(load_tree(root / "pkgs", Platform.parse("linux/amd64")))
    cache = tmp_path / "cache"
    return Builder(graph, compute_keys(graph), Store(cache), Fetcher(cache, []), NoRunner(), 1, 0)


def test_unchanged_local_source_is_placed(tmp_path: Path) -> None:
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    run = builder(root, tmp_path)
    run.place_sources(run.graph.tree.packages["greet-lib"], tmp_path / "build")
    assert (tmp_path / "build/src/greet.c").read_text() == (root / "src/greet/greet.c").read_text()


def test_local_source_edited_after_the_keys_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    run = builder(root, tmp_path)
    (root / "src/greet/greet.c").write_text("/* edited while the build ran */\n")
    with pytest.raises(BuildError, match=r"greet-lib: local source 'src/greet' changed since this build started"):
        run.place_sources(run.graph.tree.packages["greet-lib"], tmp_path / "build")


def test_single_file_source_placed_under_another_name_is_fine(tmp_path: Path) -> None:
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    (root / "conf").write_text("CONFIG_X=y\n")
    pkg = root / "pkgs/greet-lib/pkg.yaml"
    extra = "        destination: src\n      - path: conf\n        destination: .config\n"
    pkg.write_text(pkg.read_text().replace("        destination: src\n", extra))
    run = builder(root, tmp_path)
    run.place_sources(run.graph.tree.packages["greet-lib"], tmp_path / "build")
    assert (tmp_path / "build/.config").read_text() == "CONFIG_X=y\n"
    (root / "conf").write_text("CONFIG_X=n\n")
    with pytest.raises(BuildError, match="local source 'conf' changed"):
        run.place_sources(run.graph.tree.packages["greet-lib"], tmp_path / "build2")
