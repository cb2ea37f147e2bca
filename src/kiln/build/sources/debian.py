"""Debian's source archive as a mirror: `apt-get source --download-only`, the file whose sha256 is pinned."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from kiln.build.sources.errors import Miss
from kiln.core.hashing import file_sha256

DEB_SRC_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# apt-get source is run one at a time: parallel runs only race on the same archive files.
_APT_LOCK = threading.Lock()


def apt_source(hint: str, sha: str, timeout: float, take: Callable[[Path], None]) -> None:
    """Download source package `hint` (package=version) and hand the file with sha256 `sha` to `take`.

    Raises Miss, saying why, when apt is missing, fails, takes longer than `timeout` or gives no such file.
    """
    apt = shutil.which("apt-get")
    if apt is None:
        raise Miss("apt-get is not installed (the debian mirror needs a Debian-based host)")
    with _APT_LOCK, tempfile.TemporaryDirectory(prefix="kiln-apt-") as tmp:
        _give_to_apt(Path(tmp))
        try:
            proc = subprocess.run(
                [apt, "source", "--download-only", hint],
                cwd=tmp,
                env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C"},  # messages we can recognise
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise Miss(f"apt-get source {hint} took longer than {timeout:.0f}s") from None
        if proc.returncode != 0:
            raise Miss(_apt_failure(hint, sha, proc.stdout + proc.stderr))
        got: list[str] = []
        for path in sorted(Path(tmp).iterdir()):
            if not path.is_file() or path.is_symlink():
                continue
            digest = file_sha256(path, follow_links=False)
            if digest == sha:
                take(path)
                return
            got.append(f"{path.name} ({digest})")
        raise Miss(
            f"apt-get source {hint} gave no file with sha256 {sha}, only: {', '.join(got) or 'nothing'}; "
            "Debian may have repacked the tarball: pin Debian's own file, or put upstream's in a mirror "
            "directory"
        )


def _give_to_apt(directory: Path) -> None:
    """Let apt's sandbox user write here; otherwise apt downloads as root and warns about it."""
    if os.geteuid() != 0:
        return
    try:
        uid = pwd.getpwnam("_apt").pw_uid
    except KeyError:
        return
    os.chown(directory, uid, -1)


def _apt_failure(hint: str, sha: str, output: str) -> str:
    """Turn apt-get's error into what to do about it."""
    if "Unable to find a source package" in output or "Can not find version" in output:
        return (
            f"Debian's archive no longer has {hint}; find the tarball elsewhere (sha256 {sha}) "
            "and put it in a mirror directory"
        )
    if "URIs in your sources.list" in output:
        line = f"deb-src [signed-by={DEB_SRC_KEYRING}] http://deb.debian.org/debian {_debian_suite()} main"
        return (
            "apt has no deb-src entry, so it cannot download source packages; add one and refresh apt's lists: "
            f"echo '{line}' > /etc/apt/sources.list.d/kiln-src.list && apt-get update"
        )
    errors = [line for line in output.splitlines() if line.startswith("E:")] or output.strip().splitlines()[-3:]
    return f"apt-get source {hint} failed: " + " ".join(errors)


def _debian_suite() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return "bookworm"
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.MULTILINE)
    return found.group(1) if found else "bookworm"
