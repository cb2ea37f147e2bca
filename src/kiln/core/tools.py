"""Running external programs to completion: one way to call them, one way to say they failed.

Every failure reads the same: "<what> failed (exit N): <the end of what it printed>", raised as the
caller's error class (a BuildError by default, exit 1), and a program that is not installed says so
instead of a FileNotFoundError traceback. Programs whose output streams somewhere as they run (a
build log, QEMU's console, a pipe between two programs) keep their own Popen.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

from kiln.core.errors import BuildError, KilnError

DETAIL = 2000  # characters of a failed program's output kept in the error


def run(
    argv: Sequence[str],
    *,
    what: str | None = None,
    stdin: bytes | str | None = None,
    stdout: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    ok: Collection[int] = (0,),
    error: type[KilnError] = BuildError,
) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` and wait; its output is captured (or `stdout` is written to), stdin is `stdin` or empty.

    `what` names the step in the error (default: the program's name); an exit code outside `ok`
    raises `error` with the end of stderr (or of stdout when stderr is empty).
    """
    data = stdin.encode() if isinstance(stdin, str) else stdin
    try:
        result = subprocess.run(
            list(argv),
            input=data,
            stdin=subprocess.DEVNULL if data is None else None,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError:
        raise error(f"{what or Path(argv[0]).name} failed: {argv[0]} is not installed") from None
    if result.returncode not in ok:
        raise error(f"{what or Path(argv[0]).name} failed (exit {result.returncode}): {_detail(result)}")
    return result


def _detail(result: subprocess.CompletedProcess[bytes]) -> str:
    text = (result.stderr or b"").decode(errors="replace").strip()
    if not text and result.stdout:
        text = result.stdout.decode(errors="replace").strip()
    return text[-DETAIL:] or "no output"
