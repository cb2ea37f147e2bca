"""Building a graph in parallel along the DAG, skipping keys already stored.

Readiness is tracked in the calling thread; each build runs in a worker thread
that holds the store lock for its key, so two kiln processes on one store never
build the same key at once (the second one finds it stored and calls it cached).
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from kiln.build.builder import Builder
from kiln.errors import BuildError, KilnError

BUILT, CACHED, FAILED, SKIPPED = "built", "cached", "failed", "skipped"


@dataclass
class Outcome:
    name: str
    key: str
    status: str = SKIPPED
    seconds: float = 0.0
    error: KilnError | None = field(default=None, repr=False)


class Progress(Protocol):
    """What the scheduler reports; plain lines or a live view implement it."""

    def begin(self, names: list[str]) -> None: ...

    def started(self, name: str) -> None: ...

    def phase(self, name: str, text: str) -> None: ...

    def done(self, outcome: Outcome) -> None: ...

    def end(self, outcomes: dict[str, Outcome]) -> None: ...


class Scheduler:
    def __init__(
        self, builder: Builder, progress: Progress, jobs: int, no_cache: bool = False, keep_going: bool = False
    ) -> None:
        self.builder = builder
        self.progress = progress
        self.jobs = max(1, jobs)
        self.no_cache = no_cache
        self.keep_going = keep_going

    def run(self, targets: list[str]) -> dict[str, Outcome]:
        """Build targets and everything they need; outcomes in build order."""
        graph, keys, store = self.builder.graph, self.builder.keys, self.builder.store
        names = graph.closure(targets)
        outcomes = {name: Outcome(name, keys[name]) for name in names}
        waiting = {name: {d for d in graph.edges[name] if d in outcomes} for name in names}
        pending = list(names)  # not yet started, in build order
        blocked: set[str] = set()  # a dependency failed
        running: dict[Future[tuple[str, float]], str] = {}
        stop = False
        self.progress.begin(names)
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="kiln-build") as pool:
            while True:
                for name in [n for n in pending if not waiting[n] and n not in blocked]:
                    if stop:
                        break
                    pending.remove(name)
                    if not self.no_cache and store.has(keys[name]):
                        store.touch(keys[name])
                        outcomes[name].status = CACHED
                        self.progress.done(outcomes[name])
                        self._release(name, waiting)
                        continue
                    self.progress.started(name)
                    running[pool.submit(self._build_one, name)] = name
                if not running:
                    if not stop and any(not waiting[n] and n not in blocked for n in pending):
                        continue  # a cached package just unblocked more
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    name = running.pop(future)
                    outcome = outcomes[name]
                    error = future.exception()
                    if error is None:
                        outcome.status, outcome.seconds = future.result()
                        self._release(name, waiting)
                    elif isinstance(error, Exception):
                        outcome.status = FAILED
                        outcome.error = error if isinstance(error, KilnError) else BuildError(
                            f"package '{name}': {type(error).__name__}: {error}"
                        )
                        blocked.update(graph.dependents(name))
                        stop = stop or not self.keep_going
                    else:  # KeyboardInterrupt: the pool's exit waits for running builds
                        raise error
                    self.progress.done(outcome)
        self.progress.end(outcomes)
        return outcomes

    @staticmethod
    def _release(name: str, waiting: dict[str, set[str]]) -> None:
        for needs in waiting.values():
            needs.discard(name)

    def _build_one(self, name: str) -> tuple[str, float]:
        """Runs in a worker: build under the key's lock unless another process just did."""
        store, key = self.builder.store, self.builder.keys[name]
        start = time.monotonic()
        with store.lock(key):
            if store.has(key):
                if not self.no_cache:
                    return CACHED, round(time.monotonic() - start, 2)
                store.remove_locked(key)
            self.builder.build(name, lambda text: self.progress.phase(name, text))
        return BUILT, round(time.monotonic() - start, 2)
