"""Benchmark: `.ci/run` as CI runs it (a fresh clone of HEAD, CI=true, no terminal), timed by phase.

The phases are read from the run itself: make's echo of each command (setup, services, the test
lanes, lint) timestamped as it appears, each lane's seconds (scripts/test_lanes.py: the boots,
and beside them the other tiers then machined's Go tests and fuzz targets), pytest's per-test
times (a JUnit XML file per lane, grouped by tier: e2e, integration, unit) and the background
prebuilds' own lines (tests/prebuild.py). The budget is 70 minutes cold and 25 warm on 2 idle cores.

Cold means empty stores: `--cold` points HOME (the store, pip's and Go's caches, the seed) at an
empty directory (`--home DIR`, which must hold no Kiln store: on a fresh machine, the real HOME,
so the run also leaves the store warm for CI) and removes Docker's images and build cache first;
the apt packages stay installed. Without `--cold` it measures a warm run on this machine's stores.

Run: `.venv/bin/python bench/ci.py [--cold] [--label TEXT]`. Appends to bench/results/ci.json. A run stopped
before its end (a session's time ran out) is recorded from what it wrote with `--stopped --work DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/ci.json"
BUDGET_MIN = {"cold": 70, "warm": 25}
PREBUILD = re.compile(r"^(\[\w+\] )?prebuild: ")
# make echoes each recipe line before running it: the first line of each phase.
MARKERS = (
    ("setup", "./scripts/setup-host.sh"),
    ("services", "./scripts/ci-services.sh"),
    ("tests", "scripts/test_lanes.py"),
    ("lint", "/bin/ruff check"),
)


def phases(lines: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds from each phase's first line to the next phase's (the last one to `end`)."""
    starts: list[tuple[str, float]] = []
    for name, marker in MARKERS:
        found = next((at for at, line in lines if marker in line), None)
        if found is not None:
            starts.append((name, found))
    starts.sort(key=lambda pair: pair[1])
    bounds = [at for _, at in starts[1:]] + [end]
    return {name: round(stop - at, 1) for (name, at), stop in zip(starts, bounds, strict=True)}


LANE_END = re.compile(r"^\[(\w+)\] lane \w+: (\d+) s, exit (-?\d+)$")


def lanes(lines: list[tuple[float, str]]) -> dict[str, dict[str, int]]:
    """Each test lane's seconds and exit code, from its last line."""
    found = (LANE_END.match(line) for _, line in lines)
    return {m[1]: {"s": int(m[2]), "exit": int(m[3])} for m in found if m}


def cases(junit_dir: Path) -> list[ET.Element]:
    """Every test case of every lane's JUnit file."""
    return [case for path in sorted(junit_dir.glob("*.xml")) for case in ET.parse(path).getroot().iter("testcase")]


def tiers(junit_dir: Path) -> dict[str, float]:
    """pytest's seconds per tier (tests/<tier>/...), setup and teardown included."""
    seconds: dict[str, float] = defaultdict(float)
    for case in cases(junit_dir):
        tier = case.get("classname", "").split(".")[1:2] or ["?"]
        seconds[tier[0]] += float(case.get("time", "0"))
    return {tier: round(value, 1) for tier, value in sorted(seconds.items())}


def slowest(junit_dir: Path, count: int = 15) -> list[dict[str, object]]:
    timed = [
        (float(case.get("time", "0")), f"{case.get('classname')}::{case.get('name')}") for case in cases(junit_dir)
    ]
    return [{"test": name, "s": round(at, 1)} for at, name in sorted(timed, reverse=True)[:count]]


def empty_docker() -> None:
    """Docker's images, containers and build cache gone (the engine itself stays installed)."""
    for command in (["docker", "system", "prune", "-af"], ["docker", "builder", "prune", "-af"]):
        subprocess.run(command, check=False, capture_output=True)


def run_ci(clone: Path, env: dict[str, str], log: Path) -> tuple[int, list[tuple[float, str]], float]:
    """Run .ci/run in `clone`, stamping every output line (seconds since start) into `log`."""
    began = time.monotonic()
    lines: list[tuple[float, str]] = []
    with log.open("w") as sink:
        process = subprocess.Popen(
            ["sh", ".ci/run"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            at = time.monotonic() - began
            lines.append((at, line.rstrip("\n")))
            sink.write(f"{at:8.1f} {line}")
            sink.flush()
        code = process.wait()
    return code, lines, time.monotonic() - began


def read_log(log: Path) -> tuple[list[tuple[float, str]], float]:
    """The stamped lines of a run's log (as run_ci writes them) and its last stamp."""
    lines: list[tuple[float, str]] = []
    for raw in log.read_text(errors="replace").splitlines():
        stamp, _, text = raw.strip(" ").partition(" ")
        try:
            lines.append((float(stamp), text))
        except ValueError:
            if lines:  # a line that came without its newline-terminated stamp: part of the one before
                lines[-1] = (lines[-1][0], lines[-1][1] + raw)
    return lines, (lines[-1][0] if lines else 0.0)


BUILT_IN = re.compile(r"built in ([0-9.]+) s")


def store_builds(logs: Path) -> dict[str, float]:
    """Each package the run's store built, and its longest build's seconds (its store logs), finished ones only."""
    found: dict[str, float] = {}
    for log in logs.glob("*/*.log"):
        if log.is_symlink():
            continue
        seconds = [float(m[1]) for m in BUILT_IN.finditer(log.read_text(errors="replace"))]
        if seconds:
            found[log.parent.name] = max(found.get(log.parent.name, 0.0), *seconds)
    return dict(sorted(found.items()))


def result_of(
    lines: list[tuple[float, str]], total: float, code: int | None, junit: Path, commit: str, kind: str, label: str
) -> dict[str, object]:
    """The record bench/results/ci.json keeps of one run (exit None: the run was stopped before its end)."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "commit": commit[:12],
        "kind": kind,
        "label": label,
        "exit": code,
        "total_min": round(total / 60, 1),
        "budget_min": BUDGET_MIN[kind],
        "phases_s": phases(lines, total),
        "lanes": lanes(lines),
        "pytest_tiers_s": tiers(junit) if junit.is_dir() else {},
        "prebuilds": [line.split("prebuild: ", 1)[1] for _, line in lines if PREBUILD.match(line)],
        "slowest_tests": slowest(junit) if junit.is_dir() else [],
    }


def append(result: dict[str, object]) -> None:
    history = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*history, result], indent=2) + "\n")
    print(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="empty HOME and Docker first (see above)")
    parser.add_argument("--label", default="", help="a note stored with the result (what else ran, say)")
    parser.add_argument("--home", type=Path, help="with --cold: a HOME without a Kiln store (default: a new one)")
    parser.add_argument("--work", type=Path, help="where the clone (and the cold HOME) go (default: a temp dir)")
    parser.add_argument(
        "--stopped",
        action="store_true",
        help="record the run in --work that was stopped before its end (its ci.log and JUnit files so far; "
        "exit null), instead of starting one",
    )
    args = parser.parse_args()
    kind = "cold" if args.cold else "warm"
    if args.stopped:
        if args.work is None:
            raise SystemExit("bench/ci.py: --stopped needs --work DIR (the stopped run's)")
        log = args.work / "ci.log"
        lines, last = read_log(log)
        total = time.time() - (log.stat().st_mtime - last)  # until now: the run went on after its last line
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.work / "clone", capture_output=True, text=True)
        result = result_of(lines, total, None, args.work / "junit", head.stdout.strip(), kind, args.label)
        if args.home:
            result["store_builds_s"] = store_builds(args.home / ".cache/kiln/logs")
        append(result)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-ci-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    junit = work / "junit"
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "KILN_CACHE", "VIRTUAL_ENV")}
    env |= {"CI": "true", "KILN_TEST_JUNIT_DIR": str(junit)}
    if args.cold:
        home = args.home or work / "home"
        store = home / ".cache/kiln"
        if store.is_dir() and any(entry.name != "templates" for entry in store.iterdir()):  # templates: Jinja's
            raise SystemExit(f"bench/ci.py: {home}/.cache/kiln exists: not a cold run (choose another --home)")
        home.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(home)
        empty_docker()
    log = work / "ci.log"
    print(f"bench/ci.py: .ci/run in {clone} at {commit[:12]}, log {log}", file=sys.stderr)
    code, lines, total = run_ci(clone, env, log)
    append(result_of(lines, total, code, junit, commit, kind, args.label))
    sys.exit(code)


if __name__ == "__main__":
    main()
