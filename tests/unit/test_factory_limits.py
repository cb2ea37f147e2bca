"""The factory's bounds and refusals, over real sockets on loopback: connections and threads, waiting
requests, per-client rates, failed builds' backoff, secrets in schematics, registries a schematic
may name, TLS.

The builds are test_factory's stub runner (it writes a few files in place of `kiln image`, fails,
or waits on an event): a real build needs the package store, and what is tested here is the
service around it. Everything else is real: the server, its sockets, TLS with a certificate made
here, the system resolver for `localhost`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import requests

from kiln.cli import build_parser
from kiln.core.errors import InputError
from kiln.factory import command
from kiln.factory.builds import Target
from kiln.factory.guard import Registries, checked_runner, secrets_in
from kiln.factory.server import Buckets, Limits, client_key
from kiln.factory.service import tls_context
from tests.unit.test_factory import AUTH, TOKEN, VERSION, Clock, Running, Stub, schematic_id, start

PEM_KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04f\n-----END EC PRIVATE KEY-----\n"
JWT = "eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl"  # header.payload.signature, base64url
PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIBejCCASCgAwIBAgIU\n-----END CERTIFICATE-----\n"


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Running]:
    yield from start(tmp_path)


def raw_request(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head)
    return sock


def read_status(sock: socket.socket) -> int:
    """The status of the answer on `sock` (0 when the server closed it without one)."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def test_500_concurrent_connections_keep_the_threads_bounded(tmp_path: Path) -> None:
    """500 connections open at once, each with a request head left unfinished (a slow client holds its
    thread): the process never holds more than the connection bound's threads; the rest are turned
    away with 503 at once, and the factory answers again as soon as they are gone."""
    baseline = threading.active_count()
    limits = Limits(connections=32, per_client=32, rate=0, burst=1)
    for factory in start(tmp_path, limits=limits):
        port = int(factory.url.rsplit(":", 1)[1])
        sockets = [raw_request(port, b"GET /v1/catalog HTTP/1.1\r\n") for _ in range(500)]
        time.sleep(0.5)  # the server has taken every connection it will
        peak = threading.active_count()
        for sock in sockets:
            with contextlib.suppress(OSError):  # one turned away is closed already
                sock.sendall(b"Host: factory\r\nConnection: close\r\n\r\n")
        statuses = [read_status(sock) for sock in sockets]
        assert peak - baseline <= limits.connections + 2  # the pool, the accepting thread, nothing per connection
        assert statuses.count(200) == limits.connections
        assert set(statuses) <= {200, 503, 0} and statuses.count(503) > 400
        assert factory.get("/v1/catalog").status_code == 200
        assert threading.active_count() - baseline <= limits.connections + 2


def test_a_client_holds_at_most_its_share_of_the_connections(tmp_path: Path) -> None:
    for factory in start(tmp_path, limits=Limits(connections=8, per_client=2, rate=0, burst=1)):
        port = int(factory.url.rsplit(":", 1)[1])
        held = [raw_request(port, b"GET /v1/catalog HTTP/1.1\r\n") for _ in range(2)]
        time.sleep(0.2)
        third = raw_request(port, b"GET /v1/catalog HTTP/1.1\r\nHost: f\r\n\r\n")
        assert read_status(third) == 503
        for sock in held:
            sock.sendall(b"Host: f\r\nConnection: close\r\n\r\n")
        assert [read_status(sock) for sock in held] == [200, 200]


def test_requests_waiting_for_builds_are_capped_with_a_429(tmp_path: Path) -> None:
    for factory in start(tmp_path, waiting=1):
        sid = schematic_id(factory)
        waiting = threading.Thread(target=factory.get, args=(f"/image/{sid}/{VERSION}/iso.iso",))
        waiting.start()
        while not factory.stub.calls:
            time.sleep(0.01)
        time.sleep(0.2)  # the first request is waiting for the build
        refused = factory.get(f"/image/{sid}/{VERSION}/iso.iso")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        assert "waiting for builds" in refused.json()["error"]
        assert factory.get(f"/progress/{sid}/{VERSION}/iso").status_code == 429  # a log stream waits too
        factory.stub.hold.set()
        waiting.join()
        assert factory.get(f"/image/{sid}/{VERSION}/iso.iso").status_code == 200  # built: nobody waits
        assert len(factory.stub.calls) == 1


def test_a_client_over_its_rate_gets_a_429(tmp_path: Path) -> None:
    for factory in start(tmp_path, limits=Limits(rate=0.5, burst=3)):
        assert [factory.get("/v1/catalog").status_code for _ in range(3)] == [200] * 3
        over = factory.get("/v1/catalog")
        assert over.status_code == 429 and over.headers["Retry-After"] == "2"


def test_token_buckets_refill_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    buckets = Buckets(rate=2.0, burst=2, clock=clock)
    assert [buckets.take("a"), buckets.take("a")] == [0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0.0  # one client's use is not another's
    clock.now += 0.5
    assert buckets.take("a") == 0.0
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    monkeypatch.setattr("kiln.factory.server.MAX_CLIENTS", 64)
    for n in range(1000):  # a flood of new addresses: the table stays bounded, the newest kept
        buckets.take(f"10.0.{n // 256}.{n % 256}")
    assert len(buckets._buckets) <= 64 and "10.0.3.231" in buckets._buckets
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"


def test_a_failing_schematic_is_built_once_per_backoff_window(tmp_path: Path) -> None:
    clock = Clock()
    for factory in start(tmp_path, clock=clock):
        sid = schematic_id(factory)
        factory.stub.fail = True
        factory.stub.hold.set()
        image = f"/image/{sid}/{VERSION}/iso.iso"
        answers = [factory.get(image) for _ in range(20)]
        assert {a.status_code for a in answers} == {500} and len(factory.stub.calls) == 1
        assert all("the kernel did not build" not in a.text and "the build failed" in a.text for a in answers)
        assert factory.get(f"/progress/{sid}/{VERSION}/iso").text.endswith(
            "kiln factory: failed: kiln image failed (exit 1)\n"
        )
        clock.now += 29
        assert factory.get(image).status_code == 500 and len(factory.stub.calls) == 1
        clock.now += 1  # the first window (30 s) ends: built again, fails again, the window doubles
        again = factory.get(image)
        assert again.status_code == 500 and again.headers["Retry-After"] == "60" and len(factory.stub.calls) == 2
        clock.now += 59
        assert [factory.get(image).status_code for _ in range(5)] == [500] * 5 and len(factory.stub.calls) == 2
        clock.now += 1
        factory.stub.fail = False
        assert factory.get(image).status_code == 200 and len(factory.stub.calls) == 3


@pytest.mark.parametrize(
    ("schematic", "where"),
    [
        ({"machine_config": {"api": {"ca": PEM_CERT, "cert": PEM_CERT, "key": PEM_KEY}}}, "machine_config.api.key"),
        ({"machine_config": {"services": [{"name": "w", "env": {"API_KEY": "abc123"}}]}}, "env.API_KEY"),
        ({"machine_config": {"services": [{"name": "w", "args": ["--db-password=hunter2"]}]}}, "args.0"),
        ({"machine_config": {"note": "x" + PEM_KEY}}, "machine_config.note: holds a PEM private key"),
        ({"platforms": {"aws": {"machine_config": {"api": {"key": "k"}}}}}, "platforms.aws.machine_config.api.key"),
        ({"kernel_args": ["gh.t=ghp_" + "A" * 36]}, "kernel_args.0: holds an access token"),
        ({"machine_config": {"hostname": "AKIAIOSFODNN7EXAMPLE"}}, "machine_config.hostname"),
        ({"kernel_args": ["kiln.config=https://u:hunter2@cfg.lan/k.yaml"]}, "kernel_args.0: holds a URL with a"),
        ({"machine_config": {"services": [{"name": "w", "args": [JWT]}]}}, "args.0: holds an access token"),
    ],
)
def test_a_schematic_carrying_a_secret_is_refused(factory: Running, schematic: dict[str, object], where: str) -> None:
    answer = factory.post(json.dumps(schematic))
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert where in message and "may not hold secrets" in message
    assert list((factory.root / "schematics").iterdir()) == []


def test_public_keys_and_certificates_are_not_secrets(factory: Running) -> None:
    config = {
        "hostname": "lab",
        "api": {"ca": PEM_CERT, "cert": PEM_CERT},
        "release_keys": ["-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n"],
        "services": [{"name": "w", "env": {"TOKEN_FILE": "/run/token", "KEYBOARD": "us"}}],
    }
    assert factory.post(json.dumps({"machine_config": config})).status_code == 201
    assert secrets_in({"machine_config": config}) == []
    pinned = "oci://registry.lan:5000/kiln/x:1@sha256:" + "a" * 64
    fetched = "kiln.config=https://cfg.lan:8443/k.yaml#sha256=" + "b" * 64
    assert secrets_in({"extensions": [pinned], "kernel_args": [fetched, "console=ttyS0"]}) == []


def test_a_kept_schematic_holding_a_secret_is_neither_served_nor_built(factory: Running) -> None:
    """One written before the factory refused them: its ID answers 404 everywhere and nothing builds."""
    sid = "a" * 64
    (factory.root / "schematics" / f"{sid}.json").write_text(json.dumps({"machine_config": {"api": {"key": PEM_KEY}}}))
    factory.stub.hold.set()
    for path in (f"/schematics/{sid}", f"/image/{sid}/{VERSION}/iso.iso", f"/v2/{sid}/installer/manifests/{VERSION}"):
        answer = factory.get(path)
        assert answer.status_code == 404 and "holds a secret" in answer.json()["error"], path
    assert not factory.stub.calls


def resolver(table: dict[str, list[str]]) -> Registries:
    def resolve(host: str, port: int) -> Iterable[str]:
        if host not in table:
            raise socket.gaierror(f"unknown {host}")
        return table[host]

    return Registries.of([], resolve)


def test_a_loopback_or_private_registry_is_refused_unless_allowed(tmp_path: Path) -> None:
    table = {
        "registry.example.com": ["93.184.216.34"],
        "inside.example.com": ["10.0.0.5"],
        "rebound.example.com": ["93.184.216.34", "127.0.0.1"],
    }
    for factory in start(tmp_path, registries=resolver(table)):
        for host, shown in (
            ("127.0.0.1:5000", "127.0.0.1"),
            ("inside.example.com", "10.0.0.5"),
            ("rebound.example.com", "127.0.0.1"),
            ("169.254.169.254", "169.254.169.254"),
            ("nowhere.example.com", "does not resolve"),
        ):
            answer = factory.post(f"extensions: ['oci://{host}/kiln/acpi-call:1.0']\n")
            assert answer.status_code == 400 and shown in answer.json()["error"], (host, answer.text)
        assert factory.post("extensions: ['oci://registry.example.com/kiln/acpi-call:1.0']\n").status_code == 201
        untagged = factory.post("extensions: ['oci://registry.example.com/kiln/acpi-call']\n")
        assert untagged.status_code == 400 and "invalid extension reference" in untagged.json()["error"]
    real = Registries.of([])  # the system resolver: a name for loopback is loopback
    assert "127.0.0.1" in " ".join(real.refusals(["oci://localhost:5000/kiln/x:1"]))
    assert real.refusals(["oci://127.0.0.1:5000/kiln/x:1", "lldpd"]) != []
    assert "127.0.0.1" in " ".join(real.refusals(["oci://2130706433:5000/kiln/x:1"]))  # 127.0.0.1 as one number


def test_an_allowed_registry_is_the_only_one(tmp_path: Path) -> None:
    for factory in start(tmp_path / "one", registries=Registries.of(["127.0.0.1:5000"])):
        assert factory.post("extensions: ['oci://127.0.0.1:5000/kiln/acpi-call:1.0']\n").status_code == 201
        other_port = factory.post("extensions: ['oci://127.0.0.1:6000/kiln/acpi-call:1.0']\n")
        assert other_port.status_code == 400 and "not a registry this factory may use" in other_port.json()["error"]
        public = factory.post("extensions: ['oci://registry.example.com/kiln/acpi-call:1.0']\n")
        assert public.status_code == 400
    assert Registries.of(["LocalHost"]).refusals(["oci://localhost:5000/kiln/x:1"]) == []  # HOST: any port
    assert Registries.of(["oci://registry.lan:5000"]).allowed == {"registry.lan:5000"}
    with pytest.raises(InputError, match="expected HOST or HOST:PORT"):
        Registries.of(["registry.lan/kiln"])


def test_a_build_checks_its_registries_again(tmp_path: Path) -> None:
    """A name that resolved to a public address when posted and to loopback at build time is refused
    before `kiln image` runs."""
    schematics = tmp_path / "schematics"
    schematics.mkdir()
    sid = "b" * 64
    (schematics / f"{sid}.json").write_text(json.dumps({"extensions": ["oci://rebind.example.com/x/y:1"]}))
    stub = Stub()
    stub.hold.set()
    run = checked_runner(stub, schematics, resolver({"rebind.example.com": ["127.0.0.1"]}))
    with pytest.raises(Exception, match=r"refused registry: rebind\.example\.com"):
        run(Target(sid, VERSION, "iso"), tmp_path / "out", tmp_path / "log")
    assert not stub.calls and "127.0.0.1" in (tmp_path / "log").read_text()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files), made with cryptography."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln factory test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "factory.crt", directory / "factory.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key_file.write_bytes(key_pem)
    return cert_file, key_file


def test_tls_serving_with_a_certificate_made_here(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    for factory in start(tmp_path / "f", tls=tls_context(cert, key)):
        assert factory.url.startswith("https://")
        catalog = requests.get(f"{factory.url}/v1/catalog", verify=str(cert), timeout=30)
        assert catalog.status_code == 200 and catalog.json()["version"] == VERSION
        made = requests.post(
            f"{factory.url}/schematics", data=b"extensions: [lldpd]\n", headers=AUTH, verify=str(cert), timeout=30
        )
        assert made.status_code == 201
        factory.stub.hold.set()
        image = requests.get(f"{factory.url}/image/{made.json()['id']}/{VERSION}/iso.iso", verify=str(cert), timeout=30)
        assert image.status_code == 200 and image.content == b"ISO" * 1000  # sendfile over TLS
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{factory.url}/v1/catalog", timeout=30)  # not a CA this client trusts
        plain = factory.url.replace("https://", "http://")
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"{plain}/v1/catalog", timeout=30)  # plain HTTP on a TLS port: no answer
        silent = socket.create_connection(("127.0.0.1", int(factory.url.rsplit(":", 1)[1])))  # no handshake
        assert requests.get(f"{factory.url}/v1/catalog", verify=str(cert), timeout=30).status_code == 200
        silent.close()
    with pytest.raises(Exception, match="--tls-cert"):
        tls_context(cert, tmp_path / "missing.key")


def test_plain_http_writes_are_taken_from_loopback_only(factory: Running) -> None:
    """From another address of this host (when it has one), a write over plain HTTP is a 403: the token
    would cross the network in clear."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet: it picks the source address a route would use
            address = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address")
    if ipaddress.ip_address(address).is_loopback:
        pytest.skip("no non-loopback IPv4 address")
    port = int(factory.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), source_address=(address, 0)) as sock:
        body = b"extensions: [lldpd]\n"
        auth = f"Authorization: Bearer {TOKEN}\r\n"
        head = f"POST /schematics HTTP/1.1\r\nHost: f\r\n{auth}Content-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        assert read_status(sock) == 403


def test_the_page_keeps_the_token_in_memory_only(factory: Running) -> None:
    page = factory.get("/").text
    assert "localStorage.setItem" not in page and "localStorage.getItem" not in page
    assert 'id="token"' in page  # tests/e2e/test_factory.py fills it


def test_the_serve_flags() -> None:
    argv = ["factory", "serve", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--allow-registry", "10.0.0.2:5000"]
    args = build_parser().parse_args([*argv, "--allow-registry", "registry.lan", "--connections", "40", "--rate", "4"])
    assert args.allow_registry == ["10.0.0.2:5000", "registry.lan"] and args.tls_cert == Path("c.pem")
    assert command.limits(args) == Limits(connections=40, per_client=10, rate=4.0, burst=20)
    assert build_parser().parse_args([*argv, "--listen-http", "0.0.0.0:8080"]).listen_http == "0.0.0.0:8080"


def test_each_registry_is_resolved_once_per_check() -> None:
    """A schematic naming one registry 64 times costs one lookup, not 64 (a POST's thread waits on them)."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> Iterable[str]:
        asked.append(host)
        return ["93.184.216.34"]

    references = [f"oci://registry.example.com/kiln/x{n}:1" for n in range(64)]
    assert Registries.of([], resolve).refusals(references) == [] and asked == ["registry.example.com"]
