"""kiln build --check's comparison of two manifests and its first-differing-byte finder (pure functions;
the whole check runs for real in tests/integration/test_check.py)."""

from __future__ import annotations

from pathlib import Path

from kiln.build.check import FileDifference, compare, first_difference, keep_evidence
from kiln.build.store.manifest import FileRecord


def record(
    path: str, kind: str = "file", mode: int = 0o644, size: int = 1, sha: str = "a", target: str = ""
) -> FileRecord:
    return FileRecord(path, kind, mode, size if kind == "file" else 0, sha if kind == "file" else None, target or None)


def test_every_kind_of_difference_is_named_by_path() -> None:
    stored = [
        record("bin"),
        record("gone"),
        record("link", "symlink", 0o777, target="a"),
        record("mode"),
        record("kind"),
    ]
    rebuilt = [
        record("bin", sha="b"),
        record("link", "symlink", 0o777, target="b"),
        record("mode", mode=0o755),
        record("new"),
        record("kind", "dir", 0o755),
    ]
    assert compare(stored, rebuilt) == [
        FileDifference("bin", ["sha256 b, expected a"]),
        FileDifference("gone", ["only in the stored output"]),
        FileDifference("kind", ["a dir, stored as a file"]),
        FileDifference("link", ["symlink to 'b', expected 'a'"]),
        FileDifference("mode", ["mode 0755, expected 0644"]),
        FileDifference("new", ["only in the rebuild"]),
    ]
    assert compare(stored, stored) == []


def test_the_first_differing_byte_across_chunks_and_lengths(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 100_000)
    b.write_bytes(b"x" * 70_000 + b"y" + b"x" * 29_999)
    assert first_difference(a, b, chunk=4096) == 70_000
    b.write_bytes(b"x" * 100_000)
    assert first_difference(a, b) is None
    b.write_bytes(b"x" * 99_000)
    assert first_difference(a, b, chunk=4096) == 99_000


def test_the_evidence_is_copied_without_following_a_rebuilds_links(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A rebuild that puts a link where the stored tree has a directory (etc -> a host directory) gets
    no host file copied into the evidence; a real difference beside it is kept, with its offset."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host only\n")
    stored, rebuilt = tmp_path / "stored", tmp_path / "rebuilt"
    for tree, data in ((stored, "abc"), (rebuilt, "abd")):
        (tree / "bin").mkdir(parents=True)
        (tree / "bin" / "tool").write_text(data)
    (stored / "etc").mkdir()
    (stored / "etc" / "secret").write_text("stored\n")
    (rebuilt / "etc").symlink_to(host)
    found = [
        FileDifference("bin/tool", ["sha256 differs"]),
        FileDifference("etc/secret", ["only in the stored output"]),
    ]

    kept = keep_evidence("pkg", "k" * 64, stored, rebuilt, found)

    assert (kept / "rebuilt" / "bin" / "tool").read_text() == "abd"
    assert found[0].first_offset == 2
    assert not (kept / "rebuilt" / "etc").exists() and not (kept / "stored" / "etc").exists()
    assert found[1].first_offset is None
    assert not [p for p in kept.rglob("*") if p.is_file() and p.read_text(errors="replace") == "host only\n"]
