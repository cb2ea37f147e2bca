"""The node client against real HTTPS servers with mutual TLS: the API round-trips, who is refused, and
whole rolling upgrades through `kiln node` where machines reboot (stop answering, then answer again).

The servers are `FakeMachine`s: a tiny http.server speaking machined's API contract (status, services,
logs, rollback, upgrade) behind the TLS machined uses (a client certificate signed by the CA is
required). A reboot closes the listening socket for a moment, so the client sees what it sees of a
real reboot: connections refused, then a new boot with its uptime started over. The certificates are
made by openssl for each run (tests/unit/node_certs.py).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from kiln.node import command
from kiln.node.client import ApiError, Credentials, Endpoint, NodeClient, NodeError, NodeUnreachable, Tls
from kiln.node.rollout import rolling_rollback
from tests.conftest import Result
from tests.unit.node_certs import Certs, make_certs

Kiln = Callable[..., Result]
MiB = 1 << 20
ACTIVE = ("pulling", "installing", "rebooting")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


RESOURCES = [
    {
        "type": "config/machine",
        "id": "machine",
        "version": 2,
        "phase": "running",
        "owner": "config",
        "spec": {"source": "/run/kiln/state/config.json", "network": {"nameservers": ["\x1b[2J10.0.2.3"]}},
    },
    {
        "type": "network/status",
        "id": "applied",
        "version": 1,
        "phase": "running",
        "owner": "network",
        "spec": {"config_version": 2, "source": "/run/kiln/state/config.json"},
    },
]


class FakeMachine:
    """machined's API on 127.0.0.1; `outcome` is what an upgrade does: upgrade, rollback (GRUB falls
    back to the old slot) or fail (before the reboot)."""

    def __init__(self, certs: Certs, server: str = "server", *, outcome: str = "upgrade", other: str = "") -> None:
        self.certs, self.server_name, self.outcome = certs, server, outcome
        self.version, self.slot, self.target = "0.1.0", "A", "0.2.0"
        self.versions = {"A": "0.1.0", "B": other}
        self.boot: dict[str, Any] = {}
        self.upgrade: dict[str, Any] | None = None
        self.requests: list[tuple[str, str]] = []
        self.upgrade_asked = self.came_back = 0.0  # time.monotonic() of the last upgrade request, of the last reboot
        self.lock = threading.Lock()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self._new_boot()
        self._start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def status(self) -> dict[str, Any]:
        with self.lock:
            other = "B" if self.slot == "A" else "A"
            boot: dict[str, Any] = {
                "slot": self.slot,
                "booted_as": "default",
                "default": self.slot,
                "previous_slot": other,
            }
            boot |= {"previous_version": self.versions[other], "rolled_back": False} | self.boot
            return {
                "version": self.version,
                "kernel": "6.1.176",
                "hostname": f"node-{self.port}",
                "uptime_seconds": int(time.monotonic() - self.started) + 100 * (self.slot == "A"),
                "services": [{"name": "web", "state": "running"}, {"name": "db", "state": "failed"}],
                "boot": boot,
                "upgrade": dict(self.upgrade) if self.upgrade else None,
            }

    def _new_boot(self) -> None:
        self.started = time.monotonic()

    def _start(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certs.crt(self.server_name), self.certs.key(self.server_name))
        context.load_verify_locations(self.certs.crt("ca"))
        context.verify_mode = ssl.CERT_REQUIRED  # as machined: no client certificate from the CA, no API
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def reboot(self, into: Callable[[], None], down: float = 0.2) -> None:
        """In the background: stop answering, stay down for `down` seconds, come back as `into` says."""

        def run() -> None:
            time.sleep(0.05)  # the answer that started the reboot leaves first
            self.close()
            time.sleep(down)
            with self.lock:
                into()
                self.upgrade = None
                self._new_boot()
            self._start()
            self.came_back = time.monotonic()

        threading.Thread(target=run, daemon=True).start()

    def start_upgrade(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        sources = [key for key in ("image", "url", "channel") if key in body]
        if len(sources) != 1:
            return 400, {"error": "upgrade: give exactly one of image, url or channel"}
        with self.lock:
            if self.upgrade and self.upgrade["state"] in ACTIVE:
                return 409, {"error": "upgrade: an upgrade is already running"}
            self.upgrade = {"state": "pulling", "image": body.get("image", ""), "version": self.target}
            self.upgrade |= {"pulled_bytes": 0, "total_bytes": 80 * MiB, "error": ""}
            answer = {"upgrade": dict(self.upgrade)}
            self.upgrade_asked = time.monotonic()
        threading.Thread(target=self._run_upgrade, daemon=True).start()
        return 202, answer

    def _run_upgrade(self, step: float = 0.04) -> None:
        for state, pulled in (("pulling", 40 * MiB), ("installing", 80 * MiB)):
            time.sleep(step)
            with self.lock:
                assert self.upgrade is not None
                self.upgrade |= {"state": state, "pulled_bytes": pulled}
        time.sleep(step)
        with self.lock:
            assert self.upgrade is not None
            if self.outcome == "fail":
                self.upgrade |= {"state": "failed", "error": "install: no space left on device"}
                return
            self.upgrade["state"] = "rebooting"
        self.reboot(self._upgraded if self.outcome == "upgrade" else self._fell_back)

    def _upgraded(self) -> None:
        self.slot = "B" if self.slot == "A" else "A"
        self.version = self.versions[self.slot] = self.target

    def _fell_back(self) -> None:
        other = "B" if self.slot == "A" else "A"
        self.boot = {"rolled_back": True, "rolled_back_slot": other, "rolled_back_version": self.target}

    def rollback(self) -> tuple[int, dict[str, Any]]:
        other = "B" if self.slot == "A" else "A"
        if not self.versions[other]:
            return 409, {"error": f"rollback: slot {other} holds no system to roll back to"}

        def into() -> None:
            self.slot, self.version = other, self.versions[other]

        self.reboot(into)
        return 202, {"action": "rollback", "slot": other}


def _handler(machine: FakeMachine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            machine.requests.append(("GET", url.path))
            if url.path == "/v1/status":
                self.answer(200, machine.status())
            elif url.path == "/v1/services":
                self.answer(200, {"services": machine.status()["services"]})
            elif url.path == "/v1/resources":
                kind = parse_qs(url.query).get("type", [""])[0]
                self.answer(200, {"resources": [r for r in RESOURCES if kind in ("", r["type"])]})
            elif url.path == "/v1/logs":
                service = parse_qs(url.query).get("service", [""])[0]
                if service != "machined":
                    self.answer(404, {"error": f"no such service: {service}"})
                else:
                    self.answer(200, {"service": service, "lines": ["machined: boot", "api: \x1b[2Jlistening"]})
            else:
                self.answer(404, {"error": f"no such endpoint: {url.path}"})

        def do_POST(self) -> None:
            machine.requests.append(("POST", self.path))
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/v1/upgrade":
                self.answer(*machine.start_upgrade(body))
            elif self.path == "/v1/rollback":
                self.answer(*machine.rollback())
            else:
                self.answer(404, {"error": f"no such endpoint: {self.path}"})

        def answer(self, code: int, value: dict[str, Any]) -> None:
            data = json.dumps(value).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def machines(certs: Certs) -> Iterator[Callable[..., FakeMachine]]:
    started: list[FakeMachine] = []

    def start(server: str = "server", **options: Any) -> FakeMachine:
        started.append(FakeMachine(certs, server, **options))
        return started[-1]

    yield start
    for machine in started:
        machine.close()


def tls(certs: Certs, *, cert: bool = True) -> Tls:
    if not cert:
        return Tls(Credentials(certs.pem("ca")))
    return Tls(Credentials(certs.pem("ca"), certs.pem("client"), certs.key("client").read_text()))


def client(certs: Certs, endpoint: str, **options: Any) -> NodeClient:
    host, _, port = endpoint.rpartition(":")
    return NodeClient(Endpoint(host, int(port)), tls(certs, **options), timeout=2)


def flags(certs: Certs, *machines: FakeMachine) -> list[str]:
    nodes = ",".join(machine.endpoint for machine in machines)
    return [
        "--nodes",
        nodes,
        "--ca",
        str(certs.crt("ca")),
        "--cert",
        str(certs.crt("client")),
        "--key",
        str(certs.key("client")),
    ]


def test_status_services_and_logs_round_trip(certs: Certs, machines: Callable[..., FakeMachine]) -> None:
    machine = machines()
    node = client(certs, machine.endpoint)
    status = node.status()
    assert status["version"] == "0.1.0" and status["boot"]["slot"] == "A" and status["upgrade"] is None
    assert [s["name"] for s in node.services()] == ["web", "db"]
    assert node.logs("machined") == ["machined: boot", "api: \x1b[2Jlistening"]
    with pytest.raises(ApiError) as refused:
        node.logs("nope")
    assert refused.value.status == 404 and str(refused.value) == f"{machine.endpoint}: no such service: nope"
    assert ("GET", "/v1/logs") in machine.requests


def test_upgrade_requests_are_answered_and_refused_as_the_contract_says(
    certs: Certs, machines: Callable[..., FakeMachine]
) -> None:
    machine = machines(outcome="fail")
    node = client(certs, machine.endpoint)
    with pytest.raises(ApiError) as bad:
        node.upgrade({"image": "r/kiln:1", "url": "https://r/i.tar"})
    assert bad.value.status == 400 and "exactly one" in bad.value.reason
    started = node.upgrade({"image": "r:5000/kiln/installer:0.2.0", "preserve": True})
    assert started["state"] == "pulling" and started["version"] == "0.2.0"
    with pytest.raises(ApiError) as busy:
        node.upgrade({"image": "r:5000/kiln/installer:0.2.0"})
    assert busy.value.status == 409 and "already running" in busy.value.reason


def test_a_rollback_comes_back_on_the_slot_it_named(certs: Certs, machines: Callable[..., FakeMachine]) -> None:
    machine = machines(other="0.0.9")
    empty = machines()
    with pytest.raises(ApiError) as refused:
        client(certs, empty.endpoint).rollback()
    assert refused.value.status == 409 and "holds no system" in refused.value.reason
    rollout = rolling_rollback([client(certs, machine.endpoint)], timeout=5, poll=0.05)
    assert rollout.lines() == [f"{machine.endpoint}: rolled back (slot B, 0.0.9)"]


def test_a_client_without_a_certificate_is_refused(certs: Certs, machines: Callable[..., FakeMachine]) -> None:
    machine = machines()
    with pytest.raises(NodeError) as refused:
        client(certs, machine.endpoint, cert=False).status()
    assert machine.requests == []  # the handshake failed: no request reached the API
    assert refused.value.node == machine.endpoint
    # Go's TLS sends a "certificate required" alert (refused); this server just closes (unreachable)
    assert "client's certificate" in refused.value.reason


def test_a_server_certificate_from_another_ca_is_refused(certs: Certs, machines: Callable[..., FakeMachine]) -> None:
    machine = machines("stranger")
    with pytest.raises(NodeError) as refused:
        client(certs, machine.endpoint).status()
    assert not isinstance(refused.value, NodeUnreachable)
    assert "certificate is not trusted" in str(refused.value)


def test_an_ip_endpoint_is_trusted_on_the_chain_and_a_dns_endpoint_on_its_name_too(
    certs: Certs, machines: Callable[..., FakeMachine]
) -> None:
    elsewhere = machines("elsewhere")  # signed by the CA, but names only elsewhere.example
    assert client(certs, elsewhere.endpoint).status()["version"] == "0.1.0"
    with pytest.raises(NodeError, match="not trusted: Hostname mismatch"):
        client(certs, f"localhost:{elsewhere.port}").status()
    named = machines()  # names localhost
    assert client(certs, f"localhost:{named.port}").status()["version"] == "0.1.0"


def test_a_port_nobody_listens_on_is_unreachable(certs: Certs) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(NodeUnreachable, match="connection refused"):
        client(certs, f"127.0.0.1:{port}").status()


def test_kiln_node_status_prints_a_block_per_node_and_json(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    one, two = machines(), machines(other="0.0.9")
    result = kiln("node", "status", *flags(certs, one, two))
    assert result.code == 0, result.err
    assert f"{one.endpoint}  node-{one.port}" in result.out
    assert "  boot:      slot A as default (default A)" in result.out
    assert "  previous:  slot B: 0.0.9" in result.out and "  previous:  slot B: empty" in result.out
    assert "  services:  1 failed, 1 running (db)" in result.out
    listed = json.loads(kiln("node", "status", "--json", *flags(certs, one)).out)
    assert listed[0]["node"] == one.endpoint and listed[0]["status"]["version"] == "0.1.0"


def test_kiln_node_logs_prints_the_lines_made_printable(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    result = kiln("node", "logs", *flags(certs, machines()))
    assert result.code == 0 and result.out == "machined: boot\napi: \\x1b[2Jlistening\n"


def test_kiln_node_get_lists_the_resources_of_each_node(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    machine = machines()
    result = kiln("node", "get", *flags(certs, machine))
    assert result.code == 0, result.err
    header, config, status = result.out.splitlines()
    assert header.split() == ["NODE", "TYPE", "ID", "VERSION", "PHASE", "OWNER", "SPEC"]
    assert config.split()[:6] == [machine.endpoint, "config/machine", "machine", "2", "running", "config"]
    assert "\\u001b[2J10.0.2.3" in config and "\x1b" not in result.out  # a spec cannot drive the terminal
    assert status.split()[1] == "network/status" and status.endswith(
        '{"config_version":2,"source":"/run/kiln/state/config.json"}'
    )
    only = kiln("node", "get", "network/status", "--json", *flags(certs, machine))
    assert json.loads(only.out) == [{"node": machine.endpoint, "resources": [RESOURCES[1]]}]
    assert ("GET", "/v1/resources") in machine.requests


def test_a_network_failure_is_one_line_and_exit_1(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    machine = machines()
    machine.close()
    result = kiln("node", "status", *flags(certs, machine))
    assert result.code == 1
    assert result.err == f"{machine.endpoint}: not answering: connection refused\n"


def test_a_rolling_upgrade_goes_through_both_reboots(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "POLL", 0.05)
    one, two = machines(), machines()
    result = kiln("node", "upgrade", "--image", "r:5000/kiln/installer:0.2.0", *flags(certs, one, two))
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        f"{one.endpoint}: upgraded (slot B, 0.2.0)",
        f"{two.endpoint}: upgraded (slot B, 0.2.0)",
    ]
    assert f"{one.endpoint}: pulling" in result.err and f"{one.endpoint}: rebooting" in result.err
    assert one.version == two.version == "0.2.0"
    assert 0 < one.came_back < two.upgrade_asked  # the second machine was asked only once the first was back


def test_a_node_that_comes_back_rolled_back_stops_the_rollout(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "POLL", 0.05)
    one, two = machines(outcome="rollback"), machines()
    result = kiln("node", "upgrade", "--image", "r:5000/kiln/installer:0.2.0", "--json", *flags(certs, one, two))
    assert result.code == 1
    summary = json.loads(result.out)
    assert [n["outcome"] for n in summary["nodes"]] == ["failed", "not started"]
    assert summary["nodes"][0]["reason"] == "rolled back to 0.1.0; slot B never got ready"
    assert f"kiln node upgrade: {one.endpoint} failed: rolled back to 0.1.0" in result.err
    assert two.requests == []


def test_a_failed_upgrade_is_reported_with_the_machine_s_error(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "POLL", 0.05)
    machine = machines(outcome="fail")
    result = kiln("node", "upgrade", "--image", "r:5000/kiln/installer:0.2.0", *flags(certs, machine))
    assert result.code == 1
    assert "failed (upgrade failed: install: no space left on device; it still runs 0.1.0)" in result.out
