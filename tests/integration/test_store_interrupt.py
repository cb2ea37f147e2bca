"""The store under a concurrent gc and under SIGINT/SIGTERM, with real sandbox builds.

A "gate" step connects to a socket this test listens on and waits for one byte: the
accepted connection proves the step runs, and the test decides when (or whether) it ends.
The step has the network for that (`network: default`); the rest of the sandbox is as usual.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import KILN, Project

pytestmark = pytest.mark.integration

STAGING = re.compile(r"[A-Za-z0-9_-]{1,128}\.[0-9]+\.[0-9a-f]{16}")
PROMPT = 10.0  # seconds kiln may take to stop after a signal


class Gate:
    """A loopback listener that gate steps connect to; each waits until `open` answers it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.tag = f"kiln-gate-{os.getpid()}-{self.port}"

    def package(self, name: str) -> str:
        return f"""
name: {name}
variant: stage0
steps:
  - network: default
    build:
      - |
        python3 -c 'import socket, sys
        s = socket.create_connection(("127.0.0.1", {self.port}), timeout=600)
        s.sendall(sys.argv[1].encode())
        sys.exit(0 if s.recv(1) == b"y" else 1)' {self.tag}
      - mkdir -p /out && echo {name} > /out/result
finalize: [{{from: /out, to: /}}]
"""

    def accept(self, process: subprocess.Popen[str], seconds: float = 300) -> socket.socket:
        """The next gate step's connection, once it has said who it is (kiln must still run)."""
        deadline = time.monotonic() + seconds
        self.server.settimeout(0.2)
        while True:
            try:
                conn, _ = self.server.accept()
                break
            except TimeoutError:
                if process.poll() is not None:
                    raise AssertionError(f"kiln exited before the step ran: {process.communicate()}") from None
                assert time.monotonic() < deadline, "the gate step never connected"
        conn.settimeout(seconds)
        assert conn.recv(len(self.tag)) == self.tag.encode()
        return conn

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def gate() -> Iterator[Gate]:
    listener = Gate()
    yield listener
    listener.close()


def add_package(project: Project, name: str, text: str) -> None:
    (project.pkgs / name).mkdir()
    (project.pkgs / name / "pkg.yaml").write_text(text)


def stored(project: Project) -> dict[str, str]:
    """Package name by key of every published entry."""
    return {p.parent.name: json.loads(p.read_text())["name"] for p in (project.cache / "store").glob("*/meta.json")}


def staging_dirs(project: Project) -> list[str]:
    tmp = project.cache / "tmp"
    return sorted(p.name for p in tmp.iterdir() if STAGING.fullmatch(p.name)) if tmp.is_dir() else []


def lock_files(project: Project) -> list[str]:
    locks = project.cache / "locks"
    return sorted(p.name for p in locks.iterdir()) if locks.is_dir() else []


def processes_with(text: str) -> list[int]:
    """PIDs whose command line holds `text` (the step's shell, bwrap, the mount helper, python)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # exited meanwhile
    return found


def statuses(out: str) -> dict[str, str]:
    return {name: info["status"] for name, info in json.loads(out)["packages"].items()}


def finish(process: subprocess.Popen[str], seconds: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=seconds)
    return process.returncode, out, err


def test_gc_during_a_build_keeps_the_cached_dependency(project: Project, gate: Gate) -> None:
    """dep is judged cached at once; app mounts it only after gate's step: a gc runs in between."""
    add_package(
        project,
        "dep",
        """
name: dep
variant: stage0
steps:
  - build: [mkdir -p /out && echo dep > /out/result]
finalize: [{from: /out, to: /}]
""",
    )
    add_package(project, "gate", gate.package("gate"))
    add_package(
        project,
        "app",
        """
name: app
variant: stage0
dependencies:
  - {stage: dep, to: /dep}
  - {stage: gate, to: /gate}
steps:
  - build: [mkdir -p /out && cat /dep/result /gate/result > /out/both]
finalize: [{from: /out, to: /}]
""",
    )
    project.kiln("build", "dep", check=True)
    [dep_key] = [k for k, name in stored(project).items() if name == "dep"]
    build = project.popen("build", "app", "--json")
    try:
        conn = gate.accept(build)
        gc = project.kiln("cache", "gc", "--max-size", "0", check=True)
        assert "removed 0 entries" in gc.out  # dep pinned by the run, the seed too
        assert dep_key in stored(project)
        conn.sendall(b"y")
        code, out, err = finish(build)
    finally:
        build.kill()
        build.wait()
    assert code == 0, err
    assert statuses(out) == {"dep": "cached", "gate": "built", "app": "built"}
    assert stored(project)[dep_key] == "dep"
    assert staging_dirs(project) == []
    assert "0 damaged" in project.kiln("cache", "verify", check=True).out


def start_with_default_sigint(project: Project, *args: str) -> subprocess.Popen[str]:
    """kiln as a subprocess whose SIGINT is not ignored, even when this test runs as a background job."""
    return subprocess.Popen(
        [*KILN, *args],
        cwd=project.root,
        env=project.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_gone(tag: str, seconds: float = PROMPT) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := processes_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_the_step_and_stores_nothing(project: Project, gate: Gate, signum: int) -> None:
    add_package(project, "stuck", gate.package("stuck"))
    build = start_with_default_sigint(project, "build", "stuck", "--json")
    try:
        conn = gate.accept(build)
        assert processes_with(gate.tag), "the step's processes should be visible while it runs"
        sent = time.monotonic()
        build.send_signal(signum)
        code, _out, err = finish(build, seconds=60)
        elapsed = time.monotonic() - sent
    finally:
        build.kill()
        build.wait()
    assert code == 128 + signum, err
    assert elapsed < PROMPT, f"kiln took {elapsed:.1f} s to stop"
    assert "Traceback" not in err
    name = signal.Signals(signum).name
    assert err.strip().splitlines()[-1] == (
        f"kiln: interrupted by {name}: running steps were stopped, their outputs not stored"
    )
    assert conn.recv(1) == b""  # the step's end of the connection died with it
    assert wait_gone(gate.tag) == []
    assert "stuck" not in stored(project).values()
    assert staging_dirs(project) == []
    assert lock_files(project) == []  # every lock released (and its file removed by the last holder)

    again = project.popen("build", "stuck", "--json")
    try:
        gate.accept(again).sendall(b"y")
        code, out, err = finish(again)
    finally:
        again.kill()
        again.wait()
    assert code == 0, err
    assert statuses(out) == {"stuck": "built"}
    assert staging_dirs(project) == []
    assert "0 damaged" in project.kiln("cache", "verify", check=True).out
