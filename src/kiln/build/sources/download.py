"""The fetcher: a source's bytes from the first place that has them, kept only once their sha256 matches.

A source is trusted only through its pinned sha256, so it does not matter where the bytes
come from: a local directory, an HTTP mirror, Debian's source archive (through `apt-get
source`, the one reachable origin on some build hosts) or upstream. Every download goes to a
temporary file next to the cache entry and is renamed into place only once its hash matches,
so a bad or partial file is never kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from kiln.build.sources.archives import CHECK_VERSION, check_archive
from kiln.build.sources.cache import CHECKED_SUFFIX, PART_PREFIX, SHA256_NAME, still_verified, write_atomic, write_stamp
from kiln.build.sources.debian import apt_source
from kiln.build.sources.errors import FetchError, FetchErrors, Miss
from kiln.build.sources.mirrors import Mirror
from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.hashing import CHUNK
from kiln.pkg.model import Source

if TYPE_CHECKING:  # requests and urllib3 are imported when a download happens: a no-op build needs neither
    import requests


DownloadProgress = Callable[[str, int, int | None], None]
"""Called as (file name, bytes so far, total bytes or None); may run on worker threads."""

RETRY_STATUSES = (429, 500, 502, 503, 504)


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
        self._guard = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}  # one download per sha256 in this process

    def path_for(self, sha256: str) -> Path:
        return self.sources_dir / sha256

    def fetch(self, source: Source, where: Location | None = None) -> Path:
        """The verified cached file for `source`, downloading it if the cache lacks it."""
        if source.url is None or source.sha256 is None:
            raise FetchError(f"source {source.destination!r} is local: it is placed, not fetched", where)
        sha = source.sha256
        if not SHA256_NAME.fullmatch(sha):
            raise FetchError(f"malformed sha256 {sha!r} for {source.url}: expected 64 lowercase hex digits", where)
        target = self.path_for(sha)
        with self._guard:
            fetching = self._fetching.setdefault(sha, threading.Lock())
        with fetching:  # a build and the run's prefetch (kiln.build.prefetch) may ask at once
            if not still_verified(target, sha):
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
                write_stamp(target, sha)
                return
            except Miss as miss:
                notes.append(f"{origin}: {miss}")
            except OSError as exc:
                notes.append(f"{origin}: {exc}")
            finally:
                sink.discard()
        headline = f"sha256 mismatch for {url}" if mismatch else f"cannot fetch {url}"
        tried = "\n".join(f"  {note}" for note in notes)
        raise FetchError(f"{headline} (expected sha256 {sha}); tried in order:\n{tried}", where)

    def _candidates(self, source: Source, url: str, sha: str) -> Iterator[tuple[str, Writer]]:
        """(where, writer) for each place to try, mirrors first; writers raise Miss."""
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
                        raise Miss(f"HTTP {response.status_code} {response.reason}".rstrip())
                    length = response.headers.get("Content-Length")
                    sink.start(int(length) if length and length.isdigit() else None)
                    # Raw bytes: a server that labels a .tar.gz `Content-Encoding: gzip` must not
                    # get it decompressed under us, or the hash is of the wrong bytes.
                    for chunk in response.raw.stream(CHUNK, decode_content=False):
                        sink.write(chunk)
            except (requests.RequestException, Urllib3Error) as exc:
                raise Miss(_describe(exc)) from None

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
                raise Miss(str(exc)) from None

        return get

    def _debian(self, hint: str, sha: str) -> Writer:
        def get(sink: _Sink) -> None:
            apt_source(hint, sha, self.apt_timeout, sink.copy_from)

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
            write_atomic(marker, verdict)
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


def _missing(reason: str) -> Writer:
    def miss(sink: _Sink) -> None:
        raise Miss(reason)

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
