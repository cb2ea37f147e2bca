"""The store: content-addressed package outputs, safe under concurrent kiln processes.

An entry is built in `tmp/` and published with one `rename(2)` into `store/<key>`, so
readers see either no entry or a complete one, never a partial one, even when a
builder is killed with SIGKILL. Coordination uses `flock(2)` only, because the kernel
drops those locks when a process dies: no stale lock can ever block a later build.
See docs/store.md for the layout and the guarantees.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kiln.core.errors import BuildError, InputError, KilnError
from kiln.core.hashing import file_sha256
from kiln.core.paths import cache_dir

MANIFEST_SCHEMA = "kiln-store-manifest-v1"
META_SCHEMA = "kiln-store-meta-v1"
MANIFEST = "manifest.json"
META = "meta.json"
LAST_USED = "last-used"
TREE = "tree"
CHUNK = 1 << 20
BUILD_LOCK = ".build"  # `locks/<key>.build.lock`: no key has a dot, no staging name ends so

# Keys are path components: no dots, so `<key>.<pid>.<random>` staging names parse unambiguously.
KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
STAGING_RE = re.compile(r"(?P<key>[A-Za-z0-9_-]{1,128})\.(?P<pid>[0-9]+)\.(?P<random>[0-9a-f]{16})")


@dataclass(frozen=True)
class FileRecord:
    """One path of an entry's tree as the manifest records it (size and sha256 for files only)."""

    path: str
    type: str  # "file" | "dir" | "symlink"
    mode: int
    size: int
    sha256: str | None
    target: str | None


@dataclass
class Entry:
    """A published store entry; size is the sum of its regular files' sizes."""

    key: str
    name: str
    path: Path
    size: int
    files: int
    meta: dict[str, Any]
    last_used: float = field(default=0.0)

    @property
    def tree(self) -> Path:
        """The package output, as finalize copied it out of the build root."""
        return self.path / TREE


def check_key(key: str) -> str:
    """Reject keys that are not a plain path component, so no key can escape the store."""
    if not KEY_RE.fullmatch(key):
        raise InputError(f"invalid store key {key!r}: expected 1-128 characters of [A-Za-z0-9_-]")
    return key


# --- locks -------------------------------------------------------------------------------------------------------


def _acquire(path: Path, flags: int) -> int | None:
    """flock `path` and return the fd, or None if LOCK_NB and it is held elsewhere.

    Lock files are unlinked when released, so after locking we check that the file we
    hold is still the one at `path`; if a releaser unlinked it meanwhile, start over.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            on_disk = os.stat(path)
            held = os.fstat(fd)
            if (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _release(path: Path, fd: int) -> None:
    """Unlink the lock file if nobody else holds or waits on it, then drop the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # a shared holder remains; the last one out removes the file
    else:
        with suppress(FileNotFoundError):
            os.unlink(path)
    os.close(fd)


def _rmtree(path: Path) -> None:
    """Remove a tree even if a build left read-only directories in it."""

    seen: set[str] = set()

    def retry(_func: Callable[..., Any], target: str, exc: tuple[type[BaseException], BaseException, Any]) -> None:
        if not os.path.lexists(target):
            return  # removed by an earlier retry
        if target in seen:
            raise exc[1]
        seen.add(target)
        parent = os.path.dirname(target)
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, stat.S_IMODE(os.lstat(target).st_mode) | stat.S_IRWXU)
            shutil.rmtree(target, onerror=retry)
        else:
            os.unlink(target)

    shutil.rmtree(path, onerror=retry)


def _fsync(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


# --- tree scanning -----------------------------------------------------------------------------------------------


class _Scan:
    """Walk a tree into sorted FileRecords; when normalizing, clamp mtimes and chown to root.

    Hard links hash once per inode. Special files are errors when normalizing (an output
    must be plain files, dirs and symlinks) and "special" records when verifying.
    """

    def __init__(self, top: Path, *, normalize: bool, source_date_epoch: int = 0) -> None:
        self.top = top
        self.normalize = normalize
        self.limit_ns = source_date_epoch * 1_000_000_000
        self.chown = normalize and os.geteuid() == 0
        self.records: list[FileRecord] = []
        self.hashes: dict[tuple[int, int], str] = {}
        self.buffer = bytearray(CHUNK)

    def run(self) -> list[FileRecord]:
        self._walk(str(self.top), "")
        if self.normalize:
            self._fix(str(self.top), os.lstat(self.top))
        self.records.sort(key=lambda r: r.path)
        return self.records

    def _walk(self, directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            rel = prefix + child.name
            info = child.stat(follow_symlinks=False)
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                self._walk(child.path, rel + "/")
                self.records.append(FileRecord(rel, "dir", stat.S_IMODE(mode), 0, None, None))
            elif stat.S_ISREG(mode):
                inode = (info.st_dev, info.st_ino)
                digest = self.hashes.get(inode) if info.st_nlink > 1 else None
                if digest is None:
                    try:
                        digest = file_sha256(child.path, buffer=self.buffer)
                    except OSError as exc:
                        raise BuildError(f"cannot read {child.path}: {exc.strerror}") from exc
                    if info.st_nlink > 1:
                        self.hashes[inode] = digest
                self.records.append(FileRecord(rel, "file", stat.S_IMODE(mode), info.st_size, digest, None))
            elif stat.S_ISLNK(mode):
                self.records.append(FileRecord(rel, "symlink", stat.S_IMODE(mode), 0, None, os.readlink(child.path)))
            elif self.normalize:
                kind = _special_kind(mode)
                raise BuildError(f"package output contains a {kind}, which the store refuses: {child.path}")
            else:
                self.records.append(FileRecord(rel, "special", stat.S_IMODE(mode), 0, None, None))
                continue
            if self.normalize:
                self._fix(child.path, info)

    def _fix(self, path: str, info: os.stat_result) -> None:
        """Make ownership and times independent of who built it and when."""
        if self.chown and (info.st_uid, info.st_gid) != (0, 0):
            os.lchown(path, 0, 0)
            # chown(2) clears setuid/setgid bits even for root; put the recorded mode back.
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(info.st_mode))
        if info.st_mtime_ns > self.limit_ns:
            os.utime(path, ns=(self.limit_ns, self.limit_ns), follow_symlinks=False)


def _special_kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def manifest_bytes(records: list[FileRecord]) -> bytes:
    """Canonical manifest text: same tree, same bytes, whatever the key or the store."""
    files = [asdict(r) for r in records]
    text = json.dumps({"schema": MANIFEST_SCHEMA, "files": files}, sort_keys=True, indent=1)
    return (text + "\n").encode()


def read_manifest(path: Path) -> list[FileRecord]:
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"not a {MANIFEST_SCHEMA} document")
    return [FileRecord(**item) for item in data["files"]]


# --- the store ---------------------------------------------------------------------------------------------------


class Store:
    """Content-addressed package outputs under `root/store/<key>` (root defaults to the cache dir)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else cache_dir()
        self.store_dir = self.root / "store"
        self.tmp_dir = self.root / "tmp"
        self.locks_dir = self.root / "locks"
        self._held: dict[Path, tuple[Path, int]] = {}  # staging dir -> (its lock file, fd)
        self._mutex = threading.Lock()

    # reading

    def has(self, key: str) -> bool:
        """True once an entry is published; an entry is complete by construction."""
        return (self.store_dir / check_key(key) / META).is_file()

    def entry(self, key: str) -> Entry:
        path = self.store_dir / check_key(key)
        if not (path / META).is_file():
            raise InputError(f"no store entry {key}")
        return self._load(path)

    def tree(self, key: str) -> Path:
        return self.entry(key).tree

    def entries(self) -> list[Entry]:
        """Every published entry, sorted by name then key; unreadable metadata shows as name '?'."""
        if not self.store_dir.is_dir():
            return []
        found = [self._load(p) for p in self.store_dir.iterdir() if KEY_RE.fullmatch(p.name) and (p / META).exists()]
        return sorted(found, key=lambda e: (e.name, e.key))

    def resolve(self, prefix: str) -> str:
        """The one key starting with `prefix`, so users can type short keys on the command line."""
        if KEY_RE.fullmatch(prefix) and self.has(prefix):
            return prefix
        keys = sorted(e.key for e in self.entries())
        matches = [k for k in keys if k.startswith(prefix)] if prefix else []
        if len(matches) != 1:
            problem = "is ambiguous" if matches else "matches no store entry"
            raise InputError(f"key {prefix!r} {problem}")
        return matches[0]

    def _load(self, path: Path) -> Entry:
        try:
            last_used = (path / LAST_USED).stat().st_mtime
        except FileNotFoundError:
            last_used = (path / META).stat().st_mtime
        try:
            meta = json.loads((path / META).read_bytes())
            return Entry(
                path.name,
                str(meta["name"]),
                path,
                int(meta["size"]),
                int(meta["files"]),
                dict(meta.get("meta", {})),
                last_used,
            )
        except (ValueError, KeyError, TypeError, OSError) as exc:
            return Entry(path.name, "?", path, 0, 0, {"error": f"unreadable {META}: {exc}"}, last_used)

    def touch(self, key: str) -> None:
        """Record a use now, for gc's least-recently-used order."""
        path = self.entry(key).path / LAST_USED
        path.touch()
        os.utime(path)

    # locking

    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-key build lock: one process builds a key at a time; waits; dies with its holder.

        A lock file of its own (`<key>.build.lock`), apart from the key lock readers share
        (`use`, `Pins`): waiting to build a key never waits for the runs that pin it, so two
        runs pinning each other's outputs cannot deadlock. gc and remove skip a key whose
        build lock is held. Not reentrant: taking it twice in one thread deadlocks.
        """
        path = self._build_lock_path(check_key(key))
        fd = _acquire(path, fcntl.LOCK_EX)
        assert fd is not None
        try:
            yield
        finally:
            _release(path, fd)

    @contextmanager
    def use(self, key: str) -> Iterator[Entry]:
        """Shared per-key lock while reading an entry's tree, so gc and remove leave it alone."""
        path = self._lock_path(check_key(key))
        fd = _acquire(path, fcntl.LOCK_SH)
        assert fd is not None
        try:
            entry = self.entry(key)
            self.touch(key)
            yield entry
        finally:
            _release(path, fd)

    def _lock_path(self, name: str) -> Path:
        self.locks_dir.mkdir(parents=True, exist_ok=True)
        return self.locks_dir / f"{name}.lock"

    def _build_lock_path(self, key: str) -> Path:
        return self._lock_path(f"{key}{BUILD_LOCK}")

    @contextmanager
    def _unless_busy(self, key: str) -> Iterator[bool]:
        """Hold a key's build lock and its key lock exclusively for the block, or yield False if either is held.

        Neither is waited for: what gc and `remove` must leave alone is exactly what someone holds.
        """
        build_path = self._build_lock_path(key)
        build_fd = _acquire(build_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if build_fd is None:
            yield False
            return
        try:
            path = self._lock_path(key)
            fd = _acquire(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                yield False
                return
            try:
                yield True
            finally:
                _release(path, fd)
        finally:
            _release(build_path, build_fd)

    # writing

    def staging(self, key: str) -> Path:
        """A fresh staging dir `tmp/<key>.<pid>.<random>/` with an empty `tree/` to fill.

        Its lock (`locks/<staging name>.lock`) is taken before the dir exists and held by this
        Store until `commit` or `discard` (or process death), so gc never removes a live build.
        """
        check_key(key)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        name = f"{key}.{os.getpid()}.{secrets.token_hex(8)}"
        lock_path = self._lock_path(name)
        fd = _acquire(lock_path, fcntl.LOCK_EX)
        assert fd is not None
        staging = self.tmp_dir / name
        try:
            staging.mkdir()
            (staging / TREE).mkdir()
        except BaseException:
            _release(lock_path, fd)
            raise
        with self._mutex:
            self._held[staging] = (lock_path, fd)
        return staging

    @contextmanager
    def fresh_staging(self, key: str) -> Iterator[Path]:
        """A new staging dir for a block, discarded on every way out (error, failure, cancel) unless committed."""
        staging = self.staging(key)
        try:
            yield staging
        finally:
            self.discard(staging)

    @contextmanager
    def hold_staging_lock(self, staging: Path) -> Iterator[Path]:
        """Own a staging dir for a block: its lock stays held, and it is discarded on exit unless committed.

        Takes the lock (without waiting) if this Store does not hold it yet, for example when
        another Store object made the dir; fails if a live process holds it.
        """
        self._adopt(staging)
        try:
            yield staging
        finally:
            self.discard(staging)

    def _adopt(self, staging: Path) -> None:
        with self._mutex:
            if staging in self._held:
                return
        if staging.parent != self.tmp_dir or not STAGING_RE.fullmatch(staging.name):
            raise KilnError(f"{staging} is not a staging dir of this store (use Store.staging)")
        lock_path = self._lock_path(staging.name)
        fd = _acquire(lock_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            raise KilnError(f"staging dir {staging} belongs to another running build")
        if not staging.is_dir():
            _release(lock_path, fd)
            raise KilnError(f"staging dir {staging} no longer exists")
        with self._mutex:
            self._held[staging] = (lock_path, fd)

    def discard(self, staging: Path) -> None:
        """Delete an uncommitted staging dir and release its lock; no-op once committed."""
        with self._mutex:
            held = self._held.pop(staging, None)
        if held is None:
            return
        try:
            if staging.exists():
                _rmtree(staging)
        finally:
            _release(*held)

    def commit(
        self,
        key: str,
        staging: Path,
        name: str,
        meta: dict[str, Any],
        source_date_epoch: int,
        expect_manifest: bytes | None = None,
    ) -> Entry:
        """Normalize `staging/tree`, record its manifest and publish it as `store/<key>` atomically.

        Consumes `staging` whatever happens. If another process published the key first, its
        entry wins and is returned: equal keys mean interchangeable outputs. With
        `expect_manifest` (an entry pulled from a remote cache), a tree whose manifest differs
        from it is refused and never published.
        """
        check_key(key)
        self._adopt(staging)
        final = self.store_dir / key
        try:
            if self.has(key):
                return self.entry(key)
            tree = staging / TREE
            if not tree.is_dir() or tree.is_symlink():
                raise BuildError(f"staging dir {staging} has no {TREE}/ directory")
            extra = sorted(p.name for p in staging.iterdir() if p.name != TREE)
            if extra:
                raise BuildError(f"staging dir {staging} holds more than {TREE}/: {', '.join(extra)}")
            records = _Scan(tree, normalize=True, source_date_epoch=source_date_epoch).run()
            if expect_manifest is not None and manifest_bytes(records) != expect_manifest:
                raise BuildError(f"entry {key}: the unpacked tree does not match its recorded manifest")
            size = sum(r.size for r in records if r.type == "file")
            count = sum(1 for r in records if r.type != "dir")
            _write_durable(staging / MANIFEST, manifest_bytes(records))
            info = {"schema": META_SCHEMA, "key": key, "name": name, "size": size, "files": count, "meta": meta}
            _write_durable(staging / META, (json.dumps(info, sort_keys=True, indent=1) + "\n").encode())
            (staging / LAST_USED).touch()
            _fsync(staging, directory=True)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and self.has(key):
                    return self.entry(key)  # lost the race; the finally clause discards ours
                if exc.errno == errno.EXDEV:
                    raise KilnError(f"{self.tmp_dir} and {self.store_dir} must be on one filesystem") from exc
                raise
            _fsync(self.store_dir, directory=True)
            return self.entry(key)
        finally:
            self.discard(staging)  # after a successful rename there is nothing left to delete

    def remove(self, key: str) -> None:
        """Delete an entry: renamed out of `store/` first, so readers never see half of it."""
        if not self.has(key):
            raise InputError(f"no store entry {key}")
        with self._unless_busy(key) as free:
            if not free:
                raise KilnError(f"store entry {key} is in use by a running kiln process")
            if not self._evict(key):
                raise InputError(f"no store entry {key}")

    def remove_locked(self, key: str) -> bool:
        """Delete an entry while the caller holds `lock(key)` (a --no-cache rebuild replaces it).

        Waits for its readers (mounts, other runs' pins) to let go: they rely on the old tree.
        """
        path = self._lock_path(key)
        fd = _acquire(path, fcntl.LOCK_EX)
        assert fd is not None
        try:
            return self._evict(key)
        finally:
            _release(path, fd)

    def _evict(self, key: str) -> bool:
        """Move `store/<key>` to a locked trash dir in tmp/ and delete it; False if it was gone."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        name = f"{key}.{os.getpid()}.{secrets.token_hex(8)}"
        lock_path = self._lock_path(name)
        fd = _acquire(lock_path, fcntl.LOCK_EX)
        assert fd is not None
        trash = self.tmp_dir / name
        try:
            try:
                os.rename(self.store_dir / key, trash)
            except FileNotFoundError:
                return False
            _rmtree(trash)
            return True
        finally:
            _release(lock_path, fd)

    # checking and collecting

    def verify(self, key: str) -> list[str]:
        """What differs between an entry's tree and its manifest; empty when intact."""
        entry = self.entry(key)
        try:
            expected = {r.path: r for r in read_manifest(entry.path / MANIFEST)}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"{MANIFEST}: unreadable: {exc}"]
        problems: list[str] = []
        if "error" in entry.meta and entry.name == "?":
            problems.append(f"{META}: {entry.meta['error']}")
        if not entry.tree.is_dir():
            return [*problems, f"{TREE}/: missing"]
        actual = {r.path: r for r in _Scan(entry.tree, normalize=False).run()}
        for path in sorted(expected.keys() | actual.keys()):
            want, got = expected.get(path), actual.get(path)
            if got is None:
                problems.append(f"{path}: missing")
            elif want is None:
                problems.append(f"{path}: unexpected {got.type}")
            elif want.type != got.type:
                problems.append(f"{path}: is a {got.type}, expected a {want.type}")
            else:
                problems.extend(f"{path}: {p}" for p in _differences(want, got))
        return problems

    def clean_tmp(self) -> list[str]:
        """Remove staging and trash dirs whose lock nobody holds (their builder died); return their names."""
        names: set[str] = set()
        if self.tmp_dir.is_dir():
            names.update(p.name for p in self.tmp_dir.iterdir() if STAGING_RE.fullmatch(p.name))
        if self.locks_dir.is_dir():
            names.update(p.stem for p in self.locks_dir.glob("*.lock") if STAGING_RE.fullmatch(p.stem))
        removed: list[str] = []
        for name in sorted(names):
            lock_path = self._lock_path(name)
            fd = _acquire(lock_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                continue  # a live builder
            try:
                target = self.tmp_dir / name
                if target.exists() or target.is_symlink():
                    _rmtree(target)
                    removed.append(name)
            finally:
                _release(lock_path, fd)
        return removed

    def clean_locks(self) -> int:
        """Remove key lock files nobody holds (a killed process cannot unlink its own); return how many."""
        if not self.locks_dir.is_dir():
            return 0
        removed = 0
        for path in sorted(self.locks_dir.glob("*.lock")):
            if not KEY_RE.fullmatch(path.stem.removesuffix(BUILD_LOCK)):
                continue  # a staging dir's lock: clean_tmp's
            fd = _acquire(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is not None:
                _release(path, fd)  # unlinks it: a waiter on the old file notices and starts over
                removed += 1
        return removed

    def gc(self, max_size: int | None, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Remove dead builders' staging dirs and unheld lock files, then evict least-recently-used entries.

        Entries in `keep` and entries in use are never evicted, so the result may stay above
        max_size: an entry is in use while anyone holds its key lock (a build mounting it, a
        run's `Pins`, a build of it), which gc tests without waiting. Returns the evicted keys,
        oldest first.
        """
        self.clean_tmp()
        self.clean_locks()
        if max_size is None:
            return []
        candidates = sorted(self.entries(), key=lambda e: (e.last_used, e.key))
        total = sum(e.size for e in candidates)
        removed: list[str] = []
        for entry in candidates:
            if total <= max_size:
                break
            if entry.key in keep:
                continue
            with self._unless_busy(entry.key) as free:
                if free and self._evict(entry.key):
                    removed.append(entry.key)
                    total -= entry.size
        return removed


class Pins:
    """Shared key locks a run holds on the entries it relies on, until `release`.

    A dependency judged cached must still be there when its dependent mounts it, and an
    output must outlive the run that exports it: gc and remove take a key's lock without
    waiting and skip held ones, so a pinned entry is never evicted. A pin is taken, then
    the entry checked again under it, so an entry evicted just before counts as missing.
    Never take `Store.lock` on a key this process pins: flock would deadlock on itself.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._held: dict[str, tuple[Path, int]] = {}
        self._mutex = threading.Lock()
        # Released at interpreter exit too, so a verb that never closes its session leaves no lock files.
        self._finalizer = weakref.finalize(self, _release_all, self._held, self._mutex)

    def __enter__(self) -> Pins:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __contains__(self, key: str) -> bool:
        with self._mutex:
            return key in self._held

    def pin(self, key: str, *, wait: bool = True) -> bool:
        """Pin `key` if it is published; False if it is not (or, without `wait`, if its lock is busy)."""
        if key in self:
            return True
        if not self.store.has(key):
            return False  # nothing to pin: no lock file is made for it
        path = self.store._lock_path(key)
        fd = _acquire(path, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
        if fd is None:
            return False
        try:
            present = self.store.has(key)  # evicted between the check and the lock?
        except BaseException:
            _release(path, fd)
            raise
        with self._mutex:
            if present and key not in self._held:
                self._held[key] = (path, fd)
                return True
        _release(path, fd)
        return present

    def unpin(self, key: str) -> None:
        """Drop one pin (before this process rebuilds the key under its exclusive lock)."""
        with self._mutex:
            held = self._held.pop(key, None)
        if held is not None:
            _release(*held)

    def release(self) -> None:
        """Drop every pin; gc may evict those entries again."""
        _release_all(self._held, self._mutex)


def _release_all(held: dict[str, tuple[Path, int]], mutex: threading.Lock) -> None:
    with mutex:
        locks = list(held.values())
        held.clear()
    for path, fd in locks:
        _release(path, fd)


def _differences(want: FileRecord, got: FileRecord) -> list[str]:
    out: list[str] = []
    if want.type != "symlink" and want.mode != got.mode:
        out.append(f"mode {got.mode:04o}, expected {want.mode:04o}")
    if want.type == "file":
        if want.size != got.size:
            out.append(f"size {got.size}, expected {want.size}")
        if want.sha256 != got.sha256:
            out.append(f"sha256 {got.sha256}, expected {want.sha256}")
    if want.type == "symlink" and want.target != got.target:
        out.append(f"symlink to {got.target!r}, expected {want.target!r}")
    return out
