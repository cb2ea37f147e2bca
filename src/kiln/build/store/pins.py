"""Pins: a run's shared hold on every entry it judged cached or built, so gc and rm leave them alone."""

from __future__ import annotations

import fcntl
import threading
import weakref
from pathlib import Path

from kiln.build.store.locks import acquire, release
from kiln.build.store.store import Store


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
        fd = acquire(path, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
        if fd is None:
            return False
        try:
            present = self.store.has(key)  # evicted between the check and the lock?
        except BaseException:
            release(path, fd)
            raise
        with self._mutex:
            if present and key not in self._held:
                self._held[key] = (path, fd)
                return True
        release(path, fd)
        return present

    def unpin(self, key: str) -> None:
        """Drop one pin (before this process rebuilds the key under its exclusive lock)."""
        with self._mutex:
            held = self._held.pop(key, None)
        if held is not None:
            release(*held)

    def release(self) -> None:
        """Drop every pin; gc may evict those entries again."""
        _release_all(self._held, self._mutex)


def _release_all(held: dict[str, tuple[Path, int]], mutex: threading.Lock) -> None:
    with mutex:
        locks = list(held.values())
        held.clear()
    for path, fd in locks:
        release(path, fd)
