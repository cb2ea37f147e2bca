"""The factory's state, apart from HTTP: which schematics it keeps, what it builds, who waits, what it refuses.

A request's answer is either what it asked for or a Refusal (an HTTP status, a message, and
headers such as Retry-After), raised here and turned into JSON by the handler (kiln.factory.service).
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kiln.core.errors import KilnError
from kiln.factory.builds import Builds, Job, QueueFull, Target
from kiln.factory.catalog import Catalog
from kiln.factory.guard import Registries, secrets_in
from kiln.factory.server import retry_after
from kiln.image import schematic as schematics

RETRY_AFTER = 30  # seconds a client is asked to wait when the queue is full


class Refusal(Exception):
    """An HTTP error answer: status and message (and headers)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class Factory:
    """The service's state: catalogue, builds, the write token, and what it refuses."""

    def __init__(
        self,
        catalog: Catalog,
        builds: Builds,
        token: str,
        *,
        registries: Registries | None = None,
        waiting: int = 32,
    ) -> None:
        self.catalog, self.builds, self.token = catalog, builds, token
        self.registries = registries or Registries()
        self.waiting = waiting  # requests that may wait for a build at once
        self._waiters = threading.BoundedSemaphore(waiting) if waiting > 0 else None
        self._secret_free: set[str] = set()  # stored schematics checked and found clean

    def schematic_path(self, schematic_id: str) -> Path:
        return self.builds.root / "schematics" / f"{schematic_id}.json"

    def post_schematic(self, body: bytes) -> str:
        try:
            parsed = schematics.parse(body.decode("utf-8"), "schematic")
        except UnicodeDecodeError:
            raise Refusal(400, "schematic: not UTF-8 text") from None
        except KilnError as exc:
            raise Refusal(400, str(exc)) from None
        unknown = self.catalog.unknown_extensions(parsed)
        if unknown:
            known = ", ".join(self.catalog.extensions) or "none"
            raise Refusal(400, f"schematic: extensions: unknown {', '.join(unknown)} (this factory has {known})")
        found = secrets_in(parsed.fields)
        if found:
            raise Refusal(400, _secrets_message(found))
        refused = self.registries.refusals(parsed.extensions)
        if refused:
            raise Refusal(400, f"schematic: extensions: refused registry: {'; '.join(refused)}")
        path = self.schematic_path(parsed.id)
        if not path.exists():  # written aside and renamed: a reader sees all of it or nothing
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".tmp", delete=False) as tmp:
                tmp.write(parsed.canonical)
            Path(tmp.name).rename(path)
        return parsed.id

    def stored(self, schematic_id: str, hint: str = "") -> Path:
        """A kept schematic's file; one holding a secret (kept before they were refused) is not there."""
        path = self.schematic_path(schematic_id)
        if not path.is_file():
            raise Refusal(404, f"no schematic {schematic_id}{hint}")
        if schematic_id not in self._secret_free:
            if secrets_in(json.loads(path.read_bytes())):
                raise Refusal(404, f"schematic {schematic_id} holds a secret: it is neither served nor built")
            self._secret_free.add(schematic_id)
        return path

    def target(self, match: re.Match[str]) -> Target:
        found = match.groupdict()
        self.stored(found["id"], ": POST it to /schematics first")
        if found["version"] != self.catalog.version:
            raise Refusal(404, f"this factory serves version {self.catalog.version}, not {found['version']}")
        if found["profile"] not in self.catalog.offers:
            raise Refusal(
                400, f"unknown profile {found['profile']!r} (this factory has {', '.join(self.catalog.offers)})"
            )
        return Target(found["id"], found["version"], found["profile"])

    def built(self, target: Target) -> Job:
        """The finished job for `target` (building it first, waiting for it), or a Refusal saying why not."""
        job = self.job(target)
        if not job.finished.is_set():
            with self.waiting_for(job):
                job.wait()
        if job.state == "failed":
            raise Refusal(
                500,
                f"the build failed: {job.error}",
                log=f"/logs/{target.label}",
                retry_after=retry_after(job.retry_after),
            )
        return job

    def job(self, target: Target) -> Job:
        try:
            return self.builds.request(target)
        except QueueFull as exc:
            raise Refusal(429, f"build queue full: {exc}", retry_after=RETRY_AFTER) from None

    @contextmanager
    def waiting_for(self, job: Job) -> Iterator[None]:
        """A place among the requests waiting for builds, or a 429: each holds a connection and a thread."""
        if self._waiters is None or not self._waiters.acquire(blocking=False):
            raise Refusal(429, f"{self.waiting} requests are waiting for builds already", retry_after=RETRY_AFTER)
        try:
            yield
        finally:
            self._waiters.release()


def _secrets_message(found: list[str]) -> str:
    where = "; ".join(found)
    return (
        f"schematic: {where}: a schematic is public (GET /schematics/<id> and every image made from it carry it), "
        "so it may not hold secrets; give machines their keys another way (a config drive, kiln.config=https://..., "
        "the platform's user data)"
    )
