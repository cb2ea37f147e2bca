"""Stopping a run on SIGINT or SIGTERM without storing anything half done.

The CLI's handlers (main thread) call `interrupt`: it sets the process's `TOKEN`, kills
the step processes registered with it, and raises `Interrupted` in the main thread so
the scheduler stops starting work. Builds run in worker threads, which signals never
reach: they see the token instead (a killed step, a check before each step and before
commit) and unwind, discarding their staging dirs. A second signal exits at once; the
store stays consistent even then (it survives SIGKILL), and gc removes what is left.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from kiln.core import console
from kiln.core.errors import BuildError

Stopper = Callable[[], None]


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by a signal; kiln exits with 128 + the signal's number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        return f"kiln: interrupted by {name}: running steps were stopped, their outputs not stored"


class Cancelled(BuildError):
    """Raised in a worker when the run was cancelled: its output is thrown away, never committed."""


class Token:
    """Whether this process's run was cancelled, plus what stops the step processes running now."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.RLock()  # re-entered when a signal lands while the main thread holds it
        self._stoppers: dict[int, Stopper] = {}
        self._next = 0
        self.signum: int | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, signum: int = signal.SIGINT) -> None:
        """Mark the run cancelled and stop every registered process (idempotent)."""
        with self._lock:
            if self.signum is None:
                self.signum = signum
            self._event.set()
            stoppers = list(self._stoppers.values())
        for stop in stoppers:
            _quietly(stop)

    def check(self, what: str = "build") -> None:
        """Raise Cancelled once the run is cancelled, so no new work starts and nothing is committed."""
        if self._event.is_set():
            raise Cancelled(f"{what}: cancelled")

    @contextmanager
    def stopper(self, stop: Stopper) -> Iterator[None]:
        """Register `stop` for the block; called at once if the run was cancelled meanwhile."""
        with self._lock:
            ident, self._next = self._next, self._next + 1
            self._stoppers[ident] = stop
            late = self._event.is_set()
        try:
            if late:
                _quietly(stop)
            yield
        finally:
            with self._lock:
                self._stoppers.pop(ident, None)

    def reset(self) -> None:
        """Forget a cancellation (tests running several builds in one process)."""
        with self._lock:
            self._event.clear()
            self.signum = None


TOKEN = Token()


def _quietly(stop: Stopper) -> None:
    """Run a stopper from a signal handler: a process already gone, or an engine that refuses, is no crash."""
    with suppress(Exception):
        stop()


def kill_group(pid: int) -> Stopper:
    """A stopper that SIGKILLs the process group `pid` leads (a step's process and its helpers)."""
    return lambda: os.killpg(pid, signal.SIGKILL)


def interrupt(signum: int, _frame: FrameType | None = None) -> None:
    """The signal handler: first signal cancels and raises Interrupted; a second one exits now."""
    if TOKEN.cancelled:
        TOKEN.cancel(signum)
        console.error("kiln: second signal: exiting now (kiln cache gc removes what is left)")
        os._exit(128 + signum)
    TOKEN.cancel(signum)
    raise Interrupted(signum)


@contextmanager
def handlers() -> Iterator[None]:
    """SIGINT and SIGTERM cancel the run for the block; SIGINT stays ignored if it was.

    Only the main thread can install handlers: called from another thread, this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        wanted.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, interrupt) for signum in wanted}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
