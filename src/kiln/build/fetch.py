"""Sources: fetched once, verified by sha256, kept by hash; mirrors before the upstream URL.

A source is trusted only through its pinned sha256, so it does not matter where the
bytes come from: a local directory, an HTTP mirror, Debian's source archive (through
`apt-get source`, the one reachable origin on some build hosts) or upstream. Every
download goes to a temporary file next to the cache entry and is renamed into place
only once its hash matches, so a bad or partial file is never kept.

Tar archives are also inspected once for members that would land outside the
extraction root (absolute paths, `..`, links out, device nodes): builds unpack them
with ordinary `tar`, which follows what the archive says.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import pwd
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit

import yaml

from kiln.errors import InputError, InputErrors, KilnError, Location
from kiln.pkg.model import Source
from kiln.pkg.yamlpos import DuplicateKey, parse

if TYPE_CHECKING:  # requests and urllib3 are imported when a download happens: a no-op build needs neither
    import requests

Progress = Callable[[str, int, int | None], None]
"""Called as (file name, bytes so far, total bytes or None); may run on worker threads."""

CONFIG_FILE = "kiln.yaml"
MIRRORS_ENV = "KILN_MIRRORS"
CHUNK = 1 << 20
CHECKED_SUFFIX = ".checked"
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
    file = str(config)
    try:
        positioned = parse(config.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputError(f"YAML syntax: {exc.problem or exc}", Location(file, mark.line + 1 if mark else 0)) from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML syntax: {exc}", Location(file)) from None
    except DuplicateKey as exc:
        raise InputError(str(exc), Location(file, exc.line)) from None
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

    def __init__(self, directory: Path, label: str, progress: Progress | None) -> None:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".part-")
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
        progress: Progress | None = None,
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
        if not target.is_file():
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
                sink.path.chmod(0o444)  # builds get hardlinks to it: make in-place edits fail loudly
                os.replace(sink.path, target)
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
                    digest = _file_sha256(path)
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
            verdict = self._judge(path, unquote(_url_name(url)) or path.name)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(fd, "w") as handle:
                handle.write(verdict)
            os.replace(tmp, marker)
        if verdict.startswith("refused\n"):
            raise FetchError(f"{url}: {verdict.removeprefix('refused').strip()}", where)

    @staticmethod
    def _judge(path: Path, name: str) -> str:
        if not tarfile.is_tarfile(path):
            return "not a tar archive\n"
        try:
            check_archive(path, name)
        except FetchError as exc:
            return f"refused\n{exc.message}\n"
        return "ok\n"


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


def check_archive(path: Path, name: str | None = None) -> None:
    """Refuse a tar archive with a member that would be written or point outside the extraction root.

    Checks: absolute member names, `..` components, symlinks and hardlinks whose
    target resolves (through the archive's own symlinks) outside the root, and
    device nodes. Raises FetchError naming the first offending member (and the
    archive as `name`, when the file on disk is only a hash).
    """
    shown = name or path.name
    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise FetchError(f"cannot read archive {shown}: {exc}") from None

    def refuse(member: tarfile.TarInfo, why: str) -> FetchError:
        return FetchError(f"unsafe archive {shown}: member {member.name!r} {why}")

    symlinks: dict[str, str] = {}
    for member in members:
        parts = PurePosixPath(member.name).parts
        if member.name.startswith("/"):
            raise refuse(member, "has an absolute path")
        if ".." in parts:
            raise refuse(member, "has a '..' component")
        if member.ischr() or member.isblk():
            raise refuse(member, "is a device node")
        if member.issym():
            symlinks["/".join(p for p in parts if p != ".")] = member.linkname
    links = _Links(symlinks)
    for member in members:
        try:
            if member.issym():
                parent = [p for p in PurePosixPath(member.name).parent.parts if p != "."]
                links.resolve(parent, member.linkname)
            elif member.islnk():
                links.resolve([], member.linkname)  # hardlink targets are archive paths
        except _Escape as exc:
            kind = "symlink" if member.issym() else "hardlink"
            raise refuse(member, f"is a {kind} that {exc} (target {member.linkname!r})") from None


def place_source(fetched: Path, build_dir: Path, destination: str) -> Path:
    """Put a copy of a fetched file at build_dir/destination.

    A copy, not a hard link: steps run with CAP_DAC_OVERRIDE, so a step appending to a
    hard-linked source would corrupt the verified cache for every later build.
    """
    target = _target(build_dir, destination)
    shutil.copyfile(fetched, target)
    target.chmod(0o644)
    return target


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
    if origin.is_dir():
        shutil.copytree(origin, target, symlinks=True, ignore=_hidden_dirs, dirs_exist_ok=True)
    else:
        shutil.copy2(origin, target)
    return target


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
        current.mkdir(exist_ok=True)
    target = current / parts[-1]
    if not target.parent.resolve().is_relative_to(root):
        raise FetchError(f"destination {destination!r} leads out of the build directory")
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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


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
