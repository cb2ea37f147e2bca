"""`make test`'s runner: the boots and the builds in two lanes at once, so both cores work.

QEMU without KVM runs a guest on one core, so a run that boots one test after another leaves
the other core idle for most of the end-to-end tier. This runs two lanes side by side:

- boots: pytest over tests/e2e, at normal priority (its boots wait on consoles with deadlines);
- builds: pytest over tests/unit and tests/integration, under `nice -n 5`: the boots come first
  (with the kernel's scheduler autogroups off, which .ci/run makes sure of), but not so far
  first that this lane starves. At nice 19 it got almost nothing while the boots lane built a
  cold store's kernel and Go on both cores, and the test seed's debootstrap, run by the first
  integration test, ran past the test's 30 minutes;
- go: machined's Go tests under the race detector and its fuzz targets (`make go-test`), at the
  same priority, started when the first of the other two lanes ends, on the core it leaves.

Both lanes share the default store; its per-key build locks make a lane that reaches a package
the other is building wait and then find it stored, so nothing is built twice. Each lane's lines
come out as they are written, prefixed with the lane's name; each pytest keeps its own cache off
(two processes would race on .pytest_cache). With KILN_TEST_JUNIT_DIR set, each pytest writes
its JUnit XML there (bench/ci.py reads them). The exit code is the first failing lane's, or 0.

Run: `scripts/test_lanes.py PYTHON` (make test passes the venv's python).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NICE = ("nice", "-n", "5")


@dataclass(frozen=True)
class Lane:
    """Commands run one after another; the lane stops at the first that fails. A lane `after_first`
    starts once any lane without it has ended."""

    name: str
    commands: tuple[tuple[str, ...], ...]
    after_first: bool = False


def pytest(python: str, lane: str, *paths: str) -> tuple[str, ...]:
    junit_dir = os.environ.get("KILN_TEST_JUNIT_DIR")
    junit = (f"--junitxml={Path(junit_dir) / f'{lane}.xml'}",) if junit_dir else ()
    return (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *junit, *paths)


def lanes(python: str) -> list[Lane]:
    return [
        Lane("boots", (pytest(python, "boots", "tests/e2e"),)),
        Lane("builds", ((*NICE, *pytest(python, "builds", "tests/unit", "tests/integration")),)),
        Lane("go", ((*NICE, "make", "--no-print-directory", "go-test"),), after_first=True),
    ]


def run_lane(lane: Lane, codes: dict[str, int], out_lock: threading.Lock) -> None:
    """Run the lane's commands, echoing each line as `[name] line`; record its exit code."""
    began = time.monotonic()
    code = 0
    for command in lane.commands:
        with out_lock:
            print(f"[{lane.name}] lane {lane.name}: {' '.join(command)}", flush=True)
        try:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except OSError as exc:
            with out_lock:
                print(f"[{lane.name}] lane {lane.name}: cannot run {command[0]}: {exc.strerror}", flush=True)
            code = 127
            break
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with out_lock:
                print(f"[{lane.name}] {line}", flush=True)
        code = process.wait()
        if code != 0:
            break
    codes[lane.name] = code
    with out_lock:
        print(f"[{lane.name}] lane {lane.name}: {time.monotonic() - began:.0f} s, exit {code}", flush=True)


def run(chosen: list[Lane]) -> int:
    """Run the lanes side by side (the `after_first` ones from the first end on); the first failing
    lane's exit code, or 0."""
    codes: dict[str, int] = {}
    out_lock = threading.Lock()
    first_done = threading.Event()

    def lane_thread(lane: Lane) -> None:
        if lane.after_first:
            first_done.wait()
        try:
            run_lane(lane, codes, out_lock)
        finally:  # a lane that could not even start its command must not hold the late ones back
            if not lane.after_first:
                first_done.set()

    threads = [threading.Thread(target=lane_thread, args=(lane,), name=lane.name) for lane in chosen]
    if all(lane.after_first for lane in chosen):
        first_done.set()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [lane.name for lane in chosen if codes.get(lane.name, 1) != 0]
    if failed:
        print(f"test lanes failed: {', '.join(failed)}", file=sys.stderr, flush=True)
    return next((codes.get(name, 1) for name in failed), 0)


def main(argv: list[str]) -> int:
    return run(lanes(argv[0] if argv else sys.executable))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
