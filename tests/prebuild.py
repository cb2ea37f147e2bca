"""Build in the background, on a core the foreground leaves idle, what later tests of this run need.

QEMU without KVM runs a guest on one core, and many integration steps are single-threaded (an
xz unpack, a configure script), so a core often idles. This starts the heavy builds that later
tests need (the arm64 image's packages for tests/e2e/test_arm64.py, the full toolchain for
tests/integration/test_toolchain_build.py, xfsprogs for tests/integration/test_pkgs_userland.py)
at the start of the run, one after another, under `nice -n 5` as the builds lane runs, so the
boots lane's own builds (the amd64 image's, at nice 0) come first (with the kernel's scheduler
autogroups off, as .ci/run makes sure: each sandboxed step is a session of its own, and across
autogroups nice means nothing). At nice 19 they got almost nothing while both lanes were busy: a
cold run's arm64 seed (debootstrap, about a minute alone) took 26 minutes, and the arm64 tests,
which run last, waited for what was still to build. `make test`
runs the boots and the other tiers as two pytest processes (scripts/test_lanes.py); each starts
the prebuilds of its own selected tests. Nothing is built twice: the store's per-key build lock
makes a test that reaches a key being built here wait for it and then find it stored. The arm64
tests run last in the end-to-end tier (tests/conftest.py), when their packages are most likely done.

Only for selected tests that have a prebuild, and when KILN_TEST_PREBUILD is not "0". The log and
the seconds each build took are in the file `log` names; the summary goes to the terminal report
(bench/ci.py reads it into bench/results/ci.json).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWITCH = "KILN_TEST_PREBUILD"


@dataclass(frozen=True)
class Prebuild:
    """A kiln command whose outputs the tests of `module` need, and why."""

    module: str
    what: str
    args: tuple[str, ...]


def _builds(out: Path) -> tuple[Prebuild, ...]:
    return (
        Prebuild(
            "tests/e2e/test_arm64.py",
            "arm64 image packages",
            ("image", "--platform", "linux/arm64", "--kind", "kernel,initramfs", "--out", str(out / "arm64")),
        ),
        Prebuild("tests/integration/test_toolchain_build.py", "full toolchain", ("build", "toolchain")),
        Prebuild("tests/integration/test_pkgs_userland.py", "xfsprogs", ("build", "xfsprogs")),
    )


def wanted(selected: Iterable[str], out: Path) -> list[Prebuild]:
    """The prebuilds whose tests are selected (paths relative to the project root), in build order."""
    modules = set(selected)
    return [build for build in _builds(out) if build.module in modules]


@dataclass
class Background:
    """The one background process that runs the prebuilds in order (tests/prebuild.py as a script)."""

    process: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def stop(self) -> None:
        """Stop what is still building (SIGTERM: kiln commits nothing half-built) and reap it."""
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()

    def _signal(self, number: int) -> None:
        """Signal the whole group: the script and the kiln build it runs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def summary(self) -> list[str]:
        """The `prebuild:` lines the script wrote (one per build, with its seconds and exit code)."""
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text(errors="replace").splitlines() if line.startswith("prebuild:")]


NICE = 5  # the builds lane's (scripts/test_lanes.py)


def start(builds: list[Prebuild]) -> Background | None:
    """Start the builds in one niced background process; None when there is nothing to do."""
    if not builds or os.environ.get(SWITCH) == "0":
        return None
    log = Path(tempfile.mkstemp(prefix="kiln-prebuild-", suffix=".log")[1])
    command = ["nice", "-n", str(NICE), sys.executable, str(Path(__file__).resolve())]
    for build in builds:
        command += ["--", build.what, *build.args]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            process_group=0,
        )
    return Background(process, log)


def _split(argv: list[str]) -> list[list[str]]:
    """`-- WHAT ARGS... -- WHAT ARGS...` into [[WHAT, ARGS...], ...]."""
    groups: list[list[str]] = []
    for arg in argv:
        if arg == "--":
            groups.append([])
        elif groups:
            groups[-1].append(arg)
    return [group for group in groups if group]


def main(argv: list[str]) -> int:
    """Run each kiln command in turn; a failure is reported and the next one still runs.

    A failed prebuild fails no test by itself: the test that needs the package builds it again in
    the foreground and reports the real error there.
    """
    worst = 0
    for what, *args in _split(argv):
        began = time.monotonic()
        print(f"prebuild-start: {what}: kiln {' '.join(args)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "kiln.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL)
        print(f"prebuild: {what}: {time.monotonic() - began:.0f} s, exit {code}", flush=True)
        worst = worst or code
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
