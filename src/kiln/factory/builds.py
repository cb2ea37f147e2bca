"""The factory's builds: each (schematic, version, profile) made once, a bounded number at a time, kept on disk.

On-disk layout under the factory's root (`$KILN_CACHE/factory` by default):

    schematics/<id>.json                      the canonical schematic, written when it is posted
    images/<id>/<version>/<profile>/          a finished build: the profile's output directory
    logs/<id>-<version>-<profile>.log         the log of the last build of that triple
    work/                                     builds in progress (renamed into images/ when whole)

A build is renamed into `images/` only once complete, so a directory there is always whole; a
crash leaves at most a directory in `work/`, removed when the factory starts. Requests for a
triple that is building wait for that one build (never a second); requests beyond `workers`
running plus `queue` waiting are refused at once (QueueFull) rather than piling up.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.core.errors import KilnError


class QueueFull(KilnError):
    """Every worker is busy and the queue is full: come back later."""


@dataclass(frozen=True)
class Target:
    """What is built: a profile's outputs for one schematic and release version."""

    schematic: str
    version: str
    profile: str

    @property
    def label(self) -> str:
        return f"{self.schematic}-{self.version}-{self.profile}"


@dataclass
class Job:
    """One build of a target: its state, its log, and where its output is once done."""

    target: Target
    log: Path
    output: Path
    state: str = "queued"  # queued | building | done | failed
    error: str = ""
    finished: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)


# A runner makes the target's output in the given empty directory, writing what it does to the log;
# it raises (any exception) when the build fails.
Runner = Callable[[Target, Path, Path], None]


class Builds:
    """Build-once, bounded, on-disk cache of the factory's outputs."""

    def __init__(self, root: Path, runner: Runner, *, workers: int = 1, queue: int = 8) -> None:
        self.root = root
        self.runner = runner
        self.limit = workers + queue
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self._jobs: dict[Target, Job] = {}
        for sub in ("schematics", "images", "logs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root / "work", ignore_errors=True)  # what a crash left: never whole
        (root / "work").mkdir()

    def output(self, target: Target) -> Path:
        return self.root / "images" / target.schematic / target.version / target.profile

    def log(self, target: Target) -> Path:
        return self.root / "logs" / f"{target.label}.log"

    def request(self, target: Target) -> Job:
        """The job that makes (or made) `target`: a finished one from disk, the running one, or a new one."""
        with self._lock:
            done = self.output(target)
            if done.is_dir():
                job = Job(target, self.log(target), done, "done")
                job.finished.set()
                return job
            running = self._jobs.get(target)
            if running is not None:
                return running
            if sum(1 for j in self._jobs.values() if not j.finished.is_set()) >= self.limit:
                raise QueueFull(f"{self.limit} builds are running or waiting")
            job = Job(target, self.log(target), done)
            self._jobs[target] = job
        threading.Thread(target=self._build, args=(job,), name=f"build {target.label}", daemon=True).start()
        return job

    def running(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if not j.finished.is_set())

    def _build(self, job: Job) -> None:
        with self._slots:
            job.state = "building"
            work = Path(tempfile.mkdtemp(prefix=f"{job.target.label}-", dir=self.root / "work"))
            try:
                self.runner(job.target, work / "out", job.log)
                job.output.parent.mkdir(parents=True, exist_ok=True)
                (work / "out").rename(job.output)
                job.state = "done"
            except Exception as exc:
                job.state, job.error = "failed", str(exc) or type(exc).__name__
            finally:
                shutil.rmtree(work, ignore_errors=True)
                with self._lock:  # done: on disk from now on; failed: the next request tries again
                    self._jobs.pop(job.target, None)
                job.finished.set()
