"""Sources against a real local HTTP server, real directories and real tar archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kiln.build.sources.archives import check_archive
from kiln.build.sources.download import Fetcher, fetch_all
from kiln.build.sources.errors import FetchError, FetchErrors
from kiln.build.sources.mirrors import Mirror, load_mirrors
from kiln.build.sources.place import place_local, place_source
from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.paths import cache_dir
from kiln.pkg.model import Source

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused at once


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Server:
    """What a test HTTP server serves: path -> bytes, with optional failures and headers."""

    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    fail_first: dict[str, int] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.hits.append(self.path)
                failures = state.fail_first.get(self.path, 0)
                if failures:
                    state.fail_first[self.path] = failures - 1
            if failures:
                self.send_error(503, "try again")
                return
            body = state.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            for name, value in state.headers.get(self.path, {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    return cache_dir()


def fetcher(cache: Path, mirrors: list[Mirror] | None = None, **kwargs: object) -> Fetcher:
    return Fetcher(cache, mirrors or [], backoff=0.01, **kwargs)  # type: ignore[arg-type]


def remote(url: str, data: bytes, debian: str | None = None) -> Source:
    return Source(destination=url.rsplit("/", 1)[-1], url=url, sha256=sha(data), debian=debian)


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "sources").iterdir()) if (cache / "sources").exists() else []


# --- downloading -----------------------------------------------------------------------------------------------


def test_download_is_verified_and_kept_by_hash(server: Server, cache: Path) -> None:
    data = b"hello source\n" * 1000
    server.files["/pkg-1.0.txt"] = data
    calls: list[tuple[str, int, int | None]] = []
    f = Fetcher(cache, [], progress=lambda name, done, total: calls.append((name, done, total)))
    path = f.fetch(remote(server.url + "/pkg-1.0.txt", data))
    assert path == cache / "sources" / sha(data)
    assert path.read_bytes() == data
    assert calls[0] == ("pkg-1.0.txt", 0, len(data)) and calls[-1] == ("pkg-1.0.txt", len(data), len(data))
    assert leftovers(cache) == [sha(data), sha(data) + ".checked", sha(data) + ".verified"]  # no temporary files
    # Cached: a second fetch returns at once, even though the server no longer has it.
    del server.files["/pkg-1.0.txt"]
    hits = len(server.hits)
    assert f.fetch(remote(server.url + "/pkg-1.0.txt", data)) == path
    assert len(server.hits) == hits


def test_503_twice_then_success_is_retried(server: Server, cache: Path) -> None:
    data = b"flaky"
    server.files["/flaky.tar"] = data
    server.fail_first["/flaky.tar"] = 2
    path = fetcher(cache).fetch(remote(server.url + "/flaky.tar", data))
    assert path.read_bytes() == data
    assert server.hits == ["/flaky.tar"] * 3


def test_retries_give_up(server: Server, cache: Path) -> None:
    server.files["/down.tar"] = b"x"
    server.fail_first["/down.tar"] = 100
    with pytest.raises(FetchError, match="HTTP 503"):
        fetcher(cache, retries=2).fetch(remote(server.url + "/down.tar", b"x"))
    assert server.hits == ["/down.tar"] * 3
    assert leftovers(cache) == []


def test_mismatch_names_url_and_both_hashes_and_keeps_nothing(server: Server, cache: Path) -> None:
    expected, served = b"the real tarball", b"something else"
    server.files["/pkg.tar.gz"] = served
    url = server.url + "/pkg.tar.gz"
    where = Location("pkgs/pkg/pkg.yaml", 7)
    with pytest.raises(FetchError) as info:
        fetcher(cache).fetch(remote(url, expected), where)
    err = info.value
    assert err.exit_code == 1 and isinstance(err, KilnError)
    assert err.location == where
    text = str(err)
    assert text.startswith("pkgs/pkg/pkg.yaml:7: sha256 mismatch for " + url)
    assert sha(expected) in text and sha(served) in text and "not kept" in text
    assert leftovers(cache) == []


def test_unreachable_upstream_says_what_was_tried(cache: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    source = remote(UNREACHABLE + "/pkg-2.0.tar.xz", b"data")
    with pytest.raises(FetchError) as info:
        fetcher(cache, [Mirror("dir", str(empty)), Mirror("debian")], retries=0).fetch(source)
    text = str(info.value)
    assert text.startswith(f"cannot fetch {source.url} (expected sha256 {source.sha256})")
    assert f"{empty}: no pkg-2.0.tar.xz or {source.sha256} in this directory" in text
    assert "debian: skipped" in text
    assert "Connection refused" in text


def test_content_encoding_gzip_is_not_decoded(server: Server, cache: Path) -> None:
    """Servers label .tar.gz files `Content-Encoding: gzip`; the hash is of the bytes as published."""
    data = gzip.compress(b"tar contents")
    server.files["/x.tar.gz"] = data
    server.headers["/x.tar.gz"] = {"Content-Encoding": "gzip"}
    assert fetcher(cache).fetch(remote(server.url + "/x.tar.gz", data)).read_bytes() == data


# --- mirrors ---------------------------------------------------------------------------------------------------


def test_local_dir_mirror_by_name_and_by_hash(cache: Path, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    by_name, by_hash = b"found by name", b"found by hash"
    (mirror / "a-1.0.tar.gz").write_bytes(by_name)
    (mirror / sha(by_hash)).write_bytes(by_hash)
    # A wrong file under the name is passed over for the right one under the hash.
    (mirror / "b-1.0.tar.gz").write_bytes(b"stale")
    f = fetcher(cache, [Mirror.parse(mirror.as_uri(), tmp_path)], retries=0)
    assert f.fetch(remote(UNREACHABLE + "/a-1.0.tar.gz", by_name)).read_bytes() == by_name
    assert f.fetch(remote(UNREACHABLE + "/b-1.0.tar.gz", by_hash)).read_bytes() == by_hash
    kept = [sha(by_name), sha(by_hash)]
    assert leftovers(cache) == sorted(kept + [k + suffix for k in kept for suffix in (".checked", ".verified")])


def test_http_mirror_is_tried_before_upstream(server: Server, cache: Path) -> None:
    data = b"mirrored"
    server.files["/mirror/c-3.tar.bz2"] = data
    server.files["/upstream/c-3.tar.bz2"] = data
    f = fetcher(cache, [Mirror.parse(server.url + "/mirror/", Path("/"))])
    f.fetch(remote(server.url + "/upstream/c-3.tar.bz2", data))
    assert server.hits == ["/mirror/c-3.tar.bz2"]


def test_http_mirror_hit_with_upstream_unreachable(server: Server, cache: Path) -> None:
    data = b"only on the mirror"
    server.files["/m/" + sha(data)] = data  # a copy of someone's cache/sources served over HTTP
    f = fetcher(cache, [Mirror("http", server.url + "/m")], retries=0)
    assert f.fetch(remote(UNREACHABLE + "/d.tar", data)).read_bytes() == data
    assert server.hits == ["/m/d.tar", "/m/" + sha(data)]


def test_load_mirrors_from_the_project_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    assert load_mirrors(tmp_path) == [Mirror("debian")]  # nothing configured
    (tmp_path / "kiln-project.yaml").write_text(
        "mirrors:\n  - mirrors/local\n  - file:///srv/sources\n  - https://example.org/src/\n  - debian\n"
    )
    assert load_mirrors(tmp_path) == [
        Mirror("dir", str(tmp_path / "mirrors/local")),
        Mirror("dir", "/srv/sources"),
        Mirror("http", "https://example.org/src"),
        Mirror("debian"),
    ]
    (tmp_path / "kiln-project.yaml").write_text("mirrors: []\n")
    assert load_mirrors(tmp_path) == []
    (tmp_path / "kiln-project.yaml").write_text("other: 1\n")
    assert load_mirrors(tmp_path) == [Mirror("debian")]


def test_a_bad_project_file_points_at_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    (tmp_path / "kiln-project.yaml").write_text("mirrors:\n  - debian\n  - ftp://example.org/pub\n")
    with pytest.raises(InputError) as info:
        load_mirrors(tmp_path)
    assert info.value.location == Location(str(tmp_path / "kiln-project.yaml"), 3)
    assert "ftp://example.org/pub" in info.value.message
    (tmp_path / "kiln-project.yaml").write_text("mirrors:\n  - 3\n  - s3://bucket\n")
    with pytest.raises(InputErrors) as many:
        load_mirrors(tmp_path)
    assert [e.location.line for e in many.value.errors if e.location] == [2, 3]
    (tmp_path / "kiln-project.yaml").write_text("mirrors: debian\n")
    with pytest.raises(InputError, match="mirrors must be a list"):
        load_mirrors(tmp_path)


def test_the_old_project_file_name_is_read_with_a_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    (tmp_path / "kiln.yaml").write_text("mirrors: []\n")
    assert load_mirrors(tmp_path) == []
    assert "rename it kiln-project.yaml" in capsys.readouterr().err
    (tmp_path / "kiln-project.yaml").write_text("mirrors: [debian]\n")
    assert load_mirrors(tmp_path) == [Mirror("debian")], "the new name wins over the old one"
    assert capsys.readouterr().err == ""


def test_kiln_mirrors_overrides_kiln_yaml(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong, right = tmp_path / "wrong", tmp_path / "right"
    wrong.mkdir()
    right.mkdir()
    data = b"from the env mirror"
    (right / "e-1.tar.gz").write_bytes(data)
    (tmp_path / "kiln.yaml").write_text(f"mirrors:\n  - {wrong}\n")
    assert load_mirrors(tmp_path) == [Mirror("dir", str(wrong))]
    monkeypatch.setenv("KILN_MIRRORS", f" {right},https://a.example/x\n debian ")
    mirrors = load_mirrors(tmp_path)
    assert mirrors == [Mirror("dir", str(right)), Mirror("http", "https://a.example/x"), Mirror("debian")]
    assert fetcher(cache, mirrors, retries=0).fetch(remote(UNREACHABLE + "/e-1.tar.gz", data)).read_bytes() == data
    monkeypatch.setenv("KILN_MIRRORS", "")
    assert load_mirrors(tmp_path) == []
    monkeypatch.setenv("KILN_MIRRORS", "gopher://x")
    with pytest.raises(InputError, match=r"^\$KILN_MIRRORS: mirror 'gopher://x'"):
        load_mirrors(tmp_path)


# --- fetch_all -------------------------------------------------------------------------------------------------


def test_fetch_all_in_parallel_each_hash_once(server: Server, cache: Path) -> None:
    blobs = {f"/f{i}.tar": f"file {i}".encode() for i in range(5)}
    server.files.update(blobs)
    where = Location("pkgs/x/pkg.yaml", 3)
    sources = [(remote(server.url + p, d), where) for p, d in blobs.items()]
    sources.append((remote(server.url + "/f0.tar", blobs["/f0.tar"]), where))
    paths = fetch_all(fetcher(cache), sources)
    assert [p.read_bytes() for p in paths] == [*blobs.values(), blobs["/f0.tar"]]
    assert sorted(server.hits) == sorted(blobs)


def test_fetch_all_reports_every_failure(server: Server, cache: Path) -> None:
    server.files["/ok.tar"] = b"ok"
    server.files["/bad.tar"] = b"bad"
    sources = [
        (remote(server.url + "/ok.tar", b"ok"), Location("a/pkg.yaml", 1)),
        (remote(server.url + "/bad.tar", b"good"), Location("b/pkg.yaml", 2)),
        (remote(server.url + "/gone.tar", b"gone"), Location("c/pkg.yaml", 3)),
    ]
    with pytest.raises(FetchErrors) as info:
        fetch_all(fetcher(cache), sources)
    assert info.value.exit_code == 1
    assert [str(e.location) for e in info.value.errors] == ["b/pkg.yaml:2", "c/pkg.yaml:3"]
    assert "HTTP 404" in str(info.value) and "sha256 mismatch" in str(info.value)
    assert (cache / "sources" / sha(b"ok")).is_file()  # the good one was still fetched


# --- archive safety --------------------------------------------------------------------------------------------


def make_tar(path: Path, members: list[tarfile.TarInfo], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for member in members:
            data = b"content\n" if member.isreg() else b""
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


UNSAFE = {
    "dotdot": ([entry("pkg/"), entry("pkg/../../x")], "'pkg/../../x' has a '..' component"),
    "absolute": ([entry("/etc/x")], "'/etc/x' has an absolute path"),
    "symlink-abs": ([entry("pkg/passwd", tarfile.SYMTYPE, "/etc/passwd")], "'pkg/passwd' is a symlink"),
    "symlink-up": ([entry("pkg/sub/up", tarfile.SYMTYPE, "../../../x")], "'pkg/sub/up' is a symlink"),
    "symlink-up-2": ([entry("up", tarfile.SYMTYPE, "../../x")], "'up' is a symlink that points outside"),
    "symlink-chain": (
        [entry("d", tarfile.SYMTYPE, "."), entry("e", tarfile.SYMTYPE, "d/..")],
        "'e' is a symlink that points outside",
    ),
    "symlink-loop": (
        [entry("a", tarfile.SYMTYPE, "b/x"), entry("b", tarfile.SYMTYPE, "a/y")],
        "symlink loop",
    ),
    "hardlink-out": ([entry("pkg/h", tarfile.LNKTYPE, "../outside")], "'pkg/h' is a hardlink"),
    "hardlink-abs": ([entry("pkg/h", tarfile.LNKTYPE, "/etc/shadow")], "'pkg/h' is a hardlink"),
    "chardev": ([entry("pkg/null", tarfile.CHRTYPE)], "'pkg/null' is a device node"),
    "blockdev": ([entry("pkg/sda", tarfile.BLKTYPE)], "'pkg/sda' is a device node"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_archives_are_refused(tmp_path: Path, case: str) -> None:
    members, message = UNSAFE[case]
    archive = make_tar(tmp_path / f"{case}.tar.gz", members, "w:gz")
    with pytest.raises(FetchError, match="unsafe archive") as info:
        check_archive(archive)
    assert message in str(info.value)


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_benign_archive_is_accepted(tmp_path: Path, mode: str) -> None:
    archive = make_tar(
        tmp_path / "ok.tar",
        [
            entry("./pkg-1.0/", tarfile.DIRTYPE),
            entry("./pkg-1.0/file"),
            entry("./pkg-1.0/sub/", tarfile.DIRTYPE),
            entry("./pkg-1.0/sub/up", tarfile.SYMTYPE, "../file"),
            entry("./pkg-1.0/sub/top", tarfile.SYMTYPE, "../../pkg-1.0"),
            entry("./pkg-1.0/self", tarfile.SYMTYPE, "."),
            entry("./pkg-1.0/hard", tarfile.LNKTYPE, "pkg-1.0/file"),
            entry("./pkg-1.0/fifo", tarfile.FIFOTYPE),
        ],
        mode,
    )
    check_archive(archive)


def test_unreadable_archive_is_refused(tmp_path: Path) -> None:
    good = make_tar(tmp_path / "t.tar.gz", [entry("f")], "w:gz").read_bytes()
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(good[: len(good) // 2])
    with pytest.raises(FetchError, match=r"cannot read archive broken\.tar\.gz"):
        check_archive(broken)


def test_fetch_refuses_unsafe_archive_and_remembers(server: Server, cache: Path, tmp_path: Path) -> None:
    data = make_tar(tmp_path / "evil.tar.gz", UNSAFE["symlink-abs"][0], "w:gz").read_bytes()
    server.files["/evil.tar.gz"] = data
    source = remote(server.url + "/evil.tar.gz", data)
    where = Location("pkgs/evil/pkg.yaml", 4)
    with pytest.raises(FetchError) as info:
        fetcher(cache).fetch(source, where)
    assert str(info.value).startswith(f"pkgs/evil/pkg.yaml:4: {source.url}: unsafe archive evil.tar.gz: ")
    marker = cache / "sources" / (sha(data) + ".checked")
    assert marker.read_text().startswith("check 2\nrefused\n")
    with pytest.raises(FetchError, match="'pkg/passwd' is a symlink"):
        fetcher(cache).fetch(source, where)
    marker.write_text("check 2\nok\n")  # the verdict is read, not recomputed
    assert fetcher(cache).fetch(source, where).read_bytes() == data


def test_fetch_checks_benign_archive_once(server: Server, cache: Path, tmp_path: Path) -> None:
    data = make_tar(tmp_path / "ok.tar.xz", [entry("pkg/"), entry("pkg/f")], "w:xz").read_bytes()
    server.files["/ok.tar.xz"] = data
    fetcher(cache).fetch(remote(server.url + "/ok.tar.xz", data))
    assert (cache / "sources" / (sha(data) + ".checked")).read_text() == "check 2\nok\n"


# --- placing ---------------------------------------------------------------------------------------------------


def test_place_source_copies_into_build_dir(tmp_path: Path) -> None:
    fetched = tmp_path / "cache" / "abc"
    fetched.parent.mkdir()
    fetched.write_bytes(b"tarball")
    build = tmp_path / "build"
    build.mkdir()
    placed = place_source(fetched, build, "src/deep/pkg.tar.gz")
    assert placed == build.resolve() / "src/deep/pkg.tar.gz"
    assert placed.read_bytes() == b"tarball"
    assert not os.path.samefile(placed, fetched)  # a step writing to it must not touch the cache
    placed.write_bytes(b"changed by a step")
    assert fetched.read_bytes() == b"tarball"
    assert place_source(fetched, build, "src/deep/pkg.tar.gz") == placed  # placing again replaces


@pytest.mark.parametrize("destination", ["../x", "/abs/x", "a/../../x", ".", ""])
def test_place_source_refuses_escaping_destinations(tmp_path: Path, destination: str) -> None:
    fetched = tmp_path / "f"
    fetched.write_bytes(b"x")
    build = tmp_path / "build"
    build.mkdir()
    with pytest.raises(FetchError, match="destination"):
        place_source(fetched, build, destination)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "f"]


def test_place_source_refuses_symlinked_parent_leading_out(tmp_path: Path) -> None:
    fetched = tmp_path / "f"
    fetched.write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    build = tmp_path / "build"
    build.mkdir()
    (build / "link").symlink_to(outside)
    with pytest.raises(FetchError, match="through a symlink"):
        place_source(fetched, build, "link/sub/f")
    assert list(outside.iterdir()) == []


def test_place_local_copies_tree_keeping_symlinks(tmp_path: Path) -> None:
    project = tmp_path / "project"
    tree = project / "runtime" / "init"
    (tree / "sub").mkdir(parents=True)
    (tree / "init.c").write_text("int main(void) { return 0; }\n")
    (tree / "build.sh").write_text("#!/bin/sh\n")
    (tree / "build.sh").chmod(0o755)
    (tree / "sub" / "inner").symlink_to("../init.c")
    (tree / "passwd").symlink_to("/etc/passwd")
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref\n")
    build = tmp_path / "build"
    build.mkdir()
    placed = place_local(project, Source(destination="init", path="runtime/init"), build)
    assert (placed / "init.c").read_text() == (tree / "init.c").read_text()
    assert os.access(placed / "build.sh", os.X_OK)
    assert os.readlink(placed / "sub" / "inner") == "../init.c"
    assert os.readlink(placed / "passwd") == "/etc/passwd"  # copied as a link, never followed
    assert not (placed / ".git").exists()  # hidden dirs are not in the key, so not in the build


def test_place_local_single_file_and_errors(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "config").write_text("CONFIG_X=y\n")
    (project / "escape").symlink_to(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    placed = place_local(project, Source(destination="conf/.config", path="config"), build)
    assert placed.read_text() == "CONFIG_X=y\n"
    with pytest.raises(FetchError, match="does not exist"):
        place_local(project, Source(destination="x", path="missing"), build)
    with pytest.raises(FetchError, match="leads out of the project"):
        place_local(project, Source(destination="x", path="escape"), build)
    with pytest.raises(FetchError, match="destination"):
        place_local(project, Source(destination="../x", path="config"), build)


def test_fetch_refuses_local_and_malformed_sources(cache: Path) -> None:
    with pytest.raises(FetchError, match="is local"):
        fetcher(cache).fetch(Source(destination="x", path="runtime"))
    with pytest.raises(FetchError, match="malformed sha256"):
        fetcher(cache).fetch(Source(destination="x", url="http://example.org/x", sha256="../../etc/passwd"))
