"""make test's lanes (scripts/test_lanes.py): what each runs, side by side, and their exit codes.

The lanes here run small shell commands in place of pytest and Go (the real lanes are what
`make test` runs, so CI runs them every time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scripts.test_lanes import CLAIMS_ENV, ROOT, Lane, lanes, run


def test_every_test_tier_runs_in_a_lane_and_the_late_lanes_use_the_idle_core(tmp_path: Path) -> None:
    commands = [command for lane in lanes(sys.executable, tmp_path) for command in lane.commands]
    selected = {arg for command in commands for arg in command if arg.startswith("tests/")}
    tiers = {f"tests/{path.parent.name}" for path in (ROOT / "tests").glob("*/test_*.py")}
    assert tiers == selected == {"tests/unit", "tests/integration", "tests/e2e"}
    boots, builds, go, boots2 = lanes(sys.executable, tmp_path)
    assert boots.commands[0][0] == boots2.commands[0][0] == sys.executable  # boots at normal priority
    assert all(command[:3] == ("nice", "-n", "5") for command in (*builds.commands, *go.commands))
    assert go.commands[-1][-1] == "go-test" and go.after == ("boots", "builds") and not go.after_all
    assert boots2.after == ("builds", "go") and boots2.after_all
    assert not boots.after and not builds.after
    # The two boots lanes share one claims directory, so each e2e module runs once between them.
    assert dict(boots.env)[CLAIMS_ENV] == dict(boots2.env)[CLAIMS_ENV] == str(tmp_path)
    assert CLAIMS_ENV not in dict(builds.env)


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


def test_a_lane_after_others_starts_once_one_of_them_has_ended(tmp_path: Path) -> None:
    """The late lane sees the short lane's marker (it started after that lane ended) while the long
    lane still runs (it waits for the late lane's marker)."""
    short, late = tmp_path / "short", tmp_path / "late"
    wait = "for i in $(seq 200); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 9"
    chosen = [
        Lane("long", (("sh", "-c", wait.format(late)),)),
        Lane("short", (("sh", "-c", f"sleep 0.2; touch {short}"),)),
        Lane("late", (("sh", "-c", f"[ -e {short} ] && touch {late}"),), after=("long", "short")),
    ]
    assert run(chosen) == 0


def test_a_lane_after_all_starts_only_once_every_one_has_ended(tmp_path: Path) -> None:
    """`last` checks both markers; `second` ends well after `first`, so starting at the first end fails."""
    first, second = tmp_path / "first", tmp_path / "second"
    chosen = [
        Lane("last", (("sh", "-c", f"[ -e {first} ] && [ -e {second} ]"),), after=("one", "two"), after_all=True),
        Lane("one", (("touch", str(first)),)),
        Lane("two", (("sh", "-c", f"sleep 0.5; touch {second}"),)),
    ]
    assert run(chosen) == 0


def test_a_lane_gets_its_environment(tmp_path: Path) -> None:
    lane = Lane(
        "env", (("sh", "-c", f'echo "$KILN_LANE_VALUE" > {tmp_path / "out"}'),), env=(("KILN_LANE_VALUE", "x"),)
    )
    assert run([lane]) == 0
    assert (tmp_path / "out").read_text() == "x\n"


def test_a_lane_whose_command_cannot_start_fails_and_releases_the_late_lanes(tmp_path: Path) -> None:
    late = tmp_path / "late"
    chosen = [
        Lane("broken", (("/nonexistent/program",),)),
        Lane("late", (("touch", str(late)),), after=("broken",), after_all=True),
    ]
    assert run(chosen) == 127
    assert late.exists()
