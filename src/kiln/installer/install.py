"""`kiln install --disk PATH` on the host: the same `machined install` the installer image runs.

machined is static, so the binary built for the image runs on the host too, and the host and
the container share one implementation of checks and writes (runtime/machined/install.go).
Its exit codes map onto Kiln's errors: 2 (a refusal the user can fix) -> InputError,
anything else -> BuildError. Its progress lines go straight to our stdout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kiln.errors import BuildError, InputError


def install_disk(machined: Path, image: Path, disk: Path, wipe: bool) -> None:
    """Write the raw (or gzip'd) disk image onto disk; refuse a used disk unless wipe."""
    if not machined.is_file() or not os.access(machined, os.X_OK):
        raise InputError(f"install: machined {machined} is not an executable file")
    command = [str(machined), "install", "--disk", str(disk), "--image", str(image)]
    if wipe:
        command.append("--wipe")
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as error:
        raise BuildError(f"install: cannot run {machined}: {error}") from error
    if done.returncode == 0:
        return
    message = done.stderr.strip().removeprefix("install: ") or f"{machined} install exited with {done.returncode}"
    if done.returncode == 2:
        raise InputError(f"install: {message}")
    raise BuildError(f"install: {message}")
