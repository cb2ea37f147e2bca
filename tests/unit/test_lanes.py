"""make test's two lanes (scripts/test_lanes.py): what each runs, side by side, and their exit codes.

The lanes here run small shell commands in place of pytest and Go (the real lanes are what
`make test` runs, so CI runs them every time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scripts.test_lanes import ROOT, Lane, lanes, run


def test_every_test_tier_runs_in_a_lane_and_go_test_once_a_lane_ends() -> None:
    commands = [command for lane in lanes(sys.executable) for command in lane.commands]
    selected = {arg for command in commands for arg in command if arg.startswith("tests/")}
    tiers = {f"tests/{path.parent.name}" for path in (ROOT / "tests").glob("*/test_*.py")}
    assert tiers == selected == {"tests/unit", "tests/integration", "tests/e2e"}
    boots, builds, go = lanes(sys.executable)
    assert boots.commands[0][0] == sys.executable  # boots at normal priority
    assert all(command[:3] == ("nice", "-n", "5") for command in (*builds.commands, *go.commands))
    assert go.commands[-1][-1] == "go-test" and go.after_first
    assert not boots.after_first and not builds.after_first


def test_lanes_run_side_by_side_with_their_lines_prefixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each lane waits for a file only the other writes: run one after the other, neither could finish."""
    a, b = tmp_path / "a", tmp_path / "b"
    wait = "for i in $(seq 200); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 9"
    first = Lane("one", (("sh", "-c", f"touch {a}; echo first"), ("sh", "-c", wait.format(b))))
    second = Lane("two", (("sh", "-c", f"touch {b}; echo second"), ("sh", "-c", wait.format(a))))
    assert run([first, second]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "[one] first" in out and "[two] second" in out
    assert any(line.startswith("[one] lane one: ") and line.endswith("exit 0") for line in out)


def test_a_failing_command_ends_its_lane_and_sets_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    failing = Lane("bad", (("sh", "-c", "exit 3"), ("sh", "-c", "echo never")))
    fine = Lane("good", (("true",),))
    assert run([fine, failing]) == 3
    captured = capsys.readouterr()
    assert "never" not in captured.out
    assert "test lanes failed: bad" in captured.err


def test_an_after_first_lane_starts_once_another_lane_has_ended(tmp_path: Path) -> None:
    """The late lane sees the short lane's marker (it started after that lane ended) while the long
    lane still runs (it waits for the late lane's marker)."""
    short, late = tmp_path / "short", tmp_path / "late"
    wait = "for i in $(seq 200); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 9"
    chosen = [
        Lane("long", (("sh", "-c", wait.format(late)),)),
        Lane("short", (("sh", "-c", f"sleep 0.2; touch {short}"),)),
        Lane("late", (("sh", "-c", f"[ -e {short} ] && touch {late}"),), after_first=True),
    ]
    assert run(chosen) == 0


def test_a_lane_whose_command_cannot_start_fails_and_releases_the_late_lanes(tmp_path: Path) -> None:
    late = tmp_path / "late"
    chosen = [
        Lane("broken", (("/nonexistent/program",),)),
        Lane("late", (("touch", str(late)),), after_first=True),
    ]
    assert run(chosen) == 127
    assert late.exists()
