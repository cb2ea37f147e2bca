"""A run's sources fetched in the background, and their sizes as the scheduler's weights.

Real Fetcher and graph; the "download" comes from a directory mirror, so no network is needed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

from kiln.build import prefetch
from kiln.build.sources.download import Fetcher
from kiln.build.sources.mirrors import Mirror
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import write_tree


def package(name: str, sha: str) -> str:
    return f"""
        name: {name}
        variant: scratch
        steps:
          - sources:
              - url: http://unreachable.invalid/{name}.tar
                destination: {name}.tar
                sha256: "{sha}"
        finalize:
          - from: /tmp/build
            to: /
    """


def test_prefetch_fetches_every_remote_source_and_weighs_them(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shas = {}
    for name, size in (("big", 4000), ("small", 10)):
        data = bytes(size)
        (mirror / f"{name}.tar").write_bytes(data)
        shas[name] = hashlib.sha256(data).hexdigest()
    pkgs = write_tree(tmp_path, {f"{n}/pkg.yaml": package(n, shas[n]) for n in shas})
    graph = Graph(load_tree(pkgs, Platform.parse("linux/amd64")))
    builder = SimpleNamespace(graph=graph, fetcher=Fetcher(tmp_path / "cache", [Mirror("dir", str(mirror))]))
    weigh = prefetch.source_bytes(builder)  # type: ignore[arg-type]
    assert weigh("big") == 0  # nothing fetched yet
    thread = prefetch.start(builder, ["big", "small"])  # type: ignore[arg-type]
    assert thread is not None
    thread.join(timeout=30)
    assert (weigh("big"), weigh("small")) == (4000, 10)


def test_a_failing_prefetch_is_silent(tmp_path: Path) -> None:
    """The build fetches again and reports; the background thread only ends."""
    pkgs = write_tree(tmp_path, {"gone/pkg.yaml": package("gone", "0" * 64)})
    graph = Graph(load_tree(pkgs, Platform.parse("linux/amd64")))
    builder = SimpleNamespace(graph=graph, fetcher=Fetcher(tmp_path / "cache", [], retries=0))
    thread = prefetch.start(builder, ["gone"])  # type: ignore[arg-type]
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert prefetch.source_bytes(builder)("gone") == 0  # type: ignore[arg-type]
