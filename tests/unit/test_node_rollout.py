"""The order and stopping rules of rolling upgrades and rollbacks (kiln.node.rollout), on stub nodes.

Stub: each node is a scripted object answering status, upgrade and rollback from a list, and the clock
is fake (sleeping moves it forward), so a rollout of three nodes, a 900-second deadline and a node that
never comes back are each checked in milliseconds. What a stub cannot show, that the real client
speaks machined's API over mutual TLS and sees a reboot as a silence, is what
tests/unit/test_node_client.py checks against real HTTPS servers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kiln.node.client import ApiError, NodeError, NodeUnreachable, UpgradeRequest
from kiln.node.rollout import Progress, rolling_rollback, rolling_upgrade

REQUEST = UpgradeRequest(image="registry.local:5000/kiln/installer:0.2.0")
Answer = dict[str, Any] | NodeError


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class StubNode:
    """Answers status from `statuses` in turn (the last one again once they run out); errors are raised."""

    def __init__(self, name: str, statuses: Sequence[Answer], calls: list[str], upgrade: Answer | None = None) -> None:
        self.name = name
        self.statuses = list(statuses)
        self.calls = calls
        self.upgrade_answer: Answer = upgrade or {"state": "pulling", "version": "0.2.0", "pulled_bytes": 0}
        self.rollback_answer: Answer = {"action": "rollback", "slot": "A"}
        self.bodies: list[Mapping[str, Any]] = []

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append(f"{self.name} status")
        answer = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return _give(answer)

    def upgrade(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(f"{self.name} upgrade")
        self.bodies.append(request)
        return _give(self.upgrade_answer)

    def rollback(self) -> dict[str, Any]:
        self.calls.append(f"{self.name} rollback")
        return _give(self.rollback_answer)


def _give(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, NodeError):
        raise answer
    return answer


def status(version: str, uptime: int, slot: str = "A", **boot: Any) -> dict[str, Any]:
    upgrade = boot.pop("upgrade", None)
    booted = {"slot": slot, "booted_as": "default", "default": slot, "rolled_back": False} | boot
    return {"version": version, "uptime_seconds": uptime, "boot": booted, "upgrade": upgrade, "services": []}


def pulling(uptime: int, state: str = "pulling", **more: Any) -> dict[str, Any]:
    upgrade = {"state": state, "version": "0.2.0", "pulled_bytes": 10 << 20, "total_bytes": 80 << 20} | more
    return status("0.1.0", uptime, upgrade=upgrade)


def down(name: str) -> NodeUnreachable:
    return NodeUnreachable(name, "not answering: connection refused")


def good_upgrade(name: str, calls: list[str]) -> StubNode:
    """pulling, installing, rebooting, silent twice, then back on 0.2.0 from slot B."""
    script: list[Answer] = [
        status("0.1.0", 100),
        pulling(101),
        pulling(102, "installing"),
        pulling(103, "rebooting"),
        down(name),
        down(name),
        status("0.2.0", 4, "B", previous_version="0.1.0"),
    ]
    return StubNode(name, script, calls)


def rolled_back(name: str, calls: list[str]) -> StubNode:
    """Reboots into the new slot, which never gets ready: GRUB falls back to A on 0.1.0."""
    script: list[Answer] = [
        status("0.1.0", 100),
        pulling(101, "rebooting"),
        down(name),
        status("0.1.0", 3, "A", rolled_back=True, rolled_back_slot="B", rolled_back_version="0.2.0"),
    ]
    return StubNode(name, script, calls)


def test_nodes_are_upgraded_one_at_a_time_in_the_given_order() -> None:
    calls: list[str] = []
    nodes = [good_upgrade(name, calls) for name in ("n1", "n2", "n3")]
    rollout = rolling_upgrade(nodes, REQUEST, timeout=900, clock=FakeClock())
    assert rollout.ok and rollout.failed is None
    assert rollout.lines() == [
        "n1: upgraded (slot B, 0.2.0)",
        "n2: upgraded (slot B, 0.2.0)",
        "n3: upgraded (slot B, 0.2.0)",
    ]
    # every call to a node happens before the first call to the next one
    firsts = [calls.index(f"{name} upgrade") for name in ("n1", "n2", "n3")]
    lasts = [max(i for i, call in enumerate(calls) if call.startswith(name)) for name in ("n1", "n2", "n3")]
    assert lasts[0] < firsts[1] and lasts[1] < firsts[2]
    assert nodes[0].bodies == [{"image": REQUEST.image, "preserve": True, "allow_downgrade": False}]


def test_the_rollout_stops_at_the_first_failure_and_says_where_every_node_stands() -> None:
    calls: list[str] = []
    nodes = [good_upgrade("n1", calls), rolled_back("n2", calls), good_upgrade("n3", calls)]
    rollout = rolling_upgrade(nodes, REQUEST, timeout=900, clock=FakeClock())
    assert not rollout.ok
    assert rollout.lines() == [
        "n1: upgraded (slot B, 0.2.0)",
        "n2: failed (rolled back to 0.1.0; slot B never got ready)",
        "n3: not started",
    ]
    assert not any(call.startswith("n3") for call in calls)
    assert rollout.failed is not None and rollout.failed.node == "n2"
    summary = rollout.as_json()
    assert summary["ok"] is False
    assert [node["outcome"] for node in summary["nodes"]] == ["upgraded", "failed", "not started"]


def test_a_node_whose_upgrade_fails_before_the_reboot_fails_and_keeps_its_version() -> None:
    calls: list[str] = []
    failing = [status("0.1.0", 100), pulling(101), pulling(102, "failed", error="pull: 401 unauthorized")]
    nodes = [StubNode("n1", failing, calls), good_upgrade("n2", calls)]
    rollout = rolling_upgrade(nodes, REQUEST, timeout=900, clock=FakeClock())
    assert rollout.lines() == [
        "n1: failed (upgrade failed: pull: 401 unauthorized; it still runs 0.1.0)",
        "n2: not started",
    ]
    assert "n2 status" not in calls


def test_a_node_that_never_comes_back_fails_at_its_deadline() -> None:
    clock = FakeClock()
    node = StubNode("n1", [status("0.1.0", 100), pulling(101, "rebooting"), down("n1")], [])
    rollout = rolling_upgrade([node], REQUEST, timeout=30, clock=clock)
    assert rollout.lines() == ["n1: failed (not upgraded within 30 s (last: rebooting))"]
    assert 30 <= clock.now <= 32


def test_a_refused_request_fails_the_node_without_waiting() -> None:
    clock = FakeClock()
    busy = ApiError("n1", 409, "an upgrade is already running")
    node = StubNode("n1", [status("0.1.0", 100)], [], upgrade=busy)
    rollout = rolling_upgrade([node, good_upgrade("n2", [])], REQUEST, timeout=900, clock=clock)
    assert rollout.lines() == ["n1: failed (an upgrade is already running)", "n2: not started"]
    assert clock.now == 0


def test_an_unreachable_node_fails_before_anything_is_asked_of_it() -> None:
    node = StubNode("n1", [down("n1")], [])
    rollout = rolling_upgrade([node], REQUEST, timeout=900, clock=FakeClock())
    assert rollout.lines() == ["n1: failed (not answering: connection refused)"]
    assert node.bodies == []


def test_a_node_back_on_another_version_fails() -> None:
    script: list[Answer] = [status("0.1.0", 100), pulling(101, "rebooting"), down("n1"), status("0.1.9", 3, "B")]
    rollout = rolling_upgrade([StubNode("n1", script, [])], REQUEST, timeout=900, clock=FakeClock())
    assert rollout.lines() == ["n1: failed (came back on 0.1.9, not 0.2.0)"]


def test_a_trial_boot_is_waited_for_until_machined_makes_it_the_default() -> None:
    on_trial = status("0.2.0", 2, "B", booted_as="trial", default="A", trial={"slot": "B", "tries_left": 2})
    marked = status("0.2.0", 3, "B", booted_as="trial", default="B")  # machined keeps saying how it booted
    script: list[Answer] = [status("0.1.0", 100), pulling(101, "rebooting"), down("n1"), on_trial, on_trial, marked]
    rollout = rolling_upgrade([StubNode("n1", script, [])], REQUEST, timeout=900, clock=FakeClock())
    assert rollout.lines() == ["n1: upgraded (slot B, 0.2.0)"]


def test_a_trial_boot_that_outlives_the_old_uptime_is_still_the_new_boot() -> None:
    on_trial = status("0.2.0", 30, "B", booted_as="trial", default="A", trial={"slot": "B", "tries_left": 2})
    marked = status("0.2.0", 300, "B", booted_as="trial", default="B")  # ready after longer than the old uptime
    script: list[Answer] = [status("0.1.0", 100), pulling(101, "rebooting"), on_trial, marked]
    rollout = rolling_upgrade([StubNode("n1", script, [])], REQUEST, timeout=900, clock=FakeClock())
    assert rollout.lines() == ["n1: upgraded (slot B, 0.2.0)"]


def test_a_silence_while_pulling_is_not_taken_for_a_reboot() -> None:
    script: list[Answer] = [
        status("0.1.0", 100),
        pulling(101),
        down("n1"),  # a lost packet, not a reboot: the same boot answers next
        pulling(103),
        pulling(104, "rebooting"),
        down("n1"),
        status("0.2.0", 1, "B"),
    ]
    seen: list[Progress] = []
    rollout = rolling_upgrade([StubNode("n1", script, [])], REQUEST, timeout=900, clock=FakeClock(), report=seen.append)
    assert rollout.ok
    states = [p.state for p in seen]
    assert states[0] == "pulling" and states[-1] == "upgraded" and "rebooting" in states
    assert any(p.pulled_bytes == 10 << 20 and p.total_bytes == 80 << 20 for p in seen)


def test_a_reboot_is_recognised_by_the_uptime_even_without_a_silence() -> None:
    script: list[Answer] = [status("0.1.0", 100), pulling(101, "rebooting"), status("0.2.0", 2, "B")]
    rollout = rolling_upgrade([StubNode("n1", script, [])], REQUEST, timeout=900, clock=FakeClock())
    assert rollout.ok


def test_a_rollback_waits_for_the_slot_it_named_then_goes_on() -> None:
    calls: list[str] = []
    n1 = StubNode("n1", [status("0.2.0", 50, "B"), down("n1"), status("0.1.0", 2, "A")], calls)
    n2 = StubNode("n2", [down("n2"), status("0.1.0", 3, "A")], calls)
    rollout = rolling_rollback([n1, n2], timeout=60, clock=FakeClock())
    assert rollout.lines() == ["n1: rolled back (slot A, 0.1.0)", "n2: rolled back (slot A, 0.1.0)"]
    assert calls.index("n2 rollback") > max(i for i, call in enumerate(calls) if call.startswith("n1"))


def test_a_refused_rollback_stops_the_rollout() -> None:
    n1 = StubNode("n1", [status("0.1.0", 50)], [])
    n1.rollback_answer = ApiError("n1", 409, "rollback: slot B holds no system to roll back to")
    rollout = rolling_rollback([n1, StubNode("n2", [status("0.1.0", 5)], [])], timeout=60, clock=FakeClock())
    assert rollout.lines() == ["n1: failed (rollback: slot B holds no system to roll back to)", "n2: not started"]


@pytest.mark.parametrize(
    ("request_", "body"),
    [
        (
            UpgradeRequest(url="https://r/i.tar", digest="sha256:" + "a" * 64),
            {"url": "https://r/i.tar", "digest": "sha256:" + "a" * 64},
        ),
        (UpgradeRequest(channel="beta", repository="r:5000/kiln"), {"channel": "beta", "repository": "r:5000/kiln"}),
    ],
)
def test_the_request_body_names_one_source(request_: UpgradeRequest, body: dict[str, Any]) -> None:
    assert request_.body() == body | {"preserve": True, "allow_downgrade": False}
