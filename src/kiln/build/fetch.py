"""Sources: fetched once, verified by sha256, kept by hash; mirrors before the upstream URL.

A source is trusted only through its pinned sha256, so it does not matter where the
bytes come from: a local directory, an HTTP mirror, Debian's source archive (through
`apt-get source`, the one reachable origin on some build hosts) or upstream. Every
download goes to a temporary file next to the cache entry and is renamed into place
only once its hash matches, so a bad or partial file is never kept.

Archives (tar in every compression builds use, and zip) are also inspected once for
members that would land outside the extraction root (absolute paths, `..`, links
out, device nodes): builds unpack them with ordinary `tar`, which follows what the
archive says.

A cached file is never trusted for being there: before each use its stat (size,
mtime_ns, ctime_ns, inode, device) must match the stamp written when it was last
hashed (`<sha256>.verified`), or it is hashed again, and a file whose bytes no longer
match is removed and fetched again. ctime cannot be set back from user space, so
replacing or editing the bytes changes the stat. `kiln cache verify` re-hashes every
cached source regardless of stamps (verify_sources).

Layout of `$KILN_CACHE/sources/`:
    <sha256>            the verified file (mode 0444)
    <sha256>.checked    the archive check's verdict for those bytes (CHECK_VERSION first)
    <sha256>.verified   the stat stamp of the last full hash
    .part-*             downloads and markers being written; a download holds an
                        flock on its file while it is written, so remove_stale_partials
                        only removes files no live process holds (and, for markers,
                        only old ones)
"""

from __future__ import annotations

import bz2
import fcntl
import gzip
import hashlib
import lzma
import os
import pwd
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import unquote, urlsplit

from kiln.build.runners.finalize import copy_path
from kiln.core.errors import BuildError, InputError, InputErrors, KilnError, Location
from kiln.core.hashing import file_sha256
from kiln.core.paths import PathEscape, join_inside
from kiln.core.yamlfile import read_yaml_file
from kiln.pkg.model import Source

if TYPE_CHECKING:  # requests and urllib3 are imported when a download happens: a no-op build needs neither
    import requests

DownloadProgress = Callable[[str, int, int | None], None]
"""Called as (file name, bytes so far, total bytes or None); may run on worker threads."""

CONFIG_FILE = "kiln.yaml"
MIRRORS_ENV = "KILN_MIRRORS"
CHUNK = 1 << 20
CHECKED_SUFFIX = ".checked"
# First line of a `.checked` verdict; a verdict of an older check_archive (another first line) is redone.
CHECK_VERSION = "check 2\n"
STAMP_SUFFIX = ".verified"
PART_PREFIX = ".part-"
STALE_PARTIAL_SECONDS = 600.0
RETRY_STATUSES = (429, 500, 502, 503, 504)
DEB_SRC_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

_SHA256 = re.compile(r"[0-9a-f]{64}")
# apt-get source is run one at a time: parallel runs only race on the same archive files.
_APT_LOCK = threading.Lock()


class FetchError(KilnError):
    """A source could not be fetched, did not match its sha256, or is an unsafe archive."""

    exit_code = 1


class FetchErrors(FetchError):
    """Several sources failed in one pass; each is reported on its own line(s)."""

    def __init__(self, errors: list[KilnError]) -> None:
        ordered = sorted(errors, key=lambda e: (e.location or Location(""), e.message))
        super().__init__("\n".join(str(e) for e in ordered))
        self.errors = ordered


MirrorKind = Literal["dir", "http", "debian"]


@dataclass(frozen=True)
class Mirror:
    """Somewhere to look for a source before its upstream URL.

    `dir`: a local directory (location is an absolute path); `http`: a base URL;
    `debian`: Debian's source archive through `apt-get source` (location unused).
    """

    kind: MirrorKind
    location: str = ""

    def __str__(self) -> str:
        return "debian" if self.kind == "debian" else self.location

    @classmethod
    def parse(cls, text: str, base: Path, where: Location | None = None) -> Mirror:
        """One mirror as written in kiln.yaml or KILN_MIRRORS; relative paths are taken from `base`."""
        value = text.strip()
        if value in ("debian", "debian:"):
            return cls("debian")
        parts = urlsplit(value)
        scheme = parts.scheme.lower()
        if scheme in ("http", "https"):
            return cls("http", value.rstrip("/"))
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise InputError(f"mirror {value!r}: a file:// URL must name a local path (file:///dir)", where)
            from urllib.request import url2pathname

            return cls("dir", os.path.normpath(url2pathname(parts.path)))
        if not value or "://" in value or value.startswith("debian:"):
            raise InputError(
                f"mirror {value!r} is not a directory, a file://, http:// or https:// URL, or 'debian'", where
            )
        return cls("dir", os.path.normpath(base / os.path.expanduser(value)))


DEFAULT_MIRRORS = (Mirror("debian"),)


def load_mirrors(project_root: Path) -> list[Mirror]:
    """Mirrors from $KILN_MIRRORS if set (even empty), else kiln.yaml's `mirrors:`, else [debian].

    The environment wins so CI or one shell can point at a different cache without
    editing the project; an empty KILN_MIRRORS means upstream URLs only.
    """
    configured = os.environ.get(MIRRORS_ENV)
    if configured is not None:
        where = Location(f"${MIRRORS_ENV}")
        return [Mirror.parse(token, Path.cwd(), where) for token in re.split(r"[\s,]+", configured) if token]
    config = project_root / CONFIG_FILE
    if not config.is_file():
        return list(DEFAULT_MIRRORS)
    return _mirrors_from_file(config, project_root)


def _mirrors_from_file(config: Path, project_root: Path) -> list[Mirror]:
    """kiln.yaml's `mirrors:` (absent: the default; null: none), every bad entry reported at its line."""
    file = str(config)
    positioned = read_yaml_file(config, what=CONFIG_FILE)
    data = positioned.value
    if data is None:
        return list(DEFAULT_MIRRORS)
    if not isinstance(data, dict):
        raise InputError(f"{CONFIG_FILE} must be a mapping (for example 'mirrors: [...]')", Location(file, 1))
    if "mirrors" not in data:
        return list(DEFAULT_MIRRORS)
    entries = data["mirrors"]
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InputError("mirrors must be a list", Location(file, positioned.line(("mirrors",))))
    mirrors: list[Mirror] = []
    errors: list[KilnError] = []
    for index, entry in enumerate(entries):
        where = Location(file, positioned.line(("mirrors", index)))
        if not isinstance(entry, str):
            errors.append(InputError(f"mirror must be a string, not {entry!r}", where))
            continue
        try:
            mirrors.append(Mirror.parse(entry, project_root, where))
        except InputError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)
    return mirrors


class _Miss(Exception):
    """A place that did not have the file; the text says why, for the final error."""


class _Sink:
    """A temporary file in the cache directory that hashes what is written to it."""

    def __init__(self, directory: Path, label: str, progress: DownloadProgress | None) -> None:
        fd, name = tempfile.mkstemp(dir=directory, prefix=PART_PREFIX)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: remove_stale_partials leaves it alone
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._label = label
        self._progress = progress
        self.done = 0
        self.total: int | None = None

    def start(self, total: int | None) -> None:
        """Forget anything written by an earlier try (a retried download starts over)."""
        self._file.seek(0)
        self._file.truncate()
        self._hash = hashlib.sha256()
        self.done = 0
        self.total = total
        if self._progress:
            self._progress(self._label, 0, total)

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.done += len(data)
        if self._progress:
            self._progress(self._label, self.done, self.total)

    def copy_from(self, path: Path) -> None:
        self.start(path.stat().st_size)
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                self.write(chunk)

    def finish(self) -> str:
        """Flush to disk (the rename must not publish a half-written file) and return the sha256."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._hash.hexdigest()

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


Writer = Callable[[_Sink], None]


class Fetcher:
    """Fetches sources into `cache/sources/<sha256>`, trying mirrors in order, then the URL."""

    def __init__(
        self,
        cache: Path,
        mirrors: list[Mirror],
        progress: DownloadProgress | None = None,
        *,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 30.0,
        apt_timeout: float = 900.0,
    ) -> None:
        self.sources_dir = cache / "sources"
        self.mirrors = list(mirrors)
        self.progress = progress
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.apt_timeout = apt_timeout

    def path_for(self, sha256: str) -> Path:
        return self.sources_dir / sha256

    def fetch(self, source: Source, where: Location | None = None) -> Path:
        """The verified cached file for `source`, downloading it if the cache lacks it."""
        if source.url is None or source.sha256 is None:
            raise FetchError(f"source {source.destination!r} is local: it is placed, not fetched", where)
        sha = source.sha256
        if not _SHA256.fullmatch(sha):
            raise FetchError(f"malformed sha256 {sha!r} for {source.url}: expected 64 lowercase hex digits", where)
        target = self.path_for(sha)
        if not _still_verified(target, sha):
            self.sources_dir.mkdir(parents=True, exist_ok=True)
            self._download(source, source.url, sha, target, where)
        self._check_once(target, source.url, where)
        return target

    def _download(self, source: Source, url: str, sha: str, target: Path, where: Location | None) -> None:
        notes: list[str] = []
        mismatch = False
        label = _url_name(url) or sha
        for origin, writer in self._candidates(source, url, sha):
            sink = _Sink(self.sources_dir, label, self.progress)
            try:
                writer(sink)
                actual = sink.finish()
                if actual != sha:
                    mismatch = True
                    notes.append(f"{origin}: got sha256 {actual}, expected {sha}; the file was not kept")
                    continue
                sink.path.chmod(0o444)  # make in-place edits fail loudly (for anyone but root)
                os.replace(sink.path, target)
                _write_stamp(target, sha)
                return
            except _Miss as miss:
                notes.append(f"{origin}: {miss}")
            except OSError as exc:
                notes.append(f"{origin}: {exc}")
            finally:
                sink.discard()
        headline = f"sha256 mismatch for {url}" if mismatch else f"cannot fetch {url}"
        tried = "\n".join(f"  {note}" for note in notes)
        raise FetchError(f"{headline} (expected sha256 {sha}); tried in order:\n{tried}", where)

    def _candidates(self, source: Source, url: str, sha: str) -> Iterator[tuple[str, Writer]]:
        """(where, writer) for each place to try, mirrors first; writers raise _Miss."""
        name = _url_name(url)
        names = [n for n in (unquote(name), sha) if n]
        for mirror in self.mirrors:
            if mirror.kind == "dir":
                directory = Path(mirror.location)
                found = [directory / n for n in names if (directory / n).is_file()]
                if not found:
                    yield mirror.location, _missing(f"no {' or '.join(names)} in this directory")
                for path in found:
                    yield str(path), _copier(path)
            elif mirror.kind == "http":
                for n in dict.fromkeys((name, sha)):
                    if n:
                        yield f"{mirror.location}/{n}", self._getter(f"{mirror.location}/{n}")
            elif source.debian is None:
                yield "debian", _missing("skipped: the source has no 'debian: package=version' hint")
            else:
                yield f"debian ({source.debian})", self._debian(source.debian, sha)
        scheme = urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            yield url, self._getter(url)
        elif scheme == "ftp":
            yield url, self._ftp(url)
        else:
            yield url, _missing(f"unsupported URL scheme {scheme!r}")

    def _session(self) -> requests.Session:
        """A session retrying connection errors and 429/5xx with exponential backoff."""
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        retry = Retry(
            total=self.retries,
            connect=self.retries,
            read=self.retries,
            status=self.retries,
            backoff_factor=self.backoff,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=frozenset({"GET"}),
            raise_on_status=False,
            # A server's Retry-After could stall a build for hours; our own backoff is bounded.
            respect_retry_after_header=False,
        )
        session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = "kiln"
        return session

    def _getter(self, url: str) -> Writer:
        def get(sink: _Sink) -> None:
            import requests
            from urllib3.exceptions import HTTPError as Urllib3Error

            try:
                with self._session() as session, session.get(url, stream=True, timeout=self.timeout) as response:
                    if response.status_code != 200:
                        raise _Miss(f"HTTP {response.status_code} {response.reason}".rstrip())
                    length = response.headers.get("Content-Length")
                    sink.start(int(length) if length and length.isdigit() else None)
                    # Raw bytes: a server that labels a .tar.gz `Content-Encoding: gzip` must not
                    # get it decompressed under us, or the hash is of the wrong bytes.
                    for chunk in response.raw.stream(CHUNK, decode_content=False):
                        sink.write(chunk)
            except (requests.RequestException, Urllib3Error) as exc:
                raise _Miss(_describe(exc)) from None

        return get

    def _ftp(self, url: str) -> Writer:
        def get(sink: _Sink) -> None:
            import urllib.request

            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as response:
                    length = response.headers.get("Content-Length")
                    sink.start(int(length) if length and length.isdigit() else None)
                    for chunk in iter(lambda: response.read(CHUNK), b""):
                        sink.write(chunk)
            except (OSError, ValueError) as exc:
                raise _Miss(str(exc)) from None

        return get

    def _debian(self, hint: str, sha: str) -> Writer:
        def get(sink: _Sink) -> None:
            apt = shutil.which("apt-get")
            if apt is None:
                raise _Miss("apt-get is not installed (the debian mirror needs a Debian-based host)")
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
                        timeout=self.apt_timeout,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    raise _Miss(f"apt-get source {hint} took longer than {self.apt_timeout:.0f}s") from None
                if proc.returncode != 0:
                    raise _Miss(_apt_failure(hint, sha, proc.stdout + proc.stderr))
                got: list[str] = []
                for path in sorted(Path(tmp).iterdir()):
                    if not path.is_file() or path.is_symlink():
                        continue
                    digest = file_sha256(path, follow_links=False)
                    if digest == sha:
                        sink.copy_from(path)
                        return
                    got.append(f"{path.name} ({digest})")
                raise _Miss(
                    f"apt-get source {hint} gave no file with sha256 {sha}, only: {', '.join(got) or 'nothing'}; "
                    "Debian may have repacked the tarball: pin Debian's own file, or put upstream's in a mirror "
                    "directory"
                )

        return get

    def _check_once(self, path: Path, url: str, where: Location | None) -> None:
        """check_archive, run once per cached file; the verdict is kept in `<sha256>.checked`."""
        marker = path.with_name(path.name + CHECKED_SUFFIX)
        try:
            verdict = marker.read_text()
        except FileNotFoundError:
            verdict = ""
        if not verdict.startswith(CHECK_VERSION):  # none yet, or by an older, weaker check: judge again
            verdict = CHECK_VERSION + self._judge(path, unquote(_url_name(url)) or path.name)
            _write_atomic(marker, verdict)
        verdict = verdict.removeprefix(CHECK_VERSION)
        if verdict.startswith("refused\n"):
            raise FetchError(f"{url}: {verdict.removeprefix('refused').strip()}", where)

    @staticmethod
    def _judge(path: Path, name: str) -> str:
        try:
            checked = check_archive(path, name)
        except FetchError as exc:
            return f"refused\n{exc.message}\n"
        return "ok\n" if checked else "not an archive\n"


def _stamp(sha: str, info: os.stat_result) -> str:
    return f"{sha} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino} {info.st_dev}\n"


def _write_atomic(path: Path, text: str) -> None:
    """Write a small marker next to its file by rename, so a reader sees all of it or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PART_PREFIX)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _write_stamp(path: Path, sha: str) -> None:
    """Record the stat of a file just hashed to `sha`; only a matching stat lets a later use skip the hash."""
    _write_atomic(path.with_name(path.name + STAMP_SUFFIX), _stamp(sha, os.lstat(path)))


def _still_verified(path: Path, sha: str) -> bool:
    """True if the cached `path` still holds `sha`'s bytes; a damaged file is removed (and False returned).

    Cheap when the stamp matches the file's stat; otherwise a full hash decides.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(info.st_mode):
        try:
            if path.with_name(path.name + STAMP_SUFFIX).read_text() == _stamp(sha, info):
                return True
        except OSError:
            pass
        try:
            intact = file_sha256(path, follow_links=False) == sha
        except OSError:  # unreadable counts as damaged: fetched again
            intact = False
        if intact:
            _write_stamp(path, sha)
            return True
    _forget(path)
    return False


def _forget(path: Path) -> None:
    """Remove a cached source and what was recorded about it."""
    for stale in (path, path.with_name(path.name + CHECKED_SUFFIX), path.with_name(path.name + STAMP_SUFFIX)):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)


def verify_sources(cache: Path) -> tuple[int, list[str]]:
    """Re-hash every cached source (stamps ignored): (files checked, problems).

    A file whose bytes do not match its name is removed, so no build uses it; the
    next build fetches it again.
    """
    directory = cache / "sources"
    if not directory.is_dir():
        return 0, []
    problems: list[str] = []
    checked = 0
    for path in sorted(directory.iterdir()):
        if not _SHA256.fullmatch(path.name):
            continue
        checked += 1
        try:
            actual = file_sha256(path, follow_links=False) if stat.S_ISREG(os.lstat(path).st_mode) else None
        except OSError as exc:
            actual, found = None, f"cannot be read ({exc.strerror})"
        else:
            found = f"has sha256 {actual}" if actual else "is not a regular file"
        if actual == path.name:
            _write_stamp(path, actual)
            continue
        problems.append(f"source {path.name} {found}: removed, it will be fetched again")
        _forget(path)
    return checked, problems


def stale_partials(cache: Path, older_than: float = STALE_PARTIAL_SECONDS) -> list[Path]:
    """Partial downloads and markers under sources/ that no live process holds and that are old enough.

    A download flocks its `.part-*` file until it is renamed or removed, so a file we
    can lock belongs to a process that died. The age guard covers the instant between
    mkstemp and flock, and markers written without a lock.
    """
    directory = cache / "sources"
    if not directory.is_dir():
        return []
    cutoff = time.time() - older_than
    found: list[Path] = []
    for path in sorted(directory.glob(PART_PREFIX + "*")):
        with _unless_held(path) as free:
            if free and os.lstat(path).st_mtime < cutoff:
                found.append(path)
    return found


def remove_stale_partials(cache: Path, older_than: float = STALE_PARTIAL_SECONDS) -> list[Path]:
    """Remove what stale_partials finds, each under its lock so a download cannot take it meanwhile."""
    removed: list[Path] = []
    for path in stale_partials(cache, older_than):
        with _unless_held(path) as free:
            if free:
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


@contextmanager
def _unless_held(path: Path) -> Iterator[bool]:
    """Hold `path`'s flock for the block if nobody else does: yields False if it is held or gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        yield False
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def fetch_all(fetcher: Fetcher, sources: list[tuple[Source, Location]], workers: int = 4) -> list[Path]:
    """Fetch many sources in parallel (each sha256 once), reporting every failure together."""
    unique: dict[str, tuple[Source, Location]] = {}
    for source, where in sources:
        unique.setdefault(source.sha256 or f"local:{source.path}", (source, where))
    futures: dict[str, Future[Path]] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(unique)))) as pool:
        for key, (source, where) in unique.items():
            futures[key] = pool.submit(fetcher.fetch, source, where)
    errors: list[KilnError] = []
    for future in futures.values():
        exc = future.exception()
        if exc is None:
            continue
        if not isinstance(exc, KilnError):
            raise exc
        errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        if all(isinstance(e, InputError) for e in errors):
            raise InputErrors(errors)
        raise FetchErrors(errors)
    return [futures[source.sha256 or f"local:{source.path}"].result() for source, _ in sources]


class _Escape(Exception):
    """A link target that leaves the extraction root, or loops."""


class _Links:
    """Resolves paths inside an archive the way the kernel would after extraction."""

    MAX_DEPTH = 40

    def __init__(self, symlinks: dict[str, str]) -> None:
        self.symlinks = symlinks

    def resolve(self, base: list[str], target: str, depth: int = 0) -> list[str]:
        """Components of `target` (relative to directory `base`) with every archive symlink followed."""
        if depth > self.MAX_DEPTH:
            raise _Escape("is part of a symlink loop")
        if target.startswith("/"):
            raise _Escape("points to an absolute path")
        current = list(base)
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not current:
                    raise _Escape("points outside the extraction root")
                current.pop()
                continue
            current.append(part)
            link = self.symlinks.get("/".join(current))
            if link is not None:
                current = self.resolve(current[:-1], link, depth + 1)
        return current


MemberKind = Literal["file", "dir", "symlink", "hardlink", "device", "other"]


@dataclass(frozen=True)
class Member:
    """One archive member as the checks see it, whatever the archive format."""

    name: str
    kind: MemberKind
    link: str = ""


# Magic numbers of what `tar -xf` (or unzip) would unpack; compressions Python lacks go through their tool.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"LZIP", "lzip"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"\x5d\x00\x00", "lzma"),  # lzma-alone: GNU tar goes by the .tar.lzma suffix, these bytes catch any name
    (b"\x89LZO", "lzop"),
    (b"\x1f\x9d", "compress"),
    (b"\x04\x22\x4d\x18", "lz4"),
)
# --strip-components levels checked when the caller does not know the one used (see check_archive).
STRIP_LEVELS = (0, 1)
_TOOLS = {"zstd": "zstd", "lzip": "lzip"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TAIL_KEEP = 1 << 20


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Tail:
    """A forward-only reader that remembers the last bytes it handed out.

    tarfile stops silently at an unreadable header once past the first member; GNU tar
    skips it and extracts what follows. Keeping the tail lets the check look at the
    block where tarfile stopped and refuse unless it is a clean end of archive.
    """

    def __init__(self, raw: _Readable) -> None:
        self._raw = raw
        self.done = 0
        self._tail = bytearray()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.done += len(data)
        self._tail += data
        if len(self._tail) > 2 * _TAIL_KEEP:
            del self._tail[:-_TAIL_KEEP]
        return data

    def since(self, offset: int) -> bytes:
        """What was handed out from `offset` on (offset must lie in the kept tail)."""
        start = offset - (self.done - len(self._tail))
        if start < 0:
            raise ValueError(f"offset {offset} is no longer kept")
        return bytes(self._tail[start:])

    def drain_is_zero(self) -> bool:
        """Read to the end; True if everything left is zero bytes (tar's padding)."""
        while chunk := self._raw.read(CHUNK):
            self.done += len(chunk)
            if chunk.count(0) != len(chunk):
                return False
        return True


def _sniff(path: Path) -> str | None:
    """The container or compression format by magic number, or None (plain tar or no archive)."""
    with path.open("rb") as handle:
        head = handle.read(8)
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


@contextmanager
def _decompressed(path: Path, kind: str | None, shown: str) -> Iterator[_Readable]:
    """The bytes of `path` after its compression; zstd and lzip through their tools (argv, no shell)."""
    if kind is None:
        with path.open("rb") as handle:
            yield handle
        return
    if kind == "gzip":
        with gzip.open(path, "rb") as gz:
            yield gz
        return
    if kind == "bzip2":
        with bz2.open(path, "rb") as bz:
            yield bz
        return
    if kind in ("xz", "lzma"):
        with lzma.open(path, "rb", format=lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE) as xz:
            yield xz
        return
    tool = shutil.which(_TOOLS.get(kind, kind))
    if kind not in _TOOLS:
        raise FetchError(f"cannot check archive {shown}: {kind}-compressed data cannot be inspected, so it is refused")
    if tool is None:
        raise FetchError(
            f"cannot check archive {shown}: it is {kind}-compressed and {_TOOLS[kind]} is not installed "
            f"(apt-get install {_TOOLS[kind]}); an archive that cannot be checked is refused"
        )
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [tool, "-dc", "--", str(path)], stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        try:
            yield proc.stdout
            while proc.stdout.read(CHUNK):
                pass
            if proc.wait() != 0:
                errors.seek(0)
                said = errors.read().decode(errors="replace").strip()
                raise FetchError(f"cannot read archive {shown}: {_TOOLS[kind]} -dc failed: {said}")
        finally:
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _looks_like_tar(block: bytes) -> bool:
    """A first block GNU tar would take for a tar header: ustar magic or a matching checksum."""
    if len(block) < tarfile.BLOCKSIZE:
        return False
    if block[257:262] == b"ustar":
        return True
    field = block[148:156].replace(b"\0", b" ").strip()
    if not field or not all(48 <= c <= 55 for c in field):
        return False
    return int(field, 8) in tarfile.calc_chksums(block)  # type: ignore[attr-defined]


def _tar_kind(member: tarfile.TarInfo) -> MemberKind:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk():
        return "device"
    if member.isdir():
        return "dir"
    return "file" if member.isreg() else "other"


_READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError)


def _open_tar(reader: _Tail, shown: str) -> tarfile.TarFile | None:
    """tarfile in stream mode over `reader`; None if the data is no tar (GNU tar would not take it either)."""
    try:
        return tarfile.open(fileobj=reader, mode="r|")  # type: ignore[call-overload,no-any-return]
    except tarfile.TarError as exc:
        if _looks_like_tar(reader.since(0)[: tarfile.BLOCKSIZE]):
            raise FetchError(f"cannot read archive {shown}: {exc}") from None
        return None
    except _READ_ERRORS as exc:  # the compression is damaged: whatever it holds cannot be checked
        raise FetchError(f"cannot read archive {shown}: {exc}") from None


def tar_members(path: Path, shown: str | None = None) -> list[Member]:
    """Every member of a tar in any compression check_archive knows, read to a clean end.

    For callers whose own rules differ from check_archive's (a root filesystem layer
    holds absolute symlinks): the reading is as strict, the judging is theirs.
    """
    name = shown or path.name
    members = _tar_members(path, _sniff(path), name)
    if members is None:
        raise FetchError(f"cannot read archive {name}: it is not a tar archive")
    return members


def _tar_members(path: Path, kind: str | None, shown: str) -> list[Member] | None:
    """Every member of a (compressed) tar, read to a clean end; None if the data is no tar at all."""
    with _decompressed(path, kind, shown) as raw:
        reader = _Tail(raw)
        tar = _open_tar(reader, shown)
        if tar is None:
            return None
        with tar:
            try:
                members = [Member(m.name, _tar_kind(m), m.linkname) for m in tar]
            except _READ_ERRORS as exc:
                raise FetchError(f"cannot read archive {shown}: {exc}") from None
            _check_tar_end(reader, tar.offset, len(members), shown)
    return members


def _check_tar_end(reader: _Tail, offset: int, count: int, shown: str) -> None:
    """Refuse unless tarfile stopped at the end of the data or at a zero block followed only by zeros."""
    block = reader.since(offset)[: tarfile.BLOCKSIZE]
    where = f"at byte {offset}, after {count} members"
    if not block and reader.done == offset:
        return
    if len(block) < tarfile.BLOCKSIZE:
        raise FetchError(f"cannot read archive {shown}: truncated header {where}")
    if block.count(0) != len(block):
        raise FetchError(
            f"cannot read archive {shown}: unreadable tar header {where} (GNU tar would skip it and "
            "extract what follows, so the archive is refused)"
        )
    rest = reader.since(offset + tarfile.BLOCKSIZE)
    if rest.count(0) != len(rest) or not reader.drain_is_zero():
        raise FetchError(f"cannot read archive {shown}: data after the end-of-archive marker {where}")


def _zip_members(path: Path, shown: str) -> list[Member]:
    """Members of a zip as unzip would make them: the Unix mode in the external attributes says links and devices."""
    members: list[Member] = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                mode = info.external_attr >> 16
                if "\\" in info.filename:
                    raise FetchError(
                        f"unsafe archive {shown}: member {info.filename!r} has a backslash "
                        "(unzip may take it for a path separator)"
                    )
                if stat.S_ISLNK(mode):
                    if info.file_size > 4096:
                        raise FetchError(f"unsafe archive {shown}: symlink {info.filename!r} has a huge target")
                    target = archive.read(info).decode("utf-8", "surrogateescape")
                    members.append(Member(info.filename, "symlink", target))
                elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    members.append(Member(info.filename, "device"))
                else:
                    members.append(Member(info.filename, "dir" if info.is_dir() else "file"))
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        NotImplementedError,
        ValueError,
    ) as exc:
        raise FetchError(f"cannot read archive {shown}: {exc}") from None
    return members


def check_archive(path: Path, name: str | None = None, strip_components: int | None = None) -> str | None:
    """Refuse an archive with a member that would be written or point outside the extraction root.

    Formats: tar (plain, gzip, bzip2, xz, and zstd or lzip through their tools) and zip;
    a tar is read to a clean end, since GNU tar goes on past a header tarfile cannot
    read. Refused: absolute names, `..` components, control characters in names,
    symlinks and hardlinks whose target resolves (through the archive's own symlinks)
    outside the root, device nodes, and anything unreadable or uncheckable.

    `tar --strip-components=N` moves members up, so a symlink that is safe in place
    (`a/l -> ../x`) can point out once stripped (`l -> ../x`). With `strip_components`
    the check applies that level (as GNU tar does, to names and hardlink targets).
    Without it, the levels in STRIP_LEVELS are checked: builds strip in their shell
    steps, where Kiln cannot see the number, and every pkgs/ step strips 0 or 1.
    Checking every level instead would refuse ordinary tarballs: a link
    `pkg/a/b/l -> ../../x` is fine up to one level and points out at two.

    Returns the format checked ("tar" or "zip"), or None for a file that is no
    archive (a patch, a plain gzip file): its first block is no tar header, so GNU
    tar would not unpack it either.
    """
    shown = name or path.name
    try:
        kind = _sniff(path)
    except OSError as exc:
        raise FetchError(f"cannot read archive {shown}: {exc}") from None
    if kind == "zip":
        members: list[Member] | None = _zip_members(path, shown)
        checked = "zip"
    else:
        members = _tar_members(path, kind, shown)
        checked = "tar"
    if members is None:
        return None
    _check_names(members, shown)
    if strip_components is not None:
        levels: tuple[int, ...] = (strip_components,)
    else:
        levels = STRIP_LEVELS if checked == "tar" else (0,)  # unzip strips nothing
    for level in levels:
        _check_links(members, shown, level)
    return checked


def _check_names(members: list[Member], shown: str) -> None:
    """What no extraction should ever write: absolute names, `..`, control characters, devices."""
    for member in members:

        def refuse(why: str, member: Member = member) -> FetchError:
            return FetchError(f"unsafe archive {shown}: member {member.name!r} {why}")

        if member.name.startswith("/"):
            raise refuse("has an absolute path")
        if ".." in member.name.split("/"):
            raise refuse("has a '..' component")
        if _CONTROL.search(member.name) or _CONTROL.search(member.link):
            raise refuse("has a control character in its name or link target")
        if member.kind == "device":
            raise refuse("is a device node")
        if member.kind == "hardlink" and (member.link.startswith("/") or ".." in member.link.split("/")):
            raise refuse(f"is a hardlink that points outside the extraction root (target {member.link!r})")


def _strip(name: str, level: int) -> list[str] | None:
    """Components of `name` after GNU tar's --strip-components (which counts `.`), None if dropped."""
    parts = [p for p in name.split("/") if p]
    if len(parts) <= level:
        return None
    return [p for p in parts[level:] if p != "."]


def _check_links(members: list[Member], shown: str, level: int) -> None:
    """Every symlink and hardlink resolves inside the root once `level` components are stripped."""
    symlinks: dict[str, str] = {}
    for member in members:
        parts = _strip(member.name, level) if member.kind == "symlink" else None
        if parts:
            symlinks["/".join(parts)] = member.link
    links = _Links(symlinks)
    after = f" after --strip-components={level}" if level else ""
    for member in members:
        parts = _strip(member.name, level)
        if not parts or member.kind not in ("symlink", "hardlink"):
            continue
        try:
            if member.kind == "symlink":
                links.resolve(parts[:-1], member.link)
            else:
                target = _strip(member.link, level)  # hardlink targets are archive paths, stripped alike
                links.resolve([], "/".join(target or []))
        except _Escape as exc:
            raise FetchError(
                f"unsafe archive {shown}: member {member.name!r} is a {member.kind} that {exc}{after} "
                f"(target {member.link!r})"
            ) from None


def place_source(fetched: Path, build_dir: Path, destination: str) -> Path:
    """Put a copy of a fetched file at build_dir/destination.

    A copy, not a hard link: steps run with CAP_DAC_OVERRIDE, so a step appending to a
    hard-linked source would corrupt the verified cache for every later build. The
    bytes copied are hashed on the way (a cached file is named by its sha256), so a
    file swapped after Fetcher.fetch verified it never reaches the build.
    """
    target = _target(build_dir, destination)
    _copy_verified(fetched, target)
    target.chmod(0o644)
    return target


def _copy_verified(fetched: Path, target: Path) -> None:
    """Copy `fetched` to `target`, refusing (and forgetting the cached file) if its bytes are not its name's sha256."""
    h = hashlib.sha256()
    with open(os.open(fetched, os.O_RDONLY | os.O_NOFOLLOW), "rb") as source, target.open("wb") as out:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            h.update(chunk)
            out.write(chunk)
    if _SHA256.fullmatch(fetched.name) and h.hexdigest() != fetched.name:
        target.unlink()
        _forget(fetched)
        raise FetchError(
            f"cached source {fetched} changed after it was verified (sha256 {h.hexdigest()}); "
            "it was removed: run the build again to fetch it"
        )


def place_local(project_root: Path, source: Source, build_dir: Path) -> Path:
    """Copy a local source (a file or a tree of the project) to build_dir/destination.

    Symlinks are copied as links, never followed, so nothing outside the tree leaks
    in; hidden directories are skipped, as the cache key (keys.tree_digest) skips them.
    """
    if source.path is None:
        raise FetchError(f"source {source.destination!r} is not local: fetch it")
    rel = PurePosixPath(source.path)
    if rel.is_absolute() or ".." in rel.parts:
        raise FetchError(f"local source path {source.path!r} must be relative to the project root without '..'")
    root = project_root.resolve()
    origin = project_root / source.path
    if not origin.exists():
        raise FetchError(f"local source path {source.path!r} does not exist under {project_root}")
    if not origin.resolve().is_relative_to(root):
        raise FetchError(f"local source path {source.path!r} leads out of the project ({origin.resolve()})")
    target = _target(build_dir, source.destination)
    if target.is_dir():  # an earlier source is there: merge without following the links it left
        _merge_local(origin, build_dir, source.destination)
    elif origin.is_dir():
        shutil.copytree(origin, target, symlinks=True, ignore=_hidden_dirs)
    else:
        shutil.copy2(origin, target, follow_symlinks=False)
    return target


def _merge_local(origin: Path, build_dir: Path, destination: str) -> None:
    """Copy `origin` onto a directory an earlier source filled, as finalize copies: the
    destination is walked without following links, so a link the earlier source placed
    (say `x -> /etc/passwd`) is replaced, never written through."""
    with tempfile.TemporaryDirectory(prefix=".local-", dir=build_dir.parent) as tmp:
        staged = Path(tmp) / "tree"
        if origin.is_dir():
            shutil.copytree(origin, staged, symlinks=True, ignore=_hidden_dirs)
        else:
            staged.mkdir()
            shutil.copy2(origin, staged / origin.name, follow_symlinks=False)
        try:
            copy_path(staged, "/", build_dir, destination)
        except BuildError as exc:
            raise FetchError(f"local source onto {destination!r}: {exc.message}") from None


def _hidden_dirs(directory: str, names: list[str]) -> set[str]:
    base = Path(directory)
    return {n for n in names if n.startswith(".") and (base / n).is_dir() and not (base / n).is_symlink()}


def _target(build_dir: Path, destination: str) -> Path:
    """build_dir/destination with its parents made; refuses paths (or symlinked parents) leading out."""
    rel = PurePosixPath(destination)
    parts = [p for p in rel.parts if p != "."]
    if rel.is_absolute() or ".." in parts or not parts:
        raise FetchError(f"destination {destination!r} must be a relative path inside the build directory")
    root = build_dir.resolve()
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() and not current.resolve().is_relative_to(root):
            raise FetchError(f"destination {destination!r} leads out of the build directory through a symlink")
    try:  # the join itself resolves links inside the build directory, never with the host's view
        target = join_inside(root, destination, follow_last=False, what="destination")
    except PathEscape as exc:
        raise FetchError(exc.message) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    return target


def _missing(reason: str) -> Writer:
    def miss(sink: _Sink) -> None:
        raise _Miss(reason)

    return miss


def _copier(path: Path) -> Writer:
    def copy(sink: _Sink) -> None:
        sink.copy_from(path)

    return copy


def _url_name(url: str) -> str:
    """The last path segment of a URL, still percent-encoded."""
    return urlsplit(url).path.rsplit("/", 1)[-1]


def _describe(exc: BaseException) -> str:
    """The innermost cause of a requests/urllib3 error, without the connection-pool preamble."""
    reason: BaseException = exc
    for _ in range(8):
        inner = getattr(reason, "reason", None)
        if isinstance(inner, BaseException):
            reason = inner
        elif reason.args and isinstance(reason.args[0], BaseException):
            reason = reason.args[0]
        else:
            break
    text = re.sub(r"^\w*Connection(Pool)?\([^)]*\): ", "", str(reason))
    return text or type(reason).__name__


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
