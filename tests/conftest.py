"""Shared helpers: write package trees and run the real CLI in-process."""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln import __version__
from kiln.cli import main
from kiln.core.release_version import VERSION_ENV
from tests.prebuild import Background, start, wanted

# One release version for every test, whatever commit is checked out: without it the version is
# the git describe of this repository (core.release_version), which moves with every commit and
# would rebuild machined, init and fhs in every run. tests/unit/test_release_version.py tests the
# git describe default in a repository of its own.
os.environ.setdefault(VERSION_ENV, __version__)

SHA = "7d5b0b6062521e4627e099e4c9dc8248d32a30285e959b7eecaa780cf8cfd4a4"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (path -> text, dedented) below root/pkgs and return that pkgs dir."""
    pkgs = root / "pkgs"
    for rel, text in files.items():
        path = pkgs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return pkgs


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def kiln(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run `kiln ARGS` in tmp_path; paths in messages come out relative to it."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


# The arm64 end-to-end tests run last in their tier, and what later tests build starts in the
# background at once (tests/prebuild.py): the core a TCG boot or a single-threaded step leaves
# idle builds it.
ARM64_E2E = "tests/e2e/test_arm64.py"
_background: Background | None = None


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the arm64 boots behind the other e2e tests (stable otherwise)."""
    e2e = [i for i, item in enumerate(items) if _module_of(item).startswith("tests/e2e/")]
    if not e2e:
        return
    tier = items[e2e[0] : e2e[-1] + 1]
    tier.sort(key=lambda item: _module_of(item) == ARM64_E2E)
    items[e2e[0] : e2e[-1] + 1] = tier


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the prebuilds the selected tests need (make test's lanes: each for its own tests)."""
    global _background
    if session.config.option.collectonly:
        return
    out = Path(tempfile.mkdtemp(prefix="kiln-prebuild-out-"))
    _background = start(wanted({_module_of(item) for item in session.items}, out))
    if _background is not None:
        print(f"\nprebuild: building in the background (log {_background.log})", flush=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _background is not None:
        _background.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _background is not None:
        terminalreporter.write_sep("-", "background prebuilds")
        for line in _background.summary() or ["prebuild: (nothing finished)"]:
            terminalreporter.write_line(line)
