"""`kiln cache ls|verify|gc|rm` against a real store in a temporary directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.build.store import Store
from tests.conftest import Result


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    store = Store(tmp_path / "cache")
    for name, key, size in (("zlib", "a" * 64, 1000), ("musl", "b" * 64, 3000)):
        staging = store.staging(key)
        (staging / "tree" / "data").write_bytes(b"x" * size)
        store.commit(key, staging, name, {}, 1704067200)
    return store


def test_ls(store: Store, kiln: Callable[..., Result]) -> None:
    listing = json.loads(kiln("cache", "ls", "--json").out)
    assert [(e["name"], e["files"]) for e in sorted(listing, key=lambda e: e["name"])] == [("musl", 1), ("zlib", 1)]
    text = kiln("cache", "ls").out.splitlines()
    assert text[0] == "name\tkey\tfiles\tsize"
    assert text[1].startswith("musl\tbbbbbbbbbbbbbbbb\t")


def test_verify_reports_damage_and_exits_1(store: Store, kiln: Callable[..., Result]) -> None:
    assert kiln("cache", "verify").out.strip() == "verified 2 entries: 0 damaged"
    (store.tree("a" * 64) / "data").write_bytes(b"tampered")
    result = kiln("cache", "verify")
    assert result.code == 1
    assert result.err.startswith("zlib aaaaaaaaaaaaaaaa: ")
    assert kiln("cache", "verify", "musl").code == 0
    as_json = kiln("cache", "verify", "--json")
    report = json.loads(as_json.out)
    assert as_json.code == 1 and report["ok"] is False and report["entries"] == 2
    assert {(d["name"], d["key"]) for d in report["damaged"]} == {("zlib", "a" * 64)} and as_json.err == ""


def test_rm_by_name_and_prefix(store: Store, kiln: Callable[..., Result]) -> None:
    assert json.loads(kiln("cache", "rm", "zlib", "--json").out) == {"removed": [{"name": "zlib", "key": "a" * 64}]}
    assert not store.has("a" * 64)
    assert kiln("cache", "rm", "bbbbbbbb").code == 0
    assert store.entries() == []
    missing = kiln("cache", "rm", "nothing")
    assert (missing.code, missing.err.strip()) == (2, "no store entry matches 'nothing' (see kiln cache ls)")


def test_gc_max_size_evicts_least_recently_used(store: Store, kiln: Callable[..., Result]) -> None:
    store.touch("b" * 64)  # musl used last
    assert kiln("cache", "gc", "--max-size", "3500").out.strip() == "removed 1 entries"
    assert [e.name for e in store.entries()] == ["musl"]
    bad = kiln("cache", "gc", "--max-size", "lots")
    assert bad.code == 2
