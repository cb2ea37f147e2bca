"""The background prebuilds of a test run (tests/prebuild.py) and the e2e order that makes them pay."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.prebuild import Background, _split, main, wanted


def test_only_the_builds_of_selected_modules_in_build_order(tmp_path: Path) -> None:
    chosen = wanted(
        ["tests/integration/test_toolchain_build.py", "tests/e2e/test_arm64.py", "tests/unit/x.py"], tmp_path
    )
    assert [build.what for build in chosen] == ["arm64 image packages", "full toolchain"]
    assert chosen[0].args[:3] == ("image", "--platform", "linux/arm64")
    assert wanted(["tests/unit/test_store.py"], tmp_path) == []


def test_split_groups_the_commands() -> None:
    assert _split(["--", "a", "build", "x", "--", "b", "image"]) == [["a", "build", "x"], ["b", "image"]]
    assert _split(["stray", "--"]) == []


def test_a_failing_build_is_reported_and_the_next_one_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The real CLI, with arguments it refuses (exit 2) and then a verb that succeeds."""
    code = main(["--", "bad", "build", "--no-such-option", "--", "good", "--version"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("prebuild: ")]
    assert code == 2
    assert lines[0].startswith("prebuild: bad: ") and lines[0].endswith("exit 2")
    assert lines[1].startswith("prebuild: good: ") and lines[1].endswith("exit 0")


def gone_within(pid: int, seconds: float) -> bool:
    """True once `pid` has exited (gone, or a zombie waiting for init to reap it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)  # the signal is delivered; the process is on its way out
    return False


def test_stop_ends_the_whole_group(tmp_path: Path) -> None:
    """A prebuild stopped mid-build takes its child (the kiln build) with it: nothing keeps building."""
    log = tmp_path / "log"
    script = "import subprocess; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); p.wait()"
    process = subprocess.Popen([sys.executable, "-c", script], process_group=0, stdout=subprocess.PIPE)
    assert process.stdout is not None
    pid = int(process.stdout.readline())  # the child runs: the group has two processes
    Background(process, log).stop()
    assert gone_within(pid, seconds=10)
    assert Background(process, log).summary() == []
