"""The Debian-source mirror for real: `apt-get source --download-only` against Debian's archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.build.sources.archives import CHECK_VERSION
from kiln.build.sources.download import Fetcher
from kiln.build.sources.errors import FetchError
from kiln.build.sources.mirrors import Mirror, load_mirrors
from kiln.core.errors import Location
from kiln.pkg.model import Source

pytestmark = pytest.mark.integration  # Kiln's hosts are Debian: apt-get is never missing, never skipped

MUSL_URL = "https://musl.libc.org/releases/musl-1.2.3.tar.gz"  # not reachable here: only Debian's copy is
MUSL_SHA = "7d5b0b6062521e4627e099e4c9dc8248d32a30285e959b7eecaa780cf8cfd4a4"


def musl(hint: str = "musl=1.2.3-1", sha256: str = MUSL_SHA) -> Source:
    return Source(destination="musl-1.2.3.tar.gz", url=MUSL_URL, sha256=sha256, debian=hint)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    return tmp_path / "cache"


def test_musl_comes_from_debian_with_upstreams_hash(cache: Path, tmp_path: Path) -> None:
    mirrors = load_mirrors(tmp_path)  # no kiln-project.yaml: the default is [debian]
    assert mirrors == [Mirror("debian")]
    path = Fetcher(cache, mirrors, retries=0).fetch(musl())
    assert path == cache / "sources" / MUSL_SHA
    assert Fetcher(cache, []).fetch(musl()) == path  # cached: no mirror, no network needed
    assert (cache / "sources" / f"{MUSL_SHA}.checked").read_text() == CHECK_VERSION + "ok\n"  # a benign tarball
    kept = sorted(p.name for p in (cache / "sources").iterdir())
    assert kept == [MUSL_SHA, f"{MUSL_SHA}.checked", f"{MUSL_SHA}.verified"]


def test_unknown_version_says_so_plainly(cache: Path) -> None:
    where = Location("pkgs/toolchain-seed/pkg.yaml", 12)
    with pytest.raises(FetchError) as info:
        Fetcher(cache, [Mirror("debian")], retries=0).fetch(musl("musl=0.0.1-1"), where)
    text = str(info.value)
    assert text.startswith(f"pkgs/toolchain-seed/pkg.yaml:12: cannot fetch {MUSL_URL}")
    assert (
        f"Debian's archive no longer has musl=0.0.1-1; find the tarball elsewhere (sha256 {MUSL_SHA}) "
        "and put it in a mirror directory"
    ) in text


def test_repacked_tarball_is_not_accepted(cache: Path) -> None:
    other = "0" * 64
    with pytest.raises(FetchError) as info:
        Fetcher(cache, [Mirror("debian")], retries=0).fetch(musl(sha256=other))
    text = str(info.value)
    assert f"apt-get source musl=1.2.3-1 gave no file with sha256 {other}" in text
    assert f"musl_1.2.3.orig.tar.gz ({MUSL_SHA})" in text
    assert not (cache / "sources" / other).exists()


def test_missing_deb_src_says_how_to_add_it(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An apt configuration with no sources at all, as on a host where nobody added deb-src.
    (tmp_path / "sources.list").write_text("")
    (tmp_path / "sources.list.d").mkdir()
    config = tmp_path / "apt.conf"
    config.write_text(
        f'Dir::Etc::SourceList "{tmp_path / "sources.list"}";\nDir::Etc::SourceParts "{tmp_path / "sources.list.d"}";\n'
    )
    monkeypatch.setenv("APT_CONFIG", str(config))
    with pytest.raises(FetchError) as info:
        Fetcher(cache, [Mirror("debian")], retries=0).fetch(musl())
    text = str(info.value)
    assert "apt has no deb-src entry" in text
    assert "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian" in text
    assert "apt-get update" in text


def test_kiln_fetch_gets_every_source_of_the_real_tree(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped pkgs/ through the CLI: each pinned source arrives through the Debian mirror."""
    from kiln.cli import main

    pkgs = Path(__file__).resolve().parents[2] / "pkgs"
    assert main(["fetch", "--pkgs", str(pkgs)]) == 0
    assert "fetched" in capsys.readouterr().out
    assert (cache / "sources" / MUSL_SHA).is_file()
