"""The store on a real filesystem with real processes: atomic publish, locking, crash safety, gc."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.build.store import Entry, FileRecord, Store, read_manifest
from kiln.core.errors import BuildError, InputError, KilnError
from kiln.core.sizes import parse_size

SDE = 1_704_067_200
KEY = "a" * 64


def fill(tree: Path, reverse: bool = False) -> None:
    """A small tree with every kind of path the store records; `reverse` creates it in another order."""
    steps: list[Callable[[], object]] = [
        lambda: (tree / "bin").mkdir(),
        lambda: (tree / "bin" / "tool").write_text("#!/bin/sh\necho hi\n"),
        lambda: (tree / "bin" / "tool").chmod(0o755),
        lambda: (tree / "etc").mkdir(),
        lambda: (tree / "etc" / "conf").write_text("x = 1\n"),
        lambda: (tree / "etc" / "link").symlink_to("conf"),
        lambda: os.link(tree / "etc" / "conf", tree / "etc" / "hard"),
        lambda: (tree / "empty").mkdir(),
        lambda: (tree / "data.bin").write_bytes(bytes(range(256)) * 4000),
    ]
    if reverse:
        # same tree, different creation order (directories still first)
        steps = steps[:3] + steps[7:] + steps[3:7]
    for step in steps:
        step()


def build(store: Store, key: str, reverse: bool = False, name: str = "pkg") -> Entry:
    staging = store.staging(key)
    fill(staging / "tree", reverse)
    return store.commit(key, staging, name, {"version": "1"}, SDE)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(root: Path) -> list[str]:
    """Whatever is left in tmp/ and locks/: both must be empty when nothing runs."""
    dirs = [root / "tmp", root / "locks"]
    return sorted(str(p.relative_to(root)) for d in dirs if d.is_dir() for p in d.iterdir())


def child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)


def test_commit_has_verify_clean(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert not store.has(KEY)
    entry = build(store, KEY)
    assert store.has(KEY)
    assert entry.path == tmp_path / "store" / KEY
    assert entry.tree == store.tree(KEY) == entry.path / "tree"
    assert (entry.name, entry.meta, entry.files) == ("pkg", {"version": "1"}, 5)
    assert entry.size == len("#!/bin/sh\necho hi\n") + 2 * len("x = 1\n") + 256 * 4000
    assert store.verify(KEY) == []
    records = {r.path: r for r in read_manifest(entry.path / "manifest.json")}
    assert records["bin/tool"].mode == 0o755
    assert records["etc/link"] == FileRecord("etc/link", "symlink", 0o777, 0, None, "conf")
    assert records["etc/hard"].sha256 == records["etc/conf"].sha256 is not None
    assert records["empty"].type == "dir"
    meta = json.loads((entry.path / "meta.json").read_text())
    assert (meta["key"], meta["name"], meta["size"], meta["files"]) == (KEY, "pkg", entry.size, 5)
    assert [e.key for e in store.entries()] == [KEY]
    assert leftovers(tmp_path) == []


def test_default_root_is_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    build(Store(), KEY)
    assert (tmp_path / "cache" / "store" / KEY / "tree" / "bin" / "tool").is_file()


def test_verify_reports_each_kind_of_tampering(tmp_path: Path) -> None:
    store = Store(tmp_path)
    tree = build(store, KEY).tree
    (tree / "bin" / "tool").write_text("#!/bin/sh\necho HI\n")  # same size and mode, other content
    (tree / "etc" / "conf").chmod(0o600)
    (tree / "data.bin").write_bytes(b"short")
    (tree / "extra").write_text("new")
    (tree / "etc" / "hard").unlink()
    (tree / "etc" / "link").unlink()
    (tree / "etc" / "link").symlink_to("elsewhere")
    (tree / "empty").rmdir()
    (tree / "empty").write_text("")
    old, new = b"#!/bin/sh\necho hi\n", b"#!/bin/sh\necho HI\n"
    assert store.verify(KEY) == [
        f"bin/tool: sha256 {sha(new)}, expected {sha(old)}",
        "data.bin: size 5, expected 1024000",
        f"data.bin: sha256 {sha(b'short')}, expected {sha(bytes(range(256)) * 4000)}",
        "empty: is a file, expected a dir",
        "etc/conf: mode 0600, expected 0644",
        "etc/hard: missing",
        "etc/link: symlink to 'elsewhere', expected 'conf'",
        "extra: unexpected file",
    ]


def test_mtimes_clamped_owner_root_and_manifest_deterministic(tmp_path: Path) -> None:
    one, two = Store(tmp_path / "one"), Store(tmp_path / "two")
    stagings = [one.staging("k1"), two.staging("k2")]
    for index, staging in enumerate(stagings):
        tree = staging / "tree"
        fill(tree, reverse=index == 1)
        (tree / "old").write_text("old")
        os.utime(tree / "old", (SDE - 100, SDE - 100))
        os.utime(tree / "etc" / "link", (SDE + 10**6 * (index + 1),) * 2, follow_symlinks=False)
        os.utime(tree / "empty", (SDE + 5,) * 2)
        if os.geteuid() == 0:
            os.chown(tree / "bin" / "tool", 1000, 1000)
            (tree / "bin" / "tool").chmod(0o4755)
    entries = [one.commit("k1", stagings[0], "pkg", {}, SDE), two.commit("k2", stagings[1], "pkg", {}, SDE)]
    manifests = [(e.path / "manifest.json").read_bytes() for e in entries]
    assert manifests[0] == manifests[1]
    tree = entries[0].tree
    for path in [tree, *tree.rglob("*")]:
        info = path.lstat()
        assert info.st_mtime <= SDE, path
        if os.geteuid() == 0:
            assert (info.st_uid, info.st_gid) == (0, 0), path
    assert (tree / "old").stat().st_mtime == SDE - 100
    if os.geteuid() == 0:
        assert stat.S_IMODE((tree / "bin" / "tool").stat().st_mode) == 0o4755  # chown must not drop setuid
    assert one.verify("k1") == []


def test_special_files_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    staging = store.staging(KEY)
    os.mkfifo(staging / "tree" / "pipe")
    with pytest.raises(BuildError, match=r"fifo.*pipe"):
        store.commit(KEY, staging, "pkg", {}, SDE)
    assert not store.has(KEY)
    assert not staging.exists()
    assert leftovers(tmp_path) == []


def test_second_commit_of_a_key_returns_the_first(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first, second = store.staging(KEY), store.staging(KEY)
    (first / "tree" / "f").write_text("first")
    (second / "tree" / "f").write_text("second")
    store.commit(KEY, first, "pkg", {}, SDE)
    entry = store.commit(KEY, second, "pkg", {}, SDE)
    assert (entry.tree / "f").read_text() == "first"
    assert not second.exists()
    assert leftovers(tmp_path) == []


def test_commit_needs_a_staging_dir_of_this_store(tmp_path: Path) -> None:
    (tmp_path / "elsewhere" / "tree").mkdir(parents=True)
    with pytest.raises(KilnError, match="not a staging dir"):
        Store(tmp_path).commit(KEY, tmp_path / "elsewhere", "pkg", {}, SDE)
    with pytest.raises(KilnError, match="not a staging dir"):
        Store(tmp_path).commit(KEY, tmp_path / "tmp" / "x", "pkg", {}, SDE)


@pytest.mark.parametrize("key", ["", "../etc", "a.b", "a/b", "x" * 129])
def test_bad_keys_are_input_errors(tmp_path: Path, key: str) -> None:
    with pytest.raises(InputError, match="invalid store key"):
        Store(tmp_path).has(key)


def test_missing_entry(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(KilnError, match="no store entry"):
        store.entry(KEY)
    with pytest.raises(KilnError, match="no store entry"):
        store.tree(KEY)
    assert store.entries() == []


def test_hold_staging_lock_discards_on_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    staging = store.staging(KEY)
    with pytest.raises(RuntimeError), store.hold_staging_lock(staging):
        (staging / "tree" / "f").write_text("x")
        raise RuntimeError("build failed")
    assert not staging.exists()
    with store.hold_staging_lock(store.staging(KEY)) as staging:
        (staging / "tree" / "f").write_text("x")
        store.commit(KEY, staging, "pkg", {}, SDE)
    assert store.has(KEY)
    assert leftovers(tmp_path) == []


def test_staging_dirs_are_owned_by_one_store_at_a_time(tmp_path: Path) -> None:
    first, second = Store(tmp_path), Store(tmp_path)
    staging = first.staging(KEY)
    with pytest.raises(KilnError, match="another running build"):
        second.commit(KEY, staging, "pkg", {}, SDE)
    (staging / "work").mkdir()
    with pytest.raises(BuildError, match="more than tree/: work"):
        first.commit(KEY, staging, "pkg", {}, SDE)
    assert not staging.exists() and not first.has(KEY)
    staging = first.staging(KEY)
    first.discard(staging)
    staging.mkdir()
    (staging / "tree").mkdir()
    second.commit(KEY, staging, "pkg", {}, SDE)  # a dead builder's dir can be adopted
    assert second.has(KEY)
    assert leftovers(tmp_path) == []


RACE = """
    import sys, time
    from pathlib import Path
    from kiln.build.store import Store
    root, counter, locked, go = (Path(a) for a in sys.argv[1:5])
    store = Store(root)
    key = "k" * 64
    with store.lock(key):
        locked.touch()
        while not go.exists():
            time.sleep(0.01)
        if not store.has(key):
            with counter.open("a") as f:
                f.write("built\\n")
            staging = store.staging(key)
            (staging / "tree" / "out").write_text("result")
            store.commit(key, staging, "pkg", {}, 0)
    print(store.has(key), (store.tree(key) / "out").read_text())
"""


@pytest.mark.timeout(60)
def test_two_processes_build_a_key_once(tmp_path: Path) -> None:
    root, counter, go = tmp_path / "cache", tmp_path / "counter", tmp_path / "go"
    first = child(RACE, str(root), str(counter), str(tmp_path / "locked1"), str(go))
    wait_for(tmp_path / "locked1", first)
    second = child(RACE, str(root), str(counter), str(tmp_path / "locked2"), str(go))
    time.sleep(0.5)
    assert second.poll() is None and not (tmp_path / "locked2").exists()  # blocked on the lock
    go.touch()
    outs = [p.communicate(timeout=30) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert [out for out, _ in outs] == ["True result\n"] * 2
    assert counter.read_text() == "built\n"
    assert leftovers(root) == []


CRASH = """
    import os, sys, time
    from pathlib import Path
    from kiln.build import store as S
    from kiln.build.store import manifest as M
    root, stage, marker = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])

    def hang(*args: object, **kwargs: object) -> None:
        marker.touch()
        time.sleep(600)

    store = S.Store(root)
    staging = store.staging("k" * 64)
    for i in range(50):
        (staging / "tree" / f"f{i}").write_text(str(i) * 1000)
    if stage == "staging":
        hang()
    elif stage == "hashing":
        M.file_sha256 = hang  # what the manifest walk hashes with
    elif stage == "rename":
        os.rename = hang
    store.commit("k" * 64, staging, "pkg", {}, 0)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["staging", "hashing", "rename"])
def test_sigkill_leaves_no_partial_entry(tmp_path: Path, stage: str) -> None:
    key, marker = "k" * 64, tmp_path / "marker"
    store = Store(tmp_path / "cache")
    proc = child(CRASH, str(store.root), stage, str(marker))
    wait_for(marker, proc)
    [staging] = (store.root / "tmp").iterdir()
    assert staging.name.startswith(f"{key}.{proc.pid}.")
    assert (staging / "manifest.json").exists() == (stage == "rename")
    assert store.gc(None) == [] and staging.exists()  # the builder is alive: its staging dir stays
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not store.has(key) and not (store.root / "store" / key).exists()
    assert store.clean_tmp() == [staging.name]
    assert leftovers(store.root) == []
    build(store, key)
    assert store.verify(key) == []


def test_gc_keeps_a_live_staging_dir_of_this_process(tmp_path: Path) -> None:
    builder = Store(tmp_path)
    staging = builder.staging(KEY)
    assert Store(tmp_path).gc(None) == []
    assert Store(tmp_path).clean_tmp() == []
    assert staging.exists()
    builder.discard(staging)
    (tmp_path / "locks" / f"{KEY}.1.0123456789abcdef.lock").touch()  # died between lock and mkdir
    (tmp_path / "tmp" / "shell-x").mkdir()  # not the store's: left alone
    assert Store(tmp_path).clean_tmp() == []
    assert leftovers(tmp_path) == ["tmp/shell-x"]


def sized(store: Store, key: str, size: int, last_used: float) -> None:
    staging = store.staging(key)
    (staging / "tree" / "blob").write_bytes(b"x" * size)
    entry = store.commit(key, staging, key, {}, SDE)
    os.utime(entry.path / "last-used", (last_used, last_used))


def test_gc_evicts_least_recently_used_and_respects_keep_and_locks(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for index, key in enumerate(["a", "b", "c", "d"]):
        sized(store, key, 1000, 1000.0 + index)
    assert store.gc(None) == []
    assert [e.key for e in store.entries()] == ["a", "b", "c", "d"]
    with store.lock("b"):  # held: as if a build were reading or writing it
        assert store.gc(2500, keep={"a"}) == ["c", "d"]
    assert [e.key for e in store.entries()] == ["a", "b"]
    sized(store, "c", 1000, 5000.0)
    store.touch("a")  # now the newest
    assert store.entry("a").last_used > store.entry("c").last_used
    assert store.gc(1000) == ["b", "c"]
    assert [e.key for e in store.entries()] == ["a"]
    assert store.gc(0, keep={"a"}) == []
    assert leftovers(tmp_path) == []


def test_remove(tmp_path: Path) -> None:
    store = Store(tmp_path)
    build(store, KEY)
    with store.use(KEY) as entry, store.use(KEY):  # shared: readers do not block each other
        assert entry.key == KEY
        with pytest.raises(KilnError, match="in use"):
            store.remove(KEY)
    store.remove(KEY)
    assert not store.has(KEY) and not (tmp_path / "store" / KEY).exists()
    assert leftovers(tmp_path) == []
    with pytest.raises(InputError, match="no store entry"):
        store.remove(KEY)


def test_resolve_key_prefixes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    build(store, "abc1")
    build(store, "abc2")
    assert store.resolve("abc1") == "abc1"
    with pytest.raises(InputError, match="ambiguous"):
        store.resolve("abc")
    with pytest.raises(InputError, match="no store entry"):
        store.resolve("zzz")


def test_unreadable_meta_is_listed_and_reported(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = build(store, KEY)
    (entry.path / "meta.json").write_text("{")
    [listed] = store.entries()
    assert listed.name == "?"
    assert any(p.startswith("meta.json: unreadable") for p in store.verify(KEY))


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        ("0", 0),
        ("10G", 10 << 30),
        ("500M", 500 << 20),
        ("1.5GiB", 3 << 29),
        ("2k", 2048),
        ("1GB", 10**9),
        ("1.5 MB", 1_500_000),
        (" 7b ", 7),
        (".5K", 512),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1G", "1.2.3", "10X", "1e3", "nan", "inf", "10 G B"])
def test_parse_size_rejects_junk(text: str) -> None:
    with pytest.raises(InputError, match="invalid size"):
        parse_size(text)
