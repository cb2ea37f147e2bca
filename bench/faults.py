"""Benchmark: the fault-injection suite, scenario by scenario, as docs/upgrades.md lists it.

Reads the table "Faults the tests inject" of docs/upgrades.md (so the benchmark and the documentation
name the same tests), runs every Go test it names (`go test -json`, machined's package and
internal/bootstate) and takes every pytest test it names from JUnit XML: `--junit DIR` reads the files
a `make test` wrote there (KILN_TEST_JUNIT_DIR; bench/ci.py keeps them), otherwise the e2e tests run
here (about 15 minutes of TCG boots). Each scenario's seconds are its tests' wall time, from the fault
to the machine back on a known version, with the disk images built and every boot included. Writes
bench/results/faults.json: per scenario, its tests and seconds; the total; how many scenarios.

Run: `.venv/bin/python bench/faults.py [--junit DIR]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINED = ROOT / "runtime/machined"
TABLE_START = "| Fault | What it proves | Test |"
RESULTS = ROOT / "bench/results/faults.json"
GO_PACKAGES = (".", "./internal/bootstate", "./internal/oci")


def scenarios() -> list[tuple[str, list[str]]]:
    """(fault, test names) for each row of the table."""
    text = (ROOT / "docs/upgrades.md").read_text()
    rows = text[text.index(TABLE_START) :].split("\n\n", 1)[0].splitlines()[2:]
    found: list[tuple[str, list[str]]] = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        tests = re.findall(r"`(Test\w+|test_\w+)`", cells[-1])
        if not tests and cells[-1] == "the same" and found:  # the row above's test injects this one too
            tests = found[-1][1]
        found.append((cells[0], tests))
    return found


def go_seconds(names: set[str]) -> dict[str, float]:
    """Each named Go test's seconds, from go test -json over machined's packages."""
    pattern = "^(" + "|".join(sorted(names)) + ")$"
    done = subprocess.run(
        ["go", "test", "-count=1", "-json", "-run", pattern, *GO_PACKAGES], cwd=MACHINED, capture_output=True, text=True
    )
    seconds: dict[str, float] = {}
    for line in done.stdout.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        test = event.get("Test", "")
        if event.get("Action") == "pass" and test in names:
            seconds[test] = seconds.get(test, 0.0) + event["Elapsed"]
        elif event.get("Action") == "fail" and test in names:
            sys.exit(f"{test} failed:\n{done.stdout[-4000:]}")
    return seconds


def pytest_seconds(names: set[str], junit: Path | None) -> dict[str, float]:
    """Each named pytest test's seconds (parametrized cases summed), from JUnit XML."""
    with tempfile.TemporaryDirectory(prefix="kiln-faults-") as tmp:
        if junit is None:
            junit = Path(tmp)
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e"]
            command += ["-k", " or ".join(sorted(names)), f"--junitxml={junit / 'faults.xml'}"]
            if subprocess.run(command, cwd=ROOT).returncode != 0:
                sys.exit("a fault scenario's test failed")
        seconds: dict[str, float] = {}
        for path in sorted(junit.glob("*.xml")):
            for case in ET.parse(path).getroot().iter("testcase"):
                name = case.get("name", "").split("[", 1)[0]
                if name in names and case.find("failure") is None and case.find("skipped") is None:
                    seconds[name] = seconds.get(name, 0.0) + float(case.get("time", "0"))
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="JUnit XML files of a make test run (KILN_TEST_JUNIT_DIR)")
    args = parser.parse_args()
    table = scenarios()
    names = {name for _, tests in table for name in tests}
    seconds = go_seconds({n for n in names if n.startswith("Test")})
    seconds |= pytest_seconds({n for n in names if n.startswith("test_")}, args.junit)
    missing = sorted(names - set(seconds))
    rows = [(fault, tests, round(sum(seconds[t] for t in tests if t in seconds), 2)) for fault, tests in table]
    for fault, _, scenario_seconds in rows:
        print(f"{scenario_seconds:8.1f} s  {fault[:90]}")
    total = sum(seconds.values())
    print(f"{len(rows)} scenarios, {total:.0f} s in all" + (f"; not run: {', '.join(missing)}" if missing else ""))
    scenario_rows = [{"fault": fault, "tests": tests, "seconds": value} for fault, tests, value in rows]
    result = {"scenarios": scenario_rows, "count": len(rows), "total_s": round(total, 1), "not_run": missing,
              "source": f"JUnit of {args.junit}" if args.junit else "run here", "cores": os.cpu_count()}  # fmt: skip
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
