"""Judging a boot by its serial console: stream it to a log, stop at the expected line, a panic or the
timeout, and keep the last lines to show why (kiln.boot.qemu runs QEMU through it)."""

from __future__ import annotations

import collections
import io
import math
import os
import re
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypedDict

PANIC = re.compile(r"Kernel panic|end Kernel panic|kiln-init: fatal")
TAIL = 50


@dataclass
class BootResult:
    ok: bool
    seconds: float
    line: str | None
    tail: list[str]
    reason: str
    exit_code: int | None = None


class WatchOptions(TypedDict, total=False):
    """`watch`'s keywords for how a boot ends after its expected line, as a type: kiln.boot.qemu.boot
    takes them and hands them on, without a second copy of their defaults to keep in step."""

    until_exit: bool
    on_found: Callable[[BootResult], None] | None
    exit_timeout: float | None


def watch(
    command: list[str],
    expect: str,
    timeout: float,
    log: Path,
    echo: Callable[[str], None] | None = None,
    *,
    until_exit: bool = False,
    on_found: Callable[[BootResult], None] | None = None,
    exit_timeout: float | None = None,
) -> BootResult:
    """Run `command` (QEMU, its serial console on stdout) and judge its console as `boot` describes.

    Every console line goes to `log` (after the command line) and `echo`; the process is stopped
    at the end whatever happened. `on_found` hears of the expected line at once, while the guest
    runs; with `until_exit` the wait for the guest to power off lasts what is left of `timeout`, or `exit_timeout`
    seconds when given (math.inf: until it powers off, or the caller is interrupted).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)
    start = time.monotonic()
    with log.open("w") as out:
        out.write("# " + " ".join(command) + "\n")
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            lines = _Lines(out, tail, echo)
            result = _until_expected(process, lines, expect, timeout, start)
            if result.ok and on_found:
                on_found(result)  # the guest still runs: a caller may talk to it, or watch its network
            if result.ok and until_exit:
                left = timeout - (time.monotonic() - start) if exit_timeout is None else exit_timeout
                result = _wait_exit(process, lines, result, left)
        finally:
            _stop(process)
    return result


class _Lines:
    """The console's bytes as lines: each one logged, kept in the tail and echoed as it completes."""

    def __init__(self, out: IO[str], tail: collections.deque[str], echo: Callable[[str], None] | None) -> None:
        self.out, self.tail, self.echo = out, tail, echo
        self.pending = b""

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The lines `chunk` completes; a caller that stops early leaves the rest unread, as QEMU is stopped then."""
        self.pending += chunk
        *complete, self.pending = self.pending.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace").rstrip("\r")
            self.out.write(line + "\n")
            self.out.flush()
            self.tail.append(line)
            if self.echo:
                self.echo(line)
            yield line


def _until_expected(
    process: subprocess.Popen[bytes], lines: _Lines, expect: str, timeout: float, start: float
) -> BootResult:
    """Read the console until the expected line, a panic, the process's exit or the timeout."""
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                return BootResult(False, timeout, None, list(lines.tail), f"timed out after {timeout:.0f} s")
            ready = selector.select(min(left, 0.5))
            chunk = (process.stdout.read() or b"") if ready else b""
            if not chunk and process.poll() is not None:
                elapsed = time.monotonic() - start
                return BootResult(False, elapsed, None, list(lines.tail), f"QEMU exited with code {process.returncode}")
            for line in lines.feed(chunk):
                if expect in line:
                    return BootResult(True, time.monotonic() - start, line, list(lines.tail), "found")
                if PANIC.search(line):
                    return BootResult(False, time.monotonic() - start, line, list(lines.tail), "kernel panic")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_exit(process: subprocess.Popen[bytes], lines: _Lines, found: BootResult, left: float) -> BootResult:
    """After the expected line: read the console until QEMU exits on its own (the lines' partial
    last line goes on where the search for the expected one left it)."""
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), True)
    reader = threading.Thread(target=_drain, args=(process.stdout, lines), daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=None if math.isinf(left) else max(left, 0.1))
    except subprocess.TimeoutExpired:
        return BootResult(False, found.seconds, found.line, list(lines.tail), "the guest did not power off")
    reader.join(timeout=2)
    return BootResult(
        code == 0,
        found.seconds,
        found.line,
        list(lines.tail),
        "powered off" if code == 0 else f"QEMU exited with code {code}",
        code,
    )


def _drain(stream: IO[bytes], lines: _Lines) -> None:
    """Log the console until QEMU closes it, each line as it completes: a caller polls the log file
    for lines the guest prints after the expected one (a trial slot made the default)."""
    assert isinstance(stream, io.BufferedReader)
    for chunk in iter(lambda: stream.read1(65536), b""):
        for _ in lines.feed(chunk):
            pass
    if lines.pending:  # the last line, unfinished when QEMU closed the console
        for _ in lines.feed(b"\n"):
            pass
