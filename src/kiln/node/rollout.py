"""Rolling upgrades and rollbacks: one node at a time, in the order given, stopping at the first failure.

No network here: a rollout drives anything shaped like `Node` (the real `NodeClient`, or a stub in the
tests) and waits with an injectable `Clock`, so the order, the stop, the rollback detection and the
deadlines are tested in milliseconds without a machine.

One node's upgrade:

1. its status: the version it runs and its uptime;
2. POST /v1/upgrade; a refusal (400, 409) fails the node, which was not changed;
3. its status every `poll` seconds while it pulls and installs (reported as progress); the state
   "failed" fails the node, which keeps running its old version;
4. the reboot: the API stops answering (expected, not an error) and answers again from a new boot,
   known by its uptime starting over, or by answering with no upgrade under way after it went away;
5. the new boot must not be rolled back (GRUB gave up on the new slot and booted the old one: "rolled
   back to V"), must run its slot as the default, and must run the target version.

A node that is not through all of it within `timeout` seconds fails. The rollout stops at the first
failed node; the nodes after it are "not started", so at most one node is ever in doubt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kiln.core.errors import printable
from kiln.node.client import NodeError, NodeUnreachable, UpgradeRequest

ACTIVE = frozenset({"pulling", "installing", "rebooting"})
STATUS_TIMEOUT = 5.0  # one status request while waiting; a rebooting machine may swallow packets


class Node(Protocol):
    """What a rollout needs of a machine (NodeClient is one); errors are NodeError, NodeUnreachable when silent."""

    @property
    def name(self) -> str: ...

    def status(self, *, timeout: float | None = None) -> dict[str, Any]: ...

    def upgrade(self, request: Mapping[str, Any]) -> dict[str, Any]: ...

    def rollback(self) -> dict[str, Any]: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class Progress:
    """Where one node stands now: a state (pulling, installing, rebooting, waiting...) and its numbers."""

    node: str
    state: str
    detail: str = ""
    pulled_bytes: int | None = None
    total_bytes: int | None = None


Reporter = Callable[[Progress], None]


def _quiet(_: Progress) -> None:
    return None


@dataclass(frozen=True)
class NodeResult:
    """One node's end: `upgraded` or `rolled back` (done), `failed` with a reason, or `not started`."""

    node: str
    outcome: str
    version: str = ""
    slot: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.outcome not in ("failed", "not started")

    def line(self) -> str:
        if self.outcome == "failed":
            return f"{self.node}: failed ({self.reason})"
        if self.outcome == "not started":
            return f"{self.node}: not started"
        where = ", ".join(part for part in (f"slot {self.slot}" if self.slot else "", self.version) if part)
        return f"{self.node}: {self.outcome}" + (f" ({where})" if where else "")

    def as_json(self) -> dict[str, str]:
        return {"node": self.node, "outcome": self.outcome, "version": self.version, "slot": self.slot} | (
            {"reason": self.reason} if self.reason else {}
        )


@dataclass(frozen=True)
class Rollout:
    """Every node's result, in rollout order."""

    action: str
    results: tuple[NodeResult, ...]

    @property
    def ok(self) -> bool:
        return all(result.done for result in self.results)

    @property
    def failed(self) -> NodeResult | None:
        return next((result for result in self.results if result.outcome == "failed"), None)

    def lines(self) -> list[str]:
        return [result.line() for result in self.results]

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "ok": self.ok, "nodes": [result.as_json() for result in self.results]}


class _Failed(Exception):
    """This node failed; the reason is the message."""


def rolling_upgrade(
    nodes: Sequence[Node],
    request: UpgradeRequest,
    *,
    timeout: float,
    poll: float = 1.0,
    clock: Clock | None = None,
    report: Reporter = _quiet,
) -> Rollout:
    """Upgrade `nodes` one at a time in order; stop at the first that fails (module docstring)."""

    def one(node: Node, deadline: _Deadline) -> NodeResult:
        version, slot = _UpgradeWatch(node, request, deadline, report).run()
        return NodeResult(node.name, "upgraded", version, slot)

    return Rollout("upgrade", _roll(nodes, one, timeout, poll, clock or SystemClock()))


def rolling_rollback(
    nodes: Sequence[Node], *, timeout: float, poll: float = 1.0, clock: Clock | None = None, report: Reporter = _quiet
) -> Rollout:
    """Roll `nodes` back one at a time: each must answer again from the slot its rollback named."""

    def one(node: Node, deadline: _Deadline) -> NodeResult:
        answer = _call(lambda: node.rollback())
        slot = printable(str(answer.get("slot") or ""))
        if not slot:
            raise _Failed("the rollback answer names no slot")
        report(Progress(node.name, "rebooting", f"into slot {slot}"))
        while True:
            status = deadline.wait_for_status(node, f"not back on slot {slot}")
            boot = _mapping(status.get("boot"))
            if boot.get("slot") == slot:
                report(Progress(node.name, "rolled back", f"slot {slot}"))
                return NodeResult(node.name, "rolled back", _text(status.get("version")), slot)

    return Rollout("rollback", _roll(nodes, one, timeout, poll, clock or SystemClock()))


def _roll(
    nodes: Sequence[Node], one: Callable[[Node, _Deadline], NodeResult], timeout: float, poll: float, clock: Clock
) -> tuple[NodeResult, ...]:
    results: list[NodeResult] = []
    for index, node in enumerate(nodes):
        try:
            results.append(one(node, _Deadline(clock, timeout, poll)))
        except _Failed as exc:
            results.append(NodeResult(node.name, "failed", reason=str(exc)))
            results += [NodeResult(rest.name, "not started") for rest in nodes[index + 1 :]]
            break
    return tuple(results)


@dataclass
class _Deadline:
    """One node's time budget and the pace of its status polls."""

    clock: Clock
    timeout: float
    poll: float
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = self.clock.monotonic() + self.timeout

    def status(self, node: Node, waiting_for: str, last: str = "") -> dict[str, Any] | None:
        """After one poll interval: the node's status, or None while it does not answer."""
        self.clock.sleep(self.poll)
        remaining = self.end - self.clock.monotonic()
        if remaining <= 0:
            raise _Failed(f"{waiting_for} within {self.timeout:g} s" + (f" (last: {last})" if last else ""))
        try:
            return node.status(timeout=min(STATUS_TIMEOUT, remaining))
        except NodeUnreachable:
            return None
        except NodeError as exc:
            raise _Failed(exc.reason) from None

    def wait_for_status(self, node: Node, waiting_for: str) -> dict[str, Any]:
        while True:
            status = self.status(node, waiting_for)
            if status is not None:
                return status


class _UpgradeWatch:
    """One node's upgrade, from the request to the check of its new boot (steps 1 to 5 above)."""

    def __init__(self, node: Node, request: UpgradeRequest, deadline: _Deadline, report: Reporter) -> None:
        self.node, self.request, self.deadline, self.report = node, request, deadline, report
        self.uptime: float | None = None
        self.went_away = False
        self.back = False  # an answer from the new boot was seen: later ones come from it too
        self.target = ""
        self.last = "requested"

    def run(self) -> tuple[str, str]:
        before = _call(lambda: self.node.status(timeout=STATUS_TIMEOUT))
        self.uptime = _number(before.get("uptime_seconds"))
        old = _text(before.get("version"))
        self.note(_call(lambda: self.node.upgrade(self.request.body())))
        self.report(Progress(self.node.name, self.last, f"from {old or '?'}"))
        while True:
            status = self.deadline.status(self.node, "not upgraded", self.last)
            if status is None:
                self.went_away = True
                self.last = "rebooting"
                self.report(Progress(self.node.name, "rebooting", "(not answering, as expected)"))
                continue
            if self.rebooted(status):
                done = self.check(status)
                if done is not None:
                    return done
            else:
                self.progress(status, old)

    def note(self, upgrade: dict[str, Any]) -> None:
        """Remember the target version and the state of an upgrade object."""
        version = _text(upgrade.get("version"))
        self.target = version or self.target
        self.last = _text(upgrade.get("state")) or self.last

    def rebooted(self, status: dict[str, Any]) -> bool:
        """Whether this answer comes from a new boot: the uptime started over, or the node went
        away and answers with no upgrade under way (a blip while pulling is not a reboot)."""
        self.back = self.back or self._new_boot(status)
        return self.back

    def _new_boot(self, status: dict[str, Any]) -> bool:
        uptime = _number(status.get("uptime_seconds"))
        state = _mapping(status.get("upgrade")).get("state")
        if uptime is not None and self.uptime is not None and uptime < self.uptime:
            return True
        if state in ACTIVE:
            self.went_away = False
        return self.went_away and state not in ACTIVE and state != "failed"

    def progress(self, status: dict[str, Any], old: str) -> None:
        """Before the reboot: report the state; a failed upgrade fails the node."""
        self.uptime = _number(status.get("uptime_seconds"))
        upgrade = _mapping(status.get("upgrade"))
        self.note(upgrade)
        if upgrade.get("state") == "failed":
            error = _text(upgrade.get("error")) or "no reason given"
            raise _Failed(f"upgrade failed: {error}; it still runs {_text(status.get('version')) or old}")
        pulled, total = _int(upgrade.get("pulled_bytes")), _int(upgrade.get("total_bytes"))
        self.report(Progress(self.node.name, self.last, self.target and f"to {self.target}", pulled, total))

    def check(self, status: dict[str, Any]) -> tuple[str, str] | None:
        """The new boot's verdict: (version, slot) when good, None while its trial slot is not yet ready."""
        version = _text(status.get("version"))
        boot = status.get("boot")
        if not isinstance(boot, dict):
            raise _Failed(f"came back on {version or '?'} without an A/B boot state")
        slot, booted_as = _text(boot.get("slot")), _text(boot.get("booted_as"))
        if boot.get("rolled_back"):
            gave_up = _text(boot.get("rolled_back_slot"))
            raise _Failed(f"rolled back to {version or '?'}" + (f"; slot {gave_up} never got ready" if gave_up else ""))
        if not _settled(boot):
            if booted_as == "trial":
                self.last = f"slot {slot} on trial"
                self.report(Progress(self.node.name, "booting", f"slot {slot} on trial, waiting for ready"))
                return None
            raise _Failed(f"came back on slot {slot} booted as {booted_as or '?'}, not as the default")
        if self.target and version != self.target:
            raise _Failed(f"came back on {version or '?'}, not {self.target}")
        self.report(Progress(self.node.name, "upgraded", version))
        return version, slot


def _settled(boot: dict[str, Any]) -> bool:
    """The machine runs its default slot. machined makes a trial slot the default when it reaches ready
    but keeps saying how this boot began (`trial`); the trial is over once the default is this slot."""
    if boot.get("booted_as") == "default":
        return True
    return boot.get("booted_as") == "trial" and boot.get("default") == boot.get("slot") and not boot.get("trial")


def _call(request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A request whose every failure (refused, unreachable, HTTP error) fails the node."""
    try:
        return request()
    except NodeError as exc:
        raise _Failed(exc.reason) from None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return printable(str(value)) if value is not None else ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None
