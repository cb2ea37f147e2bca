"""docs/architecture.md's picture of the rooms is made from the real import graph and kept current."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def rooms() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rooms", ROOT / "scripts" / "rooms.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_picture_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "rooms.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_picture_shows_each_crossing_and_no_upward_one() -> None:
    edges: set[tuple[str, str]] = rooms().room_imports()
    assert ("build", "pkg") in edges and ("pkg", "core") in edges
    order = ["cli", "installer", "image", "rootfs", "build", "pkg", "core"]
    for a, b in edges:
        if a in order and b in order:
            assert order.index(a) < order.index(b), f"{a} imports {b}, a room above it"
    assert not any(a == "core" for a, _ in edges), "core imports no other room"


def test_a_new_import_makes_the_picture_stale() -> None:
    module = rooms()
    text = module.DOC.read_text()
    edges = module.room_imports()
    edges.add(("core", "pkg"))
    assert module.replace_block(text, module.block(edges)) != text


def test_no_module_is_over_400_lines_without_saying_why() -> None:
    import ast

    for path in sorted((ROOT / "src" / "kiln").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 400:
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert "Over 400 lines" in doc, f"{path.relative_to(ROOT)}: split it, or say at its top why not"


def test_no_function_is_over_80_lines() -> None:
    """From `def` to the end of its body: a longer function is split into named steps."""
    import ast

    long = []
    for path in sorted((ROOT / "src" / "kiln").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long
