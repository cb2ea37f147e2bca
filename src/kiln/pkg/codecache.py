"""Compiled templates kept on disk, signed, so a planted cache file can never run.

Compiling a Jinja template (parse, generate Python, compile) costs about a millisecond;
a tree of hundreds of templates pays it on every `kiln validate`. Jinja's own
FileSystemBytecodeCache would save that, but it unmarshals whatever file it finds,
so anyone who can write the cache directory runs code as root. Here every entry
carries an HMAC-SHA256 over its name and payload, with a key that lives outside the
cache (`$KILN_STATE_DIR`, else `$XDG_STATE_HOME/kiln`, else `~/.local/state/kiln`),
readable by its owner only. An entry is unmarshalled only after its MAC verifies;
anything else (no key, a key with loose permissions, a bad or foreign entry) falls
back to compiling in memory. Copying a cache between machines copies no key.

Layout: `<cache>/templates/<sha256 hex>.bin` = 32-byte MAC + marshalled code object.
The name hashes the template file's path, its source, this module's and template.py's
source, Jinja's and Python's versions: a change to any of them is a different entry.
Races: entries are written to a temporary file and renamed, so readers see whole
files; two writers of one entry write the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import marshal
import os
import secrets
import stat
import sys
import tempfile
import types
from functools import cache
from pathlib import Path

import jinja2

from kiln.core.paths import cache_dir

_KEY_FILE = "template-cache.key"
_KEY_BYTES = 32
_MAX_ENTRY = 16 << 20


def _state_dir() -> Path:
    configured = os.environ.get("KILN_STATE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kiln"


def _private(info: os.stat_result) -> bool:
    """Owned by us and not readable or writable by anyone else."""
    return info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _load_key(directory: Path) -> bytes | None:
    """The signing key, created on first use; None when it cannot be trusted or made."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.stat(directory)):
            return None
        path = directory / _KEY_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(_KEY_BYTES))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or not _private(info) or info.st_size != _KEY_BYTES:
                return None
            key = handle.read(_KEY_BYTES)
    except OSError:
        return None
    return key if len(key) == _KEY_BYTES else None


@cache
def _key() -> bytes | None:
    """The key for this process, or None: then templates are compiled in memory only."""
    try:
        directory = _state_dir()
    except (RuntimeError, KeyError):  # no home directory to keep a key in
        return None
    return _load_key(directory)


@cache
def _version_tag() -> bytes:
    """What the compiled code depends on besides the template itself."""
    here = Path(__file__).parent
    parts = [(here / name).read_bytes() for name in ("codecache.py", "template.py")]
    parts += [jinja2.__version__.encode(), sys.version.encode()]
    return hashlib.sha256(b"\0".join(parts)).digest()


def _entry(file: str, source: str) -> tuple[Path, bytes]:
    name = hashlib.sha256(
        _version_tag() + file.encode("utf-8", "surrogatepass") + b"\0" + source.encode("utf-8", "surrogatepass")
    ).hexdigest()
    return cache_dir() / "templates" / f"{name}.bin", name.encode()


def load(file: str, source: str) -> types.CodeType | None:
    """The compiled code stored for this template, if its signature verifies; else None."""
    key = _key()
    if key is None:
        return None
    path, name = _entry(file, source)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not 32 < info.st_size <= _MAX_ENTRY:
            return None
        data = os.read(fd, info.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)
    mac, payload = data[:32], data[32:]
    if not hmac.compare_digest(mac, hmac.new(key, name + payload, hashlib.sha256).digest()):
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def store(file: str, source: str, code: types.CodeType) -> None:
    """Sign and keep `code`; failures only cost the next run a compile."""
    key = _key()
    if key is None:
        return
    path, name = _entry(file, source)
    payload = marshal.dumps(code)
    data = hmac.new(key, name + payload, hashlib.sha256).digest() + payload
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError:
        return
