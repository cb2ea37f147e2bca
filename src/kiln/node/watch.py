"""`kiln node get --watch`: follow machines' resources until Ctrl-C, one thread per machine.

machined streams a watch as JSON lines (`GET /v1/resources?watch=1`): the state when the watch began
(`current` lines, then `synced`), then each change (`updated`, `destroyed`), and after at most 25 s a last
`expired` line, when the client asks again. A new watch starts with the whole state again, so `follow`
remembers each resource's version and passes on only what changed in between: a resource whose version
moved is `updated`, one that is no longer there at `synced` is `destroyed`. The printing is the caller's.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.node.client import NodeClient, NodeError

POLL = 0.25  # seconds the main thread waits for a change before it looks at Ctrl-C again


@dataclass(frozen=True)
class Change:
    """One change of one node's resources: `event` current, updated or destroyed."""

    node: str
    event: str
    resource: dict[str, Any]


Emit = Callable[[Change], None]


def follow(client: NodeClient, kind: str, ident: str, emit: Emit, stop: threading.Event) -> None:
    """Follow one node's resources, watch after watch, until `stop` is set; a NodeError ends it."""
    known: dict[tuple[str, str], dict[str, Any]] = {}
    first = True
    while not stop.is_set():
        seen: set[tuple[str, str]] = set()
        for line in client.watch(kind, ident):
            if stop.is_set():
                return
            _take(client.name, line, known, seen, emit, first=first)
        first = False


def _take(
    node: str,
    line: dict[str, Any],
    known: dict[tuple[str, str], dict[str, Any]],
    seen: set[tuple[str, str]],
    emit: Emit,
    *,
    first: bool,
) -> None:
    """One line of a watch: emit what changed since `known`, and remember it."""
    event, resource = line["event"], line.get("resource")
    if event == "synced":
        for key in sorted(set(known) - seen):  # gone while no watch was open
            emit(Change(node, "destroyed", known.pop(key)))
        return
    if not isinstance(resource, dict):
        return
    key = (str(resource.get("type")), str(resource.get("id")))
    if event == "destroyed":
        known.pop(key, None)
        emit(Change(node, "destroyed", resource))
        return
    if event == "current":
        seen.add(key)
        if not first and known.get(key, {}).get("version") == resource.get("version"):
            known[key] = resource
            return
        event = "current" if first else "updated"
    known[key] = resource
    emit(Change(node, event, resource))


def watch_nodes(clients: list[NodeClient], kind: str, ident: str, emit: Emit, fail: Callable[[str], None]) -> int:
    """Follow every node at once and emit their changes from this thread, until Ctrl-C (exit 0) or until
    every node failed (exit 1); a node that fails is `fail`ed and the others go on (exit 1 at Ctrl-C)."""
    changes: queue.Queue[Change | NodeError] = queue.Queue()
    stop = threading.Event()
    for client in clients:
        threading.Thread(target=_run, args=(client, kind, ident, changes, stop), daemon=True).start()
    failed = 0
    try:
        while failed < len(clients):
            try:
                item = changes.get(timeout=POLL)
            except queue.Empty:
                continue
            if isinstance(item, NodeError):
                failed += 1
                fail(str(item))
            else:
                emit(item)
    except KeyboardInterrupt:
        return 1 if failed else 0
    finally:
        stop.set()
    return 1


def _run(
    client: NodeClient, kind: str, ident: str, changes: queue.Queue[Change | NodeError], stop: threading.Event
) -> None:
    try:
        follow(client, kind, ident, changes.put, stop)
    except NodeError as exc:
        if not stop.is_set():
            changes.put(exc)
