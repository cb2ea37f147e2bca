"""The factory's builds: each (schematic, version, profile) made once, a bounded number at a time, kept on disk.

On-disk layout under the factory's root (`$KILN_CACHE/factory` by default):

    schematics/<id>.json                      the canonical schematic, written when it is posted
    images/<id>/<version>/<profile>/          a finished build: the profile's output directory
    logs/<id>-<version>-<profile>.log         the log of the last build of that triple
    work/                                     builds in progress (renamed into images/ when whole)

A build is renamed into `images/` only once complete, so a directory there is always whole; a
crash leaves at most a directory in `work/`, removed when the factory starts. Requests for a
triple that is building wait for that one build (never a second); requests beyond `workers`
running plus `queue` waiting are refused at once (QueueFull) rather than piling up. A failed build
is remembered: until its backoff window ends (`backoff` seconds, doubled by each failure in a row,
at most `backoff_max`) every request gets that failure at once, so a schematic that cannot build
costs one build per window however often it is asked for.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
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
    retry_after: float = 0.0  # a failed job: seconds until the target is built again

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)


# A runner makes the target's output in the given empty directory, writing what it does to the log;
# it raises (any exception) when the build fails.
Runner = Callable[[Target, Path, Path], None]


@dataclass
class Failure:
    """The last failure of a target: its error, how many in a row, and until when it stands."""

    error: str
    count: int
    until: float


class Builds:
    """Build-once, bounded, on-disk cache of the factory's outputs."""

    def __init__(
        self,
        root: Path,
        runner: Runner,
        *,
        workers: int = 1,
        queue: int = 8,
        backoff: float = 30.0,
        backoff_max: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.runner = runner
        self.limit = workers + queue
        self.backoff, self.backoff_max, self.clock = backoff, backoff_max, clock
        self._failures: dict[Target, Failure] = {}
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
            failed = self._failed(target)
            if failed is not None:
                return failed
            if sum(1 for j in self._jobs.values() if not j.finished.is_set()) >= self.limit:
                raise QueueFull(f"{self.limit} builds are running or waiting")
            job = Job(target, self.log(target), done)
            self._jobs[target] = job
        threading.Thread(target=self._build, args=(job,), name=f"build {target.label}", daemon=True).start()
        return job

    def _failed(self, target: Target) -> Job | None:
        """The standing failure of `target` as a finished job, while its backoff window lasts (lock held)."""
        failure = self._failures.get(target)
        if failure is None or self.clock() >= failure.until:
            return None
        job = Job(target, self.log(target), self.output(target), "failed", failure.error)
        job.retry_after = failure.until - self.clock()
        job.finished.set()
        return job

    def _record(self, job: Job) -> None:
        """Remember a failure (the window doubles with each in a row) or forget it on success (lock held)."""
        if job.state != "failed":
            self._failures.pop(job.target, None)
            return
        before = self._failures.get(job.target)
        count = 1 if before is None else before.count + 1
        window = min(self.backoff * 2 ** min(count - 1, 32), self.backoff_max)
        self._failures[job.target] = Failure(job.error, count, self.clock() + window)
        job.retry_after = window

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
                with self._lock:  # done: on disk from now on; failed: remembered until its window ends
                    self._jobs.pop(job.target, None)
                    self._record(job)
                job.finished.set()
