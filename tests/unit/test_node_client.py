"""The node client against real HTTPS servers with mutual TLS: the API round-trips, who is refused, and
whole rolling upgrades through `kiln node` where machines reboot (stop answering, then answer again).

The servers are `FakeMachine`s: a tiny http.server speaking machined's API contract (status, services,
logs, resources and their watch, rollback, upgrade, config) behind the TLS machined uses (a client
certificate signed by the CA is required). A reboot closes the listening socket for a moment, so the
client sees what it sees of a real reboot: connections refused, then a new boot with its uptime
started over. The certificates are made by openssl for each run (tests/unit/node_certs.py).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from kiln.node import command, text
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
        self.configs: list[tuple[str, bytes]] = []  # each POST /v1/config's mode and body
        self.diskless = False  # POST /v1/config answers 409, as a machine without STATE does
        self.watches: list[list[dict[str, Any]]] = []  # each watch request's lines, in turn; then it holds
        self.released = threading.Event()  # set by close(): a watch that holds ends
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
        self.released.set()
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

    def resources(self, kind: str, ident: str) -> list[dict[str, Any]]:
        return [r for r in RESOURCES if kind in ("", r["type"]) and ident in ("", r["id"])]

    def logs(self, service: str) -> tuple[int, dict[str, Any]]:
        if service != "machined":
            return 404, {"error": f"no such service: {service}"}
        return 200, {"service": service, "lines": ["machined: boot", "api: \x1b[2Jlistening"]}

    def apply_config(self, mode: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """What machined answers: 400 for a config its parser refuses, 409 without STATE, else the report."""
        if b"hostnme" in body:
            return 400, {"error": 'config: unknown field "hostnme"'}
        if self.diskless and mode != "dry_run":
            return 409, {"error": "this machine has no STATE partition (it runs diskless, /var is a tmpfs)"}
        self.configs.append((mode, body))
        sections = [
            {"section": "hostname", "result": "applied" if mode == "auto" else "staged for the next boot"},
            {"section": "install", "result": "staged for the next boot", "why": "the disk is set up at boot"},
            {"section": "api", "result": "unchanged"},
        ]
        report: dict[str, Any] = {"mode": mode, "sections": sections}
        if mode != "dry_run":
            report |= {"kept": "/run/kiln/state/config.json", "config_version": 3}
        else:
            report["notes"] = ["dry run: nothing was written or applied"]
        return 200, report

    def rollback(self) -> tuple[int, dict[str, Any]]:
        other = "B" if self.slot == "A" else "A"
        if not self.versions[other]:
            return 409, {"error": f"rollback: slot {other} holds no system to roll back to"}

        def into() -> None:
            self.slot, self.version = other, self.versions[other]

        self.reboot(into)
        return 202, {"action": "rollback", "slot": other}


def _handler(machine: FakeMachine) -> type[BaseHTTPRequestHandler]:
    gets: dict[str, Callable[[dict[str, str]], tuple[int, dict[str, Any]]]] = {
        "/v1/status": lambda query: (200, machine.status()),
        "/v1/services": lambda query: (200, {"services": machine.status()["services"]}),
        "/v1/resources": lambda query: (
            200,
            {"resources": machine.resources(query.get("type", ""), query.get("id", ""))},
        ),
        "/v1/logs": lambda query: machine.logs(query.get("service", "")),
    }

    posts: dict[str, Callable[[dict[str, list[str]], bytes], tuple[int, dict[str, Any]]]] = {
        "/v1/upgrade": lambda query, raw: machine.start_upgrade(json.loads(raw or b"{}")),
        "/v1/rollback": lambda query, raw: machine.rollback(),
        "/v1/config": lambda query, raw: machine.apply_config(query["mode"][0], raw),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            machine.requests.append(("GET", url.path))
            query = {key: values[0] for key, values in parse_qs(url.query).items()}
            if url.path == "/v1/resources" and "watch" in query:
                self.stream(machine.watches.pop(0) if machine.watches else [])
            elif url.path in gets:
                self.answer(*gets[url.path](query))
            else:
                self.answer(404, {"error": f"no such endpoint: {url.path}"})

        def do_POST(self) -> None:
            machine.requests.append(("POST", self.path))
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            url = urlsplit(self.path)
            if url.path in posts:
                self.answer(*posts[url.path](parse_qs(url.query), raw))
            else:
                self.answer(404, {"error": f"no such endpoint: {self.path}"})

        def stream(self, lines: list[dict[str, Any]]) -> None:
            """A watch: its lines, each flushed; one without a last `expired` line then holds until close()."""
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()  # HTTP/1.0, no length: the stream ends when the connection does
            for line in lines:
                self.wfile.write(json.dumps(line).encode() + b"\n")
                self.wfile.flush()
            if not lines or lines[-1]["event"] != "expired":
                machine.released.wait(10)

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


def test_kiln_node_get_one_resource_as_yaml_and_json(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    machine = machines()
    result = kiln("node", "get", "config/machine", "machine", "-o", "yaml", *flags(certs, machine))
    assert result.code == 0, result.err
    assert yaml.safe_load(result.out) == [{"node": machine.endpoint, "resources": [RESOURCES[0]]}]
    assert "\x1b" not in result.out  # escaped in YAML as in JSON: a spec cannot drive the terminal
    listed = kiln("node", "get", "network/status", "-o", "json", *flags(certs, machine))
    assert json.loads(listed.out) == [{"node": machine.endpoint, "resources": [RESOURCES[1]]}]
    assert json.loads(kiln("node", "get", "--json", *flags(certs, machine)).out)[0]["resources"] == RESOURCES


def resource(kind: str, ident: str, version: int, spec: Any = None) -> dict[str, Any]:
    owner = kind.split("/")[0]
    return {"type": kind, "id": ident, "version": version, "phase": "running", "owner": owner, "spec": spec or {}}


def line(event: str, res: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"event": event} | ({"resource": res} if res else {})


# Two watches of one machine: the first sees the state and a change, then expires; while no watch was
# open the config changed again and x/y went away; the second starts with the whole state again, and
# ends on a change of stop/now, the test's Ctrl-C.
CONFIG_V2, CONFIG_V3 = resource("config/machine", "machine", 2), resource("config/machine", "machine", 3)
STATUS_V1, STATUS_V2 = resource("network/status", "applied", 1), resource("network/status", "applied", 2)
GONE = resource("x/y", "z", 1, {"escape": "\x1b[2J"})
FIRST = [line("current", CONFIG_V2), line("current", STATUS_V1), line("current", GONE), line("synced")]
FIRST += [line("updated", STATUS_V2), line("expired")]
SECOND = [line("current", CONFIG_V3), line("current", STATUS_V2), line("synced")]
SECOND += [line("updated", resource("stop", "now", 1))]


def ctrl_c_at(monkeypatch: pytest.MonkeyPatch, dump: Callable[..., str]) -> None:
    """Ctrl-C when the change of stop/now is about to be printed, after every change before it."""

    def dump_or_stop(value: Any, output: str, **options: Any) -> str:
        if isinstance(value, dict) and value.get("resource", {}).get("type") == "stop":
            raise KeyboardInterrupt
        return dump(value, output, **options)

    monkeypatch.setattr(command, "dump", dump_or_stop)


def test_kiln_node_get_watch_prints_each_change_across_watches_until_ctrl_c(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = machines()
    machine.watches = [FIRST, SECOND]
    ctrl_c_at(monkeypatch, text.dump)
    result = kiln("node", "get", "--watch", "-o", "json", *flags(certs, machine))
    assert result.code == 0, result.err
    changes = [json.loads(text) for text in result.out.splitlines()]
    assert all(change["node"] == machine.endpoint for change in changes)
    said = [(c["event"], c["resource"]["type"], c["resource"]["version"]) for c in changes]
    assert said == [
        ("current", "config/machine", 2),
        ("current", "network/status", 1),
        ("current", "x/y", 1),
        ("updated", "network/status", 2),
        ("updated", "config/machine", 3),  # changed between the watches; network/status did not
        ("destroyed", "x/y", 1),  # not there when the second watch synced
    ]
    assert "\x1b" not in result.out
    assert machine.requests == [("GET", "/v1/resources")] * 2  # two watches


def test_kiln_node_get_watch_as_a_table_and_as_yaml(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = machines()
    machine.watches = [[line("current", STATUS_V1), line("synced"), line("updated", resource("stop", "now", 1))]]
    monkeypatch.setattr(command, "watch_row", lambda change, row=text.watch_row: _row_or_stop(change, row))
    result = kiln("node", "get", "network/status", "applied", "-w", *flags(certs, machine))
    assert result.code == 0, result.err
    header, row = result.out.splitlines()
    assert header.split() == ["NODE", "EVENT", "TYPE", "ID", "VERSION", "PHASE", "OWNER", "SPEC"]
    assert row.split() == [machine.endpoint, "current", "network/status", "applied", "1", "running", "network", "{}"]
    assert ("GET", "/v1/resources") in machine.requests
    machine.watches = [[line("current", STATUS_V1), line("synced"), line("updated", resource("stop", "now", 1))]]
    ctrl_c_at(monkeypatch, text.dump)
    documents = list(yaml.safe_load_all(kiln("node", "get", "-w", "-o", "yaml", *flags(certs, machine)).out))
    assert documents == [{"node": machine.endpoint, "event": "current", "resource": STATUS_V1}]


def _row_or_stop(change: Any, row: Callable[[Any], str]) -> str:
    if change.resource["type"] == "stop":
        raise KeyboardInterrupt
    return row(change)


def test_kiln_node_get_watch_ends_with_exit_1_when_every_node_failed(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln
) -> None:
    machine = machines()
    machine.watches = [[line("current", STATUS_V1), line("synced")]]  # then the stream just ends
    machine.released.set()
    result = kiln("node", "get", "--watch", "-o", "json", *flags(certs, machine))
    assert result.code == 1
    assert json.loads(result.out)["event"] == "current"
    assert result.err == f"{machine.endpoint}: the watch ended before its last line (the machine went away)\n"


def test_kiln_node_apply_config_prints_each_section(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, tmp_path: Path
) -> None:
    machine = machines()
    (tmp_path / "node-2.yaml").write_text("hostname: node-2\n")
    result = kiln("node", "apply-config", "node-2.yaml", *flags(certs, machine))
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        f"{machine.endpoint}: config applied, kept in /run/kiln/state/config.json; config/machine version 3",
        "  hostname            applied",
        "  install             staged for the next boot: the disk is set up at boot",
        "  api                 unchanged",
    ]
    assert machine.configs == [("auto", b"hostname: node-2\n")]  # the file as it is
    assert kiln("node", "apply-config", "node-2.yaml", "--mode", "staged", *flags(certs, machine)).code == 0
    dry = kiln("node", "apply-config", "node-2.yaml", "--dry-run", *flags(certs, machine))
    assert dry.code == 0 and dry.out.startswith(f"{machine.endpoint}: dry run, what auto would do\n")
    assert "  note: dry run: nothing was written or applied" in dry.out
    assert [mode for mode, _ in machine.configs] == ["auto", "staged", "dry_run"]
    report = json.loads(kiln("node", "apply-config", "node-2.yaml", "--json", *flags(certs, machine)).out)
    assert report["sections"][0] == {"section": "hostname", "result": "applied"}


def test_kiln_node_apply_config_refusals(
    certs: Certs, machines: Callable[..., FakeMachine], kiln: Kiln, tmp_path: Path
) -> None:
    machine, other = machines(), machines()
    (tmp_path / "typo.yaml").write_text("hostnme: node-2\n")
    (tmp_path / "node-2.yaml").write_text("hostname: node-2\n")
    refused = kiln("node", "apply-config", "typo.yaml", *flags(certs, machine))
    assert refused.code == 2
    assert refused.err == f'typo.yaml: refused by {machine.endpoint}: config: unknown field "hostnme"\n'
    machine.diskless = True
    diskless = kiln("node", "apply-config", "node-2.yaml", *flags(certs, machine))
    assert diskless.code == 2 and "no STATE partition" in diskless.err
    assert machine.configs == []
    two = kiln("node", "apply-config", "node-2.yaml", *flags(certs, machine, other))
    assert two.code == 2 and "name one node with --nodes, not 2" in two.err
    assert other.requests == []
    missing = kiln("node", "apply-config", "nope.yaml", *flags(certs, machine))
    assert missing.code == 2 and missing.err.startswith("nope.yaml:1: cannot read machine config")
    other.close()
    down = kiln("node", "apply-config", "node-2.yaml", *flags(certs, other))
    assert down.code == 1 and down.err == f"{other.endpoint}: not answering: connection refused\n"
    with pytest.raises(SystemExit) as both:  # argparse: --dry-run says what auto would do, not with --mode
        kiln("node", "apply-config", "node-2.yaml", "--mode", "staged", "--dry-run", *flags(certs, machine))
    assert both.value.code == 2
