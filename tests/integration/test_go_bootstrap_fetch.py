"""`kiln fetch go` gets the whole Go bootstrap chain's sources from Debian's archive.

pkgs/go and its go-bootstrap-* steps fetch Debian's files from the pool by URL (a bookworm host's
apt knows none of these versions): Go's orig tarball and the two binary packages of the chain's
start (trixie-backports' Go), about 100 MB. Nothing but deb.debian.org is reachable here, so this also proves no step
needs go.dev.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import cli
from kiln.build.sources.archives import CHECK_VERSION
from kiln.build.sources.download import Fetcher
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"
CHAIN = ["go", "go-bootstrap-1.25"]


def test_kiln_fetch_go_gets_the_chain_from_debians_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE", str(cache))
    monkeypatch.setenv("KILN_MIRRORS", "debian")
    asked: list[str] = []
    getter = Fetcher._getter

    def only_the_pool(self: Fetcher, url: str) -> object:
        asked.append(url)
        assert url.startswith("http://deb.debian.org/debian/pool/main/g/golang-1."), url
        return getter(self, url)

    monkeypatch.setattr(Fetcher, "_getter", only_the_pool)

    tree = load_tree(PKGS, Platform.parse("linux/amd64"))
    closure = Graph(tree).closure(CHAIN)  # the chain and what it builds on (toolchain-seed's musl)
    assert set(CHAIN) == set(Graph(tree).closure(["go"])) - {"toolchain-seed"}
    assert cli.main(["fetch", *CHAIN, "--pkgs", str(PKGS)]) == 0
    total = sum(1 for name in closure for step in tree.packages[name].steps for s in step.sources if s.url)
    assert f"fetched {total} source(s) for {len(closure)} package(s)" in capsys.readouterr().out

    pinned = {s.sha256 for name in CHAIN for step in tree.packages[name].steps for s in step.sources}
    assert len(pinned) == 3 and sorted(asked) == sorted(
        s.url or "" for name in CHAIN for step in tree.packages[name].steps for s in step.sources
    )  # every Go file straight from the pool (musl came through apt-get source)
    for sha in pinned:
        assert (cache / "sources" / str(sha)).is_file()  # the fetcher verified the sha256 on the way in
    # the orig tarballs are checked archives; the .debs (ar archives) are no tar for the check and
    # are unpacked inside the sandbox by dpkg-deb
    verdicts = {sha: (cache / "sources" / f"{sha}.checked").read_text() for sha in pinned}
    debs = {s.sha256 for s in tree.packages["go-bootstrap-1.25"].steps[0].sources}
    assert all(verdicts[sha] == CHECK_VERSION + ("not an archive\n" if sha in debs else "ok\n") for sha in pinned)
