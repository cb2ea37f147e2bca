"""Shared helpers: write package trees and run the real CLI in-process."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln import __version__
from kiln.cli import main
from kiln.core.release_version import VERSION_ENV

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
