"""`kiln fetch toolchain` gets every source of the full toolchain through the Debian-source mirror.

Its sources (binutils, gcc-12, gmp, mpfr, mpc, musl and Debian's Linux tarball, about 250 MB)
must still come out of Debian's archive alone, with upstream URLs refused, under their pinned
sha256s. Building it is tests/integration/test_toolchain_build.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import cli
from kiln.build.sources import download
from kiln.build.sources.archives import CHECK_VERSION
from kiln.build.sources.download import Fetcher
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"


def test_kiln_fetch_toolchain_gets_every_source_from_debian(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE", str(cache))
    monkeypatch.setenv("KILN_MIRRORS", "debian")
    served: list[str] = []
    debian = Fetcher._debian

    def only_debian(self: Fetcher, hint: str, sha: str) -> download.Writer:
        get = debian(self, hint, sha)

        def record(sink: download._Sink) -> None:
            get(sink)
            served.append(sha)

        return record

    def no_upstream(self: Fetcher, url: str) -> download.Writer:
        return download._missing(f"upstream disabled by the test: {url}")

    # Upstream URLs are refused, so a source only arrives through `apt-get source`.
    monkeypatch.setattr(Fetcher, "_debian", only_debian)
    monkeypatch.setattr(Fetcher, "_getter", no_upstream)
    monkeypatch.setattr(Fetcher, "_ftp", no_upstream)

    assert cli.main(["fetch", "toolchain", "--pkgs", str(PKGS)]) == 0
    assert "fetched 7 source(s) for 1 package(s)" in capsys.readouterr().out

    package = load_tree(PKGS, Platform.parse("linux/amd64")).packages["toolchain"]
    pinned = {s.sha256 for step in package.steps for s in step.sources}
    assert len(pinned) == 7
    assert set(served) == pinned
    for sha in pinned:
        assert (cache / "sources" / str(sha)).is_file()
        assert (cache / "sources" / f"{sha}.checked").read_text() == CHECK_VERSION + "ok\n"  # no unsafe member
