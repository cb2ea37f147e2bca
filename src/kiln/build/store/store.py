"""The store: content-addressed package outputs, safe under concurrent kiln processes.

An entry is built in `tmp/` and published with one `rename(2)` into `store/<key>`, so
readers see either no entry or a complete one, never a partial one, even when a
builder is killed with SIGKILL. Coordination uses `flock(2)` only, because the kernel
drops those locks when a process dies: no stale lock can ever block a later build.
See docs/store.md for the layout and the guarantees.

Over 400 lines on purpose: the Store class is one lock protocol (publish, read, pin, gc, verify, remove),
whose methods share the invariants docs/store.md states; split, a method could drift from them.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.build.store.files import fsync_path, rmtree, write_durable
from kiln.build.store.locks import acquire, held_if_free, release
from kiln.build.store.manifest import MANIFEST, TreeScan, differences, manifest_bytes, read_manifest
from kiln.build.store.priority import lend_priority
from kiln.core.errors import BuildError, InputError, KilnError
from kiln.core.paths import cache_dir

META_SCHEMA = "kiln-store-meta-v1"
META = "meta.json"
LAST_USED = "last-used"
TREE = "tree"
BUILD_LOCK = ".build"  # `locks/<key>.build.lock`: no key has a dot, no staging name ends so

# Keys are path components: no dots, so `<key>.<pid>.<random>` staging names parse unambiguously.
KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
STAGING_RE = re.compile(r"(?P<key>[A-Za-z0-9_-]{1,128})\.(?P<pid>[0-9]+)\.(?P<random>[0-9a-f]{16})")


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
        build lock is held. Not reentrant: taking it twice in one thread deadlocks. A waiter lends
        the holder its CPU priority (store/priority.py), so a niced build never holds up a key
        that a build at a better priority waits for.
        """
        path = self._build_lock_path(check_key(key))
        fd = acquire(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            lend_priority(path)
            fd = acquire(path, fcntl.LOCK_EX)
        assert fd is not None
        try:
            yield
        finally:
            release(path, fd)

    @contextmanager
    def use(self, key: str) -> Iterator[Entry]:
        """Shared per-key lock while reading an entry's tree, so gc and remove leave it alone."""
        path = self._lock_path(check_key(key))
        fd = acquire(path, fcntl.LOCK_SH)
        assert fd is not None
        try:
            entry = self.entry(key)
            self.touch(key)
            yield entry
        finally:
            release(path, fd)

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
        with held_if_free(self._build_lock_path(key)) as free:
            if not free:
                yield False
                return
            with held_if_free(self._lock_path(key)) as free:
                yield free

    # writing

    def staging(self, key: str) -> Path:
        """A fresh staging dir `tmp/<key>.<pid>.<random>/` with an empty `tree/` to fill.

        Its lock (`locks/<staging name>.lock`) is taken before the dir exists and held by this
        Store until `commit` or `discard` (or process death), so gc never removes a live build.
        """
        check_key(key)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        staging, lock_path, fd = self._locked_tmp(key)
        try:
            staging.mkdir()
            (staging / TREE).mkdir()
        except BaseException:
            release(lock_path, fd)
            raise
        with self._mutex:
            self._held[staging] = (lock_path, fd)
        return staging

    def _locked_tmp(self, key: str) -> tuple[Path, Path, int]:
        """A unique name `tmp/<key>.<pid>.<random>` (not made yet), its lock path and the fd holding it.

        The lock comes first so that clean_tmp never takes the path for a dead build's leftover.
        """
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        name = f"{key}.{os.getpid()}.{secrets.token_hex(8)}"
        lock_path = self._lock_path(name)
        fd = acquire(lock_path, fcntl.LOCK_EX)
        assert fd is not None
        return self.tmp_dir / name, lock_path, fd

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
        fd = acquire(lock_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            raise KilnError(f"staging dir {staging} belongs to another running build")
        if not staging.is_dir():
            release(lock_path, fd)
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
                rmtree(staging)
        finally:
            release(*held)

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
            records = TreeScan(tree, normalize=True, source_date_epoch=source_date_epoch).run()
            if expect_manifest is not None and manifest_bytes(records) != expect_manifest:
                raise BuildError(f"entry {key}: the unpacked tree does not match its recorded manifest")
            size = sum(r.size for r in records if r.type == "file")
            count = sum(1 for r in records if r.type != "dir")
            write_durable(staging / MANIFEST, manifest_bytes(records))
            info = {"schema": META_SCHEMA, "key": key, "name": name, "size": size, "files": count, "meta": meta}
            write_durable(staging / META, (json.dumps(info, sort_keys=True, indent=1) + "\n").encode())
            (staging / LAST_USED).touch()
            fsync_path(staging, directory=True)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and self.has(key):
                    return self.entry(key)  # lost the race; the finally clause discards ours
                if exc.errno == errno.EXDEV:
                    raise KilnError(f"{self.tmp_dir} and {self.store_dir} must be on one filesystem") from exc
                raise
            fsync_path(self.store_dir, directory=True)
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
        fd = acquire(path, fcntl.LOCK_EX)
        assert fd is not None
        try:
            return self._evict(key)
        finally:
            release(path, fd)

    def _evict(self, key: str) -> bool:
        """Move `store/<key>` to a locked trash dir in tmp/ and delete it; False if it was gone."""
        trash, lock_path, fd = self._locked_tmp(key)
        try:
            try:
                os.rename(self.store_dir / key, trash)
            except FileNotFoundError:
                return False
            rmtree(trash)
            return True
        finally:
            release(lock_path, fd)

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
        actual = {r.path: r for r in TreeScan(entry.tree, normalize=False).run()}
        for path in sorted(expected.keys() | actual.keys()):
            want, got = expected.get(path), actual.get(path)
            if got is None:
                problems.append(f"{path}: missing")
            elif want is None:
                problems.append(f"{path}: unexpected {got.type}")
            elif want.type != got.type:
                problems.append(f"{path}: is a {got.type}, expected a {want.type}")
            else:
                problems.extend(f"{path}: {p}" for p in differences(want, got))
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
            with self.unless_staging_live(name) as free:
                if not free:
                    continue  # a live builder
                target = self.tmp_dir / name
                if target.exists() or target.is_symlink():
                    rmtree(target)
                    removed.append(name)
        return removed

    @contextmanager
    def unless_staging_live(self, name: str) -> Iterator[bool]:
        """True for the block if `name` is a staging dir's name and no live build holds its lock (which
        is held meanwhile, so no build can take that name); False otherwise."""
        if not STAGING_RE.fullmatch(name):
            yield False
            return
        with held_if_free(self._lock_path(name)) as free:
            yield free

    def clean_locks(self) -> int:
        """Remove key lock files nobody holds (a killed process cannot unlink its own); return how many."""
        if not self.locks_dir.is_dir():
            return 0
        removed = 0
        for path in sorted(self.locks_dir.glob("*.lock")):
            if not KEY_RE.fullmatch(path.stem.removesuffix(BUILD_LOCK)):
                continue  # a staging dir's lock: clean_tmp's
            fd = acquire(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is not None:
                release(path, fd)  # unlinks it: a waiter on the old file notices and starts over
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
