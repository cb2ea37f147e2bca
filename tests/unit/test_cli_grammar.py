"""The CLI's grammar: no prefix abbreviations, and a closed pipe is not a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--js"],  # --json
        ["build", "--all", "--no-ca"],  # --no-cache
        ["image", "metal", "--ou", "x"],  # --out / --output: which one was never clear
        ["cache", "ls", "--js"],
        ["boot", "x.iso", "--keep"],  # --keep-running
    ],
)
def test_abbreviated_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_full_option_names_still_parse() -> None:
    args = build_parser().parse_args(["ls", "--json"])
    assert args.json is True
    args = build_parser().parse_args(["boot", "x.iso", "--keep-running", "--blank-disk", "4G"])
    assert args.keep_running and args.blank_disk == "4G"


def test_a_reader_that_goes_away_ends_kiln_quietly(tmp_path: Path) -> None:
    """`kiln dump --json | head -c 1`: the real CLI in a child process, its pipe closed before it writes."""
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write fails with EPIPE
    child = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "dump", "--json"],
        cwd=ROOT,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    os.close(write)
    assert "Traceback" not in child.stderr and "BrokenPipe" not in child.stderr, child.stderr
    assert child.returncode == 128 + signal.SIGPIPE
