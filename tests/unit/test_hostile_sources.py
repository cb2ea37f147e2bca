"""Hostile sources: tampered cache files, archives GNU tar reads differently, stale partial downloads.

Archives are built with tarfile/zipfile (corrupt headers by hand); GNU tar, zstd and
lzip are the real tools, so each test shows what an extraction would really do.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.build.sources.archives import check_archive
from kiln.build.sources.cache import remove_stale_partials, stale_partials, verify_sources
from kiln.build.sources.download import Fetcher
from kiln.build.sources.errors import FetchError
from kiln.build.sources.mirrors import Mirror
from kiln.build.sources.place import place_local
from kiln.pkg.model import Source
from tests.conftest import Result


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def tar_bytes(members: list[tarfile.TarInfo]) -> bytes:
    """A plain tar of `members` (regular files get a short content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            data = b"content\n" if member.isreg() else b""
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return buffer.getvalue()


# --- the cached source is verified again before use ----------------------------------------------------------------


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    directory = tmp_path / "mirror"
    directory.mkdir()
    return directory


def cached(tmp_path: Path, mirror: Path, data: bytes, name: str = "pkg.tar") -> tuple[Fetcher, Source, Path]:
    """A fetcher whose only origin is a local mirror directory holding `data` as `name`."""
    (mirror / name).write_bytes(data)
    source = Source(url=f"http://127.0.0.1:9/{name}", destination=name, sha256=sha(data))
    fetcher = Fetcher(tmp_path / "cache", [Mirror("dir", str(mirror))], retries=0)
    return fetcher, source, fetcher.fetch(source)


def overwrite(path: Path, data: bytes, keep_mtime: bool = True) -> None:
    """Replace a cached file's bytes as an attacker with write access would, hiding the mtime change."""
    before = path.stat()
    path.chmod(0o644)
    path.write_bytes(data)
    path.chmod(0o444)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_tampered_cached_source_is_refetched_not_used(tmp_path: Path, mirror: Path) -> None:
    good = tar_bytes([entry("pkg/"), entry("pkg/f")])
    fetcher, source, path = cached(tmp_path, mirror, good)
    evil = tar_bytes([entry("pkg/"), entry("pkg/g")])
    evil = evil[: len(good)].ljust(len(good), b"\0")  # same size, same mtime: only ctime and the hash differ
    overwrite(path, evil)
    assert fetcher.fetch(source).read_bytes() == good


def test_tampered_cached_source_without_origin_is_removed_and_reported(tmp_path: Path, mirror: Path) -> None:
    fetcher, source, path = cached(tmp_path, mirror, b"pinned bytes\n")
    (mirror / "pkg.tar").unlink()
    overwrite(path, b"other bytes!\n")
    with pytest.raises(FetchError, match="cannot fetch"):
        fetcher.fetch(source)
    assert not path.exists()
    assert not path.with_name(path.name + ".verified").exists()


def test_forged_stamp_is_not_trusted_for_another_stat(tmp_path: Path, mirror: Path) -> None:
    fetcher, source, path = cached(tmp_path, mirror, b"pinned bytes\n")
    stamp = path.with_name(path.name + ".verified")
    before = stamp.read_text()
    overwrite(path, b"other bytes!\n")
    stamp.write_text(before)  # the old stamp says "verified", but for the old inode change time
    assert fetcher.fetch(source).read_bytes() == b"pinned bytes\n"


def test_symlink_in_place_of_a_cached_source_is_replaced(tmp_path: Path, mirror: Path) -> None:
    fetcher, source, path = cached(tmp_path, mirror, b"pinned bytes\n")
    secret = tmp_path / "secret"
    secret.write_text("host secret\n")
    path.unlink()
    path.symlink_to(secret)
    assert fetcher.fetch(source).read_bytes() == b"pinned bytes\n"
    assert not path.is_symlink()


def test_source_swapped_after_verification_never_reaches_the_build(tmp_path: Path, mirror: Path) -> None:
    from kiln.build.sources.place import place_source

    fetcher, source, path = cached(tmp_path, mirror, b"pinned bytes\n")
    verified = fetcher.fetch(source)
    overwrite(verified, b"other bytes!\n")  # between fetch() and the copy into the build root
    build = tmp_path / "build"
    build.mkdir()
    with pytest.raises(FetchError, match="changed after it was verified"):
        place_source(verified, build, "pkg.tar")
    assert list(build.iterdir()) == [] and not path.exists()
    assert place_source(fetcher.fetch(source), build, "pkg.tar").read_bytes() == b"pinned bytes\n"


def test_untouched_cached_source_is_not_hashed_again(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetcher, source, path = cached(tmp_path, mirror, b"pinned bytes\n")
    import kiln.build.sources.cache as source_cache  # where a cached file is judged

    def no_hash(path: Path, **kwargs: object) -> str:
        raise AssertionError("hashed again although the stat stamp matches")

    monkeypatch.setattr(source_cache, "file_sha256", no_hash)
    assert fetcher.fetch(source) == path


def test_cache_verify_rehashes_sources_and_reports(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch, kiln: Callable[..., Result]
) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    _, _, good = cached(tmp_path, mirror, b"good source\n", "a.txt")
    _, _, bad = cached(tmp_path, mirror, b"will be damaged\n", "b.txt")
    result = kiln("cache", "verify")
    assert result.code == 0 and "verified 2 sources: 0 damaged" in result.out
    # Damage that keeps size, mtime and the stamp: only a full hash can tell.
    stamp = bad.with_name(bad.name + ".verified")
    stamp_text = stamp.read_text()
    overwrite(bad, b"will be DAMAGED\n")
    stamp.write_text(stamp_text.split()[0] + " " + " ".join(_stat_fields(bad)) + "\n")
    result = kiln("cache", "verify")
    assert result.code == 1
    assert f"source {bad.name} has sha256 {sha(b'will be DAMAGED' + bytes([10]))}" in result.err
    assert "verified 2 sources: 1 damaged" in result.out
    assert not bad.exists() and good.exists()


def _stat_fields(path: Path) -> list[str]:
    info = os.lstat(path)
    return [str(v) for v in (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)]


# --- tar read to the end ------------------------------------------------------------------------------------------


def corrupt_after_first(members: list[tarfile.TarInfo]) -> bytes:
    """A tar whose second header has a broken checksum: tarfile stops there, GNU tar skips it."""
    data = bytearray(tar_bytes(members))
    first = members[0]
    second = 512 + (0 if not first.isreg() else 512)
    data[second + 148 : second + 156] = b"0000000\0"  # checksum that cannot match
    return bytes(data)


def test_corrupt_header_followed_by_evil_link_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "pkg.tar"
    archive.write_bytes(
        corrupt_after_first(
            [
                entry("pkg/", tarfile.DIRTYPE),
                entry("pkg/hidden", tarfile.DIRTYPE),
                entry("pkg/passwd", tarfile.SYMTYPE, "/etc/passwd"),
            ]
        )
    )
    # What an extraction does: GNU tar skips the bad header and makes the link.
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(out)], capture_output=True, check=False)
    assert os.readlink(out / "pkg/passwd") == "/etc/passwd"
    with pytest.raises(FetchError, match=r"unreadable tar header at byte 512, after 1 members"):
        check_archive(archive)


def test_truncated_member_data_is_refused(tmp_path: Path) -> None:
    data = tar_bytes([entry("pkg/", tarfile.DIRTYPE), entry("pkg/file")])
    archive = tmp_path / "cut.tar"
    archive.write_bytes(data[: 512 * 2 + 4])
    with pytest.raises(FetchError, match=r"cannot read archive cut\.tar"):
        check_archive(archive)


def test_data_after_end_marker_is_refused(tmp_path: Path) -> None:
    good = tar_bytes([entry("pkg/f")])
    evil = tar_bytes([entry("evil", tarfile.SYMTYPE, "/etc")])
    archive = tmp_path / "two.tar"
    archive.write_bytes(good[:2048] + evil)  # the end marker, then another archive (`tar -i` would unpack it)
    with pytest.raises(FetchError, match="data after the end-of-archive marker"):
        check_archive(archive)


def test_plain_files_and_compressed_plain_files_are_no_archive(tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a\n+++ b\n")
    assert check_archive(patch) is None
    gz = tmp_path / "fix.patch.gz"
    subprocess.run(["gzip", "-k", str(patch)], check=True)
    assert check_archive(gz) is None
    assert check_archive(_write(tmp_path / "ok.tar", tar_bytes([entry("pkg/f")]))) == "tar"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_control_characters_in_names_are_refused(tmp_path: Path) -> None:
    archive = _write(tmp_path / "ctl.tar", tar_bytes([entry("pkg/a\nb")]))
    with pytest.raises(FetchError, match="control character"):
        check_archive(archive)


# --- every format tar (or unzip) would take ------------------------------------------------------------------------


EVIL = [entry("pkg/", tarfile.DIRTYPE), entry("pkg/passwd", tarfile.SYMTYPE, "/etc/passwd")]
BENIGN = [entry("pkg/", tarfile.DIRTYPE), entry("pkg/f"), entry("pkg/l", tarfile.SYMTYPE, "f")]


def compressed(tmp_path: Path, tool: str, members: list[tarfile.TarInfo]) -> Path:
    plain = _write(tmp_path / f"{tool}-{len(members)}.tar", tar_bytes(members))
    subprocess.run([tool, "-q", str(plain)], check=True)
    return plain.with_name(plain.name + {"zstd": ".zst", "lzip": ".lz"}[tool])


@pytest.mark.parametrize("tool", ["zstd", "lzip"])
def test_tools_decompress_what_python_cannot(tmp_path: Path, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    assert check_archive(compressed(tmp_path, tool, BENIGN)) == "tar"
    with pytest.raises(FetchError, match="'pkg/passwd' is a symlink"):
        check_archive(compressed(tmp_path, tool, EVIL))


def test_lzma_alone_is_checked_as_gnu_tar_reads_it(tmp_path: Path) -> None:
    import lzma

    archive = _write(tmp_path / "evil.tar.lzma", lzma.compress(tar_bytes(EVIL), format=lzma.FORMAT_ALONE))
    if shutil.which("lzma"):
        out = tmp_path / "out"
        out.mkdir()
        subprocess.run(["tar", "-xf", str(archive), "-C", str(out)], check=False)  # the suffix is enough for tar
        assert os.readlink(out / "pkg/passwd") == "/etc/passwd"
    with pytest.raises(FetchError, match="'pkg/passwd' is a symlink"):
        check_archive(archive)


def test_corrupt_zstd_is_refused(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd is not installed")
    good = compressed(tmp_path, "zstd", BENIGN).read_bytes()
    broken = _write(tmp_path / "broken.tar.zst", good[: len(good) - 12] + b"\xff" * 12)
    with pytest.raises(FetchError, match=r"cannot read archive broken\.tar\.zst"):
        check_archive(broken)


def test_missing_tool_is_a_clear_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _write(tmp_path / "x.tar.lz", b"LZIP\x01" + b"\0" * 40)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(FetchError, match=r"lzip-compressed and lzip is not installed"):
        check_archive(archive)


def test_unsupported_compression_is_refused(tmp_path: Path) -> None:
    archive = _write(tmp_path / "old.tar.Z", b"\x1f\x9d\x90" + b"\0" * 64)
    with pytest.raises(FetchError, match="compress-compressed data cannot be inspected"):
        check_archive(archive)


def make_zip(path: Path, members: list[tuple[str, bytes, int]]) -> Path:
    """A zip of (name, data, unix mode) members."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("pkg/../../x", b"x", stat.S_IFREG | 0o644)], "has a '..' component"),
        ([("/etc/cron.d/x", b"x", stat.S_IFREG | 0o644)], "has an absolute path"),
        ([("pkg/passwd", b"/etc/passwd", stat.S_IFLNK | 0o777)], "'pkg/passwd' is a symlink"),
        ([("pkg/up", b"../../x", stat.S_IFLNK | 0o777)], "'pkg/up' is a symlink that points outside"),
        ([("pkg\\..\\..\\x", b"x", stat.S_IFREG | 0o644)], "has a backslash"),
    ],
    ids=["dotdot", "absolute", "symlink-abs", "symlink-up", "backslash"],
)
def test_unsafe_zips_are_refused(tmp_path: Path, members: list[tuple[str, bytes, int]], message: str) -> None:
    with pytest.raises(FetchError, match="unsafe archive") as info:
        check_archive(make_zip(tmp_path / "evil.zip", members))
    assert message in str(info.value)


def test_benign_zip_is_accepted(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "ok.zip",
        [
            ("pkg/", b"", stat.S_IFDIR | 0o755),
            ("pkg/f", b"f", 0o100644),
            ("pkg/l", b"f", stat.S_IFLNK | 0o777),
            ("pkg/top", b"../pkg/f", stat.S_IFLNK | 0o777),
        ],
    )  # unzip strips nothing
    assert check_archive(archive) == "zip"


def test_fetcher_refuses_an_evil_zip(tmp_path: Path, mirror: Path) -> None:
    data = make_zip(tmp_path / "evil.zip", [("pkg/passwd", b"/etc/passwd", stat.S_IFLNK | 0o777)]).read_bytes()
    (mirror / "evil.zip").write_bytes(data)
    fetcher = Fetcher(tmp_path / "cache", [Mirror("dir", str(mirror))], retries=0)
    with pytest.raises(FetchError, match=r"unsafe archive evil\.zip"):
        fetcher.fetch(Source(url="http://127.0.0.1:9/evil.zip", destination="evil.zip", sha256=sha(data)))


# --- --strip-components ----------------------------------------------------------------------------------------------


def test_link_safe_in_place_but_out_once_stripped(tmp_path: Path) -> None:
    archive = _write(
        tmp_path / "strip.tar",
        tar_bytes([entry("pkg-1.0/", tarfile.DIRTYPE), entry("pkg-1.0/up", tarfile.SYMTYPE, "../x")]),
    )
    check_archive(archive, strip_components=0)
    # What the build does with it: the link now points out of the extraction directory.
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(out), "--strip-components=1"], check=True)
    assert os.readlink(out / "up") == "../x"
    with pytest.raises(FetchError, match=r"'pkg-1\.0/up' is a symlink that points outside .* --strip-components=1"):
        check_archive(archive)  # the default checks the levels builds use (0 and 1)


def test_dot_counts_as_a_component_when_stripping(tmp_path: Path) -> None:
    # GNU tar strips "./" as one component: ./pkg/up -> ../x is safe at 1 level, out at 2.
    archive = _write(
        tmp_path / "dot.tar", tar_bytes([entry("./pkg/", tarfile.DIRTYPE), entry("./pkg/up", tarfile.SYMTYPE, "../x")])
    )
    check_archive(archive)
    with pytest.raises(FetchError, match="after --strip-components=2"):
        check_archive(archive, strip_components=2)


def test_link_to_the_top_directory_is_out_once_stripped(tmp_path: Path) -> None:
    archive = _write(
        tmp_path / "hard.tar",
        tar_bytes(
            [
                entry("pkg/", tarfile.DIRTYPE),
                entry("pkg/d", tarfile.SYMTYPE, ".."),
                entry("pkg/f"),
                entry("pkg/h", tarfile.LNKTYPE, "pkg/d/d/f"),
            ]
        ),
    )
    with pytest.raises(FetchError, match=r"'pkg/d' is a symlink that points outside .* --strip-components=1"):
        check_archive(archive)


# --- partial downloads ----------------------------------------------------------------------------------------------


def test_stale_partials_removed_but_a_held_one_survives(tmp_path: Path) -> None:
    sources = tmp_path / "cache" / "sources"
    sources.mkdir(parents=True)
    dead = _write(sources / ".part-dead", b"half a download")
    held = _write(sources / ".part-held", b"a download in progress")
    young = _write(sources / ".part-young", b"just created")
    old = time.time() - 3600
    for path in (dead, held):
        os.utime(path, (old, old))
    with held.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a live download holds its partial file
        assert stale_partials(tmp_path / "cache") == [dead]
        assert remove_stale_partials(tmp_path / "cache") == [dead]
    assert not dead.exists() and held.exists() and young.exists()
    assert remove_stale_partials(tmp_path / "cache", older_than=0) == [held, young]
    (sources / ".part-dir").mkdir()
    (sources / ".part-link").symlink_to(tmp_path)
    assert remove_stale_partials(tmp_path / "cache", older_than=0) == []  # only regular files are partials


def test_a_download_in_progress_holds_its_partial(tmp_path: Path, mirror: Path) -> None:
    from kiln.build.sources.download import _Sink

    (tmp_path / "cache" / "sources").mkdir(parents=True)
    sink = _Sink(tmp_path / "cache" / "sources", "x", None)
    try:
        assert remove_stale_partials(tmp_path / "cache", older_than=0) == []
        assert sink.path.exists()
    finally:
        sink.discard()


def test_cache_gc_removes_stale_partials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kiln: Callable[..., Result]
) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    sources = tmp_path / "cache" / "sources"
    sources.mkdir(parents=True)
    dead = _write(sources / ".part-dead", b"half")
    os.utime(dead, (time.time() - 3600,) * 2)
    result = kiln("cache", "gc")
    assert result.code == 0 and "removed 1 stale partial downloads" in result.out
    assert not dead.exists()


def test_verify_sources_ignores_markers(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    data = b"x"
    _write(sources / sha(data), data)
    _write(sources / (sha(data) + ".checked"), b"ok\n")
    _write(sources / ".part-x", b"")
    assert verify_sources(tmp_path) == (1, [])


# --- registry blobs (remote cache pulls) ------------------------------------------------------------------------------


def zstd_blob(tmp_path: Path, data: bytes) -> Path:
    blob = tmp_path / "tree.tar.zst"
    blob.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout)
    return blob


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (tar_bytes([entry("etc", tarfile.SYMTYPE, "/etc"), entry("etc/cron.d/x")]), "through the symlink 'etc'"),
        (
            tar_bytes([entry("up", tarfile.SYMTYPE, "../.."), entry("x", tarfile.LNKTYPE, "up/etc/shadow")]),
            "hardlink target 'up/etc/shadow' goes through the symlink 'up'",
        ),
        (tar_bytes([entry("/abs")]), "absolute path"),
        (tar_bytes([entry("a/../../b")]), "'..' component"),
        (
            corrupt_after_first(
                [entry("a", tarfile.DIRTYPE), entry("b", tarfile.DIRTYPE), entry("c", tarfile.SYMTYPE, "/etc/passwd")]
            ),
            "unreadable tar header",
        ),
        (tar_bytes([entry("dev/sda", tarfile.BLKTYPE)]), "device node"),
    ],
    ids=["written-through-symlink", "hardlink-through-symlink", "absolute-name", "dotdot", "corrupt-header", "device"],
)
def test_pulled_tree_is_checked_before_it_is_unpacked(tmp_path: Path, data: bytes, message: str) -> None:
    from kiln.build.remote import RemoteError, unpack_tree

    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(RemoteError, match=message):
        unpack_tree(zstd_blob(tmp_path, data), tree, tmp_path)
    assert list(tree.iterdir()) == []


def test_pack_and_unpack_round_trip_without_a_shell(tmp_path: Path) -> None:
    from kiln.build.remote import pack_tree, unpack_tree
    from kiln.build.store import Store

    store = Store(tmp_path / "cache")
    staging = store.staging("c" * 64)
    (staging / "tree" / "bin").mkdir()
    (staging / "tree" / "bin" / "tool").write_bytes(b"tool")
    (staging / "tree" / "lib").symlink_to("bin")
    # a store tree's own links may point anywhere: toolchain-seed's tools link to the seed's binutils
    (staging / "tree" / "bin" / "x86_64-kiln-linux-musl-ar").symlink_to("/usr/bin/ar")
    (staging / "tree" / "bin" / "up").symlink_to("../../..")
    entry_ = store.commit("c" * 64, staging, "tool", {}, 1704067200)
    blob = tmp_path / "tree.tar.zst"
    pack_tree(entry_.tree, blob, "tool")
    tree = tmp_path / "out"
    tree.mkdir()
    unpack_tree(blob, tree, tmp_path)
    assert (tree / "bin" / "tool").read_bytes() == b"tool" and os.readlink(tree / "lib") == "bin"
    assert os.readlink(tree / "bin" / "x86_64-kiln-linux-musl-ar") == "/usr/bin/ar"
    assert os.readlink(tree / "bin" / "up") == "../../.."


def test_verdict_of_the_older_check_is_judged_again(tmp_path: Path, mirror: Path) -> None:
    data = corrupt_after_first(
        [entry("a", tarfile.DIRTYPE), entry("b", tarfile.DIRTYPE), entry("c", tarfile.SYMTYPE, "/etc/passwd")]
    )
    fetcher, _, _ = cached(tmp_path, mirror, b"placeholder")
    (mirror / "evil.tar").write_bytes(data)
    evil = Source(url="http://127.0.0.1:9/evil.tar", destination="evil.tar", sha256=sha(data))
    with pytest.raises(FetchError, match="unreadable tar header"):
        fetcher.fetch(evil)
    marker = fetcher.path_for(sha(data)).with_name(sha(data) + ".checked")
    marker.write_text("ok\n")  # what the check before this one said about it
    with pytest.raises(FetchError, match="unreadable tar header"):
        fetcher.fetch(evil)


def test_a_later_local_source_never_writes_through_a_link_an_earlier_one_placed(tmp_path: Path) -> None:
    """Two local sources onto one destination: the first leaves `x -> <host file>` (a project
    tree may hold any symlink), the second has a file `x`. The host file must stay as it was;
    the build directory gets the second source's file in place of the link."""
    canary = tmp_path / "host-file"
    canary.write_text("host\n")
    project, build = tmp_path / "project", tmp_path / "root" / "build"
    (project / "first").mkdir(parents=True)
    (project / "first" / "x").symlink_to(canary)
    (project / "first" / "sub").mkdir()
    (project / "second" / "sub").mkdir(parents=True)
    (project / "second" / "x").write_text("from the second source\n")
    (project / "second" / "sub" / "f").write_text("nested\n")
    (project / "lone").write_text("a single file\n")
    build.mkdir(parents=True)
    place_local(project, Source(destination="src", path="first"), build)
    assert (build / "src" / "x").is_symlink()
    place_local(project, Source(destination="src", path="second"), build)
    place_local(project, Source(destination="src", path="lone"), build)
    assert canary.read_text() == "host\n"
    assert not (build / "src" / "x").is_symlink()
    assert (build / "src" / "x").read_text() == "from the second source\n"
    assert (build / "src" / "sub" / "f").read_text() == "nested\n"
    assert (build / "src" / "lone").read_text() == "a single file\n"
    assert sorted(p.name for p in build.parent.iterdir()) == ["build"], "the staging copy was left behind"
