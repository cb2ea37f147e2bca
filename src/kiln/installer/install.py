"""`kiln install --disk PATH` on the host: the same `machined install` the installer image runs.

machined is static, so the binary built for the image runs on the host too, and the host and
the container share one implementation of checks and writes (runtime/machined/install.go).
Its exit codes map onto Kiln's errors: 2 with its one `install: ...` line (a refusal: a used or
in-use disk, a disk too small, a missing image; nothing was written) -> InputError, so
`kiln install` exits 2; anything else -> BuildError. A Go runtime panic also exits 2, so a 2
whose stderr is not that one line is a BuildError too. Progress lines go straight to our stdout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kiln.core.errors import BuildError, InputError


def install_disk(machined: Path, image: Path, disk: Path, *, wipe: bool) -> None:
    """Write the raw (or gzip'd) disk image onto disk; refuse a used disk unless wipe."""
    _machined_install(machined, ["--disk", str(disk), "--image", str(image)] + ["--wipe"] * wipe)


def check_disk(machined: Path, disk: Path, image: Path | int, *, wipe: bool) -> None:
    """Every check install_disk's write would make (the disk's kind, use, size and content), for that
    image or for one of that many bytes not made yet; nothing is written. A wrong disk then costs no
    image build."""
    what = ["--image", str(image)] if isinstance(image, Path) else ["--size", str(image)]
    _machined_install(machined, ["--check", "--disk", str(disk), *what] + ["--wipe"] * wipe)


def _machined_install(machined: Path, arguments: list[str]) -> None:
    """`machined install ARGUMENTS`: its one-line refusals become InputErrors (exit 2), other failures BuildErrors."""
    if not machined.is_file() or not os.access(machined, os.X_OK):
        raise InputError(f"install: machined {machined} is not an executable file")
    command = [str(machined), "install", *arguments]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as error:
        raise BuildError(f"install: cannot run {machined}: {error}") from error
    if done.returncode == 0:
        return
    lines = done.stderr.strip().splitlines()
    if done.returncode == 2 and len(lines) == 1 and lines[0].startswith("install: "):
        raise InputError(lines[0])
    message = lines[0].removeprefix("install: ") if lines else f"{machined} install exited with {done.returncode}"
    raise BuildError(f"install: {message}")
