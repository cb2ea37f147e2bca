"""finalize makes its output directory when the caller has not (the kernel config tool relies on it)."""

from __future__ import annotations

from pathlib import Path

from kiln.core.treecopy import finalize_tree


def test_finalize_makes_a_missing_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "obj").mkdir(parents=True)
    (root / "obj" / ".config").write_text("CONFIG_X=y\n")
    out = tmp_path / "work" / "out"
    finalize_tree(root, [("/obj/.config", "/config")], out)
    assert (out / "config").read_text() == "CONFIG_X=y\n"
