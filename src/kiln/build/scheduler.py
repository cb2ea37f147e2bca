"""Building a graph in parallel along the DAG, skipping keys already stored.

Readiness is tracked in the calling thread; each build runs in a worker thread
that holds the store lock for its key, so two kiln processes on one store never
build the same key at once (the second one finds it stored and calls it cached).
Every entry the run judges cached or builds is pinned until the run ends, so a
concurrent gc cannot evict a dependency before its dependent mounts it. A
cancelled run (kiln.build.cancel) starts nothing more, waits for its running
builds to unwind (their steps killed, nothing committed) and raises Interrupted.

A whole-graph runner (BuildKit) gets the same claims, pins and reports, but all its missing
packages at once, in one solve.

Each outcome records when its package started and finished, in seconds since the run's origin
(time.monotonic(), so a clock change cannot bend it), and what it needed: enough to draw the
run as a timeline (`kiln report timeline`).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from kiln.build.builder import Builder, log_path
from kiln.build.cancel import TOKEN, Interrupted
from kiln.build.runners.base import GraphRunner
from kiln.build.store import Pins
from kiln.core.errors import BuildError, KilnError

BUILT, CACHED, FAILED, SKIPPED, CANCELLED = "built", "cached", "failed", "skipped", "cancelled"


@dataclass
class Outcome:
    name: str
    key: str
    status: str = SKIPPED
    seconds: float = 0.0
    error: KilnError | None = field(default=None, repr=False)
    started: float | None = None  # seconds since the run's origin; a cached package starts and ends at once
    finished: float | None = None
    needs: tuple[str, ...] = ()  # the packages of the run it waited for (its graph edges)


class Progress(Protocol):
    """What the scheduler reports; plain lines or a live view implement it."""

    def begin(self, names: list[str]) -> None: ...

    def started(self, name: str) -> None: ...

    def phase(self, name: str, text: str) -> None: ...

    def done(self, outcome: Outcome) -> None: ...

    def end(self, outcomes: dict[str, Outcome]) -> None: ...


class Scheduler:
    def __init__(
        self,
        builder: Builder,
        progress: Progress,
        jobs: int,
        *,
        no_cache: bool = False,
        keep_going: bool = False,
        pins: Pins | None = None,
        prebuilt: frozenset[str] = frozenset(),
        origin: float | None = None,
        weigh: Callable[[str], float] | None = None,
    ) -> None:
        self.builder = builder
        self.progress = progress
        self.jobs = max(1, jobs)
        self.no_cache = no_cache
        self.keep_going = keep_going
        self.pins = pins
        self.prebuilt = prebuilt  # built by an earlier pass of this run (a cross build's tools): never rebuilt
        self.origin = time.monotonic() if origin is None else origin  # outcomes' times count from here
        self.weigh = weigh or (lambda name: 0)  # a package's own cost (kiln.build.prefetch.source_bytes)

    def now(self) -> float:
        """Seconds since the run's origin, to the millisecond."""
        return round(time.monotonic() - self.origin, 3)

    def run(self, targets: list[str]) -> dict[str, Outcome]:
        """Build targets and everything they need; outcomes in build order.

        The entries the run relies on stay pinned until it ends, or, with the caller's
        `pins`, until the caller releases them (an export after the build reads them too).
        """
        if self.pins is not None:
            return self._run(targets, self.pins)
        with Pins(self.builder.store) as pins:
            return self._run(targets, pins)

    def _run(self, targets: list[str], pins: Pins) -> dict[str, Outcome]:
        if isinstance(self.builder.runner, GraphRunner):
            return self._run_whole(targets, pins)
        graph, keys = self.builder.graph, self.builder.keys
        names = graph.closure(targets)
        outcomes = {name: Outcome(name, keys[name], needs=tuple(graph.edges[name])) for name in names}
        waiting = {name: {d for d in graph.edges[name] if d in outcomes} for name in names}
        pending = list(names)  # not yet started, in build order
        blocked: set[str] = set()  # a dependency failed
        running: dict[Future[tuple[str, float]], str] = {}
        stop = False
        self.progress.begin(names)
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="kiln-build")
        try:
            while True:
                stop = stop or TOKEN.cancelled
                if not stop:
                    self._take_stored(pending, waiting, blocked, pins, outcomes)
                    ready = [n for n in pending if not waiting[n] and n not in blocked]
                    for name in self._first(ready, names)[: self.jobs - len(running)]:
                        pending.remove(name)
                        self.progress.started(name)
                        running[pool.submit(self._build_one, outcomes[name], pins)] = name
                if not running:
                    if not stop and any(not waiting[n] and n not in blocked for n in pending):
                        continue  # a cached package just unblocked more
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    name = running.pop(future)
                    if self._settle(future, outcomes[name]):
                        self._release(name, waiting)
                    else:
                        blocked.update(graph.dependents(name))
                        stop = stop or not self.keep_going
        except BaseException as exc:
            self._abort(exc, pool, running, outcomes)
            raise
        pool.shutdown(wait=True)
        self.progress.end(outcomes)
        if TOKEN.cancelled:
            raise Interrupted(TOKEN.signum or signal.SIGINT)
        return outcomes

    def _abort(
        self,
        exc: BaseException,
        pool: ThreadPoolExecutor,
        running: dict[Future[tuple[str, float]], str],
        outcomes: dict[str, Outcome],
    ) -> None:
        """The main thread was interrupted: start nothing more, let running builds unwind, report them.

        On a signal the token is cancelled first, so running steps are killed and nothing is
        committed; waiting here is what lets every staging dir be discarded before exit.
        """
        if isinstance(exc, KeyboardInterrupt):
            TOKEN.cancel(getattr(exc, "signum", signal.SIGINT))
        pool.shutdown(wait=True, cancel_futures=True)
        for future, name in running.items():
            if not future.cancelled():
                self._settle(future, outcomes[name])
        self.progress.end(outcomes)

    def _settle(self, future: Future[tuple[str, float]], outcome: Outcome) -> bool:
        """Record a finished build's outcome and report it; True if its entry is stored."""
        error = future.exception()
        if error is None:
            outcome.status, outcome.seconds = future.result()
        elif not isinstance(error, Exception):
            raise error
        else:
            outcome.status = CANCELLED if TOKEN.cancelled else FAILED
            outcome.error = (
                error
                if isinstance(error, KilnError)
                else BuildError(f"package '{outcome.name}': {type(error).__name__}: {error}")
            )
        self.progress.done(outcome)
        return error is None

    def _run_whole(self, targets: list[str], pins: Pins) -> dict[str, Outcome]:
        """On a whole-graph runner: claim every missing key (in one order, so no deadlock), build them at once."""
        store, keys = self.builder.store, self.builder.keys
        graph = self.builder.graph
        names = graph.closure(targets)
        outcomes = {name: Outcome(name, keys[name], needs=tuple(graph.edges[name])) for name in names}
        self.progress.begin(names)
        missing = [n for n in names if not self._cached(n, pins, outcomes[n], wait=False)]
        with contextlib.ExitStack() as stack:
            for name in sorted(missing, key=lambda n: keys[n]):
                stack.enter_context(store.lock(keys[name]))
            missing = [n for n in missing if not self._cached(n, pins, outcomes[n], wait=True)]  # built meanwhile?
            if missing:
                self._build_whole(missing, pins, outcomes)
        self.progress.end(outcomes)
        return outcomes

    def _cached(self, name: str, pins: Pins, outcome: Outcome, *, wait: bool) -> bool:
        """Is the package's entry stored (and now pinned)? Reported as cached if so."""
        if (self.no_cache and name not in self.prebuilt) or not pins.pin(outcome.key, wait=wait):
            return False
        self.builder.store.touch(outcome.key)
        outcome.status = CACHED
        outcome.started = outcome.finished = self.now()
        self.progress.done(outcome)
        return True

    def _build_whole(self, missing: list[str], pins: Pins, outcomes: dict[str, Outcome]) -> None:
        """Build the claimed packages in one go and report each; the failed solve's culprits carry the error.

        One solve has no per-package start times: each package starts with the solve and ends its
        own build time later (a failed one when the solve ends).
        """
        started = self.now()
        for name in missing:
            self.progress.started(name)
            pins.unpin(outcomes[name].key)  # a --no-cache rebuild replaces the entry under its exclusive lock
        result = self.builder.build_graph(missing, self.progress.phase, no_cache=self.no_cache)
        runner, culprits = self.builder.runner.name, result.failed or missing
        ended = self.now()
        for name in missing:
            outcome = outcomes[name]
            outcome.started, outcome.finished = started, ended
            if result.code == 0:
                outcome.status, outcome.seconds = BUILT, result.seconds[name]
                outcome.finished = round(started + outcome.seconds, 3)
                pins.pin(outcome.key)
            elif name in culprits:
                log = log_path(self.builder.store, name, outcome.key)
                outcome.status = FAILED
                outcome.error = BuildError(
                    f"package '{name}' failed on {runner} (exit {result.code}); full log {result.log}, "
                    f"package log {log}:\n{result.tail}"
                )
            self.progress.done(outcome)

    def _take_stored(
        self,
        pending: list[str],
        waiting: dict[str, set[str]],
        blocked: set[str],
        pins: Pins,
        outcomes: dict[str, Outcome],
    ) -> None:
        """Mark every ready package whose entry is stored as cached (no worker needed), until none is left."""
        keys = self.builder.keys
        found = True
        while found:
            found = False
            for name in [n for n in pending if not waiting[n] and n not in blocked]:
                # Without waiting: an entry being evicted right now goes to a worker, which rebuilds it.
                if (not self.no_cache or name in self.prebuilt) and pins.pin(keys[name], wait=False):
                    pending.remove(name)
                    self.builder.store.touch(keys[name])
                    outcomes[name].status = CACHED
                    outcomes[name].started = outcomes[name].finished = self.now()
                    self.progress.done(outcomes[name])
                    self._release(name, waiting)
                    found = True

    def _first(self, ready: list[str], names: list[str]) -> list[str]:
        """`ready` heaviest chain first: a package's weight plus the heaviest chain of the run's packages
        that need it (the critical path by source bytes); ties keep build order."""
        edges = self.builder.graph.edges
        needed_by: dict[str, list[str]] = {name: [] for name in names}
        for name in names:
            for need in edges[name]:
                if need in needed_by:
                    needed_by[need].append(name)
        chain: dict[str, float] = {}
        for name in reversed(names):  # build order: a package's dependents come after it
            chain[name] = self.weigh(name) + max((chain[d] for d in needed_by[name]), default=0)
        return sorted(ready, key=lambda name: -chain[name])

    @staticmethod
    def _release(name: str, waiting: dict[str, set[str]]) -> None:
        for needs in waiting.values():
            needs.discard(name)

    def _build_one(self, outcome: Outcome, pins: Pins) -> tuple[str, float]:
        """Runs in a worker: build under the key's build lock unless another process just did; pin the entry.

        The pin is taken under the build lock, which gc and remove respect, so the entry
        cannot go between being stored and being pinned. The outcome's start and finish are
        set here, failed or not; the main thread reads them only once this has returned.
        """
        outcome.started = self.now()
        try:
            return self._build_locked(outcome.name, pins)
        finally:
            outcome.finished = self.now()

    def _build_locked(self, name: str, pins: Pins) -> tuple[str, float]:
        store, key = self.builder.store, self.builder.keys[name]
        start = time.monotonic()
        TOKEN.check(f"package '{name}'")
        pins.unpin(key)  # a --no-cache rebuild evicts the entry: our own pin would block that forever
        with store.lock(key):
            status = CACHED
            if self.no_cache or not store.has(key):
                self.builder.build(name, lambda text: self.progress.phase(name, text), replace=self.no_cache)
                status = BUILT
            if not pins.pin(key):
                raise BuildError(f"package '{name}': its entry {key} is missing right after it was stored")
        return status, round(time.monotonic() - start, 2)
