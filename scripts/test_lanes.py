"""`make test`'s runner: the boots and the builds in two lanes at once, so both cores work.

QEMU without KVM runs a guest on one core, so a run that boots one test after another leaves
the other core idle for most of the end-to-end tier. This runs two lanes side by side:

- boots: pytest over tests/e2e, at normal priority (its boots wait on consoles with deadlines);
- builds: pytest over tests/unit and tests/integration, then machined's Go tests under the race
  detector and its fuzz targets (`make go-test`), all under `nice -n 19`, so they take the CPU
  the boots leave (with the kernel's scheduler autogroups off, which .ci/run makes sure of).

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
NICE = ("nice", "-n", "19")


@dataclass(frozen=True)
class Lane:
    """Commands run one after another; the lane stops at the first that fails."""

    name: str
    commands: tuple[tuple[str, ...], ...]


def pytest(python: str, lane: str, *paths: str) -> tuple[str, ...]:
    junit_dir = os.environ.get("KILN_TEST_JUNIT_DIR")
    junit = (f"--junitxml={Path(junit_dir) / f'{lane}.xml'}",) if junit_dir else ()
    return (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *junit, *paths)


def lanes(python: str) -> list[Lane]:
    return [
        Lane("boots", (pytest(python, "boots", "tests/e2e"),)),
        Lane(
            "builds",
            (
                (*NICE, *pytest(python, "builds", "tests/unit", "tests/integration")),
                (*NICE, "make", "--no-print-directory", "go-test"),
            ),
        ),
    ]


def run_lane(lane: Lane, codes: dict[str, int], out_lock: threading.Lock) -> None:
    """Run the lane's commands, echoing each line as `[name] line`; record its exit code."""
    began = time.monotonic()
    code = 0
    for command in lane.commands:
        with out_lock:
            print(f"[{lane.name}] lane {lane.name}: {' '.join(command)}", flush=True)
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
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
    """Run the lanes side by side; the first failing lane's exit code, or 0."""
    codes: dict[str, int] = {}
    out_lock = threading.Lock()
    threads = [threading.Thread(target=run_lane, args=(lane, codes, out_lock), name=lane.name) for lane in chosen]
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
