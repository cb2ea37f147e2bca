"""Two pytest processes sharing one tier module by module (tests/claims.py): real pytest runs over
a small test tree of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from scripts.test_lanes import CLAIMS_ENV as LANES_CLAIMS_ENV

from tests.claims import CLAIMS_ENV

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import os
import pytest

def log(line):
    with open(os.environ["CLAIMS_LOG"], "a") as out:
        out.write(f"{line} {os.getpid()}\\n")

@pytest.fixture(scope="session")
def session_fixture():
    log("session")

@pytest.fixture(scope="module")
def module_fixture(request, session_fixture):
    log(f"module {request.module.__name__}")
"""

# Module a's test waits for module b's: both can pass only when two processes run them at once.
MODULE = """
import os, time
from pathlib import Path
from conftest import log

def test_{name}_one(module_fixture):
    log("test {name}_one")
    Path(os.environ["CLAIMS_LOG"]).with_name("{name}.started").touch()
    {wait}

def test_{name}_two(module_fixture):
    log("test {name}_two")
"""
WAIT_FOR_B = """deadline = time.monotonic() + 60
    while not Path(os.environ["CLAIMS_LOG"]).with_name("b.started").exists():
        assert time.monotonic() < deadline, "module b never ran beside a"
        time.sleep(0.05)"""


def tree(tmp_path: Path) -> Path:
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("a", "b", "c"):
        wait = WAIT_FOR_B if name == "a" else "pass"
        (tests / f"test_{name}.py").write_text(textwrap.dedent(MODULE).format(name=name, wait=wait))
    return tests


def pytest_process(tests: Path, log: Path, claims: Path | None) -> subprocess.Popen[str]:
    env = {**os.environ, "CLAIMS_LOG": str(log), "PYTHONPATH": str(ROOT)}
    env.pop(CLAIMS_ENV, None)
    if claims is not None:
        env[CLAIMS_ENV] = str(claims)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.claims", str(tests)]
    return subprocess.Popen(command, cwd=tests, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_processes_split_the_modules_and_run_each_test_once(tmp_path: Path) -> None:
    tests, log, claims = tree(tmp_path), tmp_path / "log", tmp_path / "claims"
    claims.mkdir()
    processes = [pytest_process(tests, log, claims) for _ in range(2)]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    lines = [line.rsplit(" ", 1) for line in log.read_text().splitlines()]
    ran = Counter(what for what, _ in lines if what.startswith("test "))
    assert ran == Counter(f"test {m}_{n}" for m in "abc" for n in ("one", "two"))
    modules = Counter(what for what, _ in lines if what.startswith("module "))
    assert modules == Counter(f"module test_{m}" for m in "abc")  # each module's fixture once
    pids = {pid for _, pid in lines}
    assert len(pids) == 2  # a and b ran in different processes (a waited for b)
    sessions = Counter(pid for what, pid in lines if what == "session")
    assert sessions == Counter({pid: 1 for pid in pids})  # kept up across skipped and run modules
    assert sorted(path.name for path in claims.iterdir()) == [f"test_{m}.py" for m in "abc"]


def test_without_the_variable_one_process_runs_everything(tmp_path: Path) -> None:
    """Module a waits for b, which runs after it in one process: a's wait must not be reached, so
    the tree without a's wait (b alone marks itself) is used here."""
    tests, log = tree(tmp_path), tmp_path / "log"
    (tmp_path / "b.started").touch()  # one process runs a before b; a finds the mark already there
    process = pytest_process(tests, log, None)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "6 passed" in output
    assert LANES_CLAIMS_ENV == CLAIMS_ENV
