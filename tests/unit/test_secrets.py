"""`kiln secrets`: a fleet's two CAs, machines' and clients' certificates, and that they work together.

The certificates are checked as machined checks them (the clientAuth usage, the role in the
Organization, the machine's serverAuth and names) and used for real: a mutual-TLS server playing the
machine (its certificate, the clients CA for its clients) and `kiln node`'s own client built from the
node config the command wrote.
"""

from __future__ import annotations

import json
import socket
import ssl
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kiln.core.errors import InputError
from kiln.node import pki
from kiln.node.config import Flags, not_a_client, resolve
from tests.conftest import Result

Kiln = Callable[..., Result]


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def usages(c: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    pki.generate(
        root,
        {"node-1": ["127.0.0.1", "node-1.example.com"], "node-2": ["fd00::2"]},
        {"admin": "admin", "ci": "reader"},
        fleet="prod",
        force=False,
    )
    return root


def test_the_layout_and_its_modes(fleet: Path) -> None:
    names = sorted(str(p.relative_to(fleet)) for p in fleet.rglob("*"))
    assert names == [
        "clients",
        "clients-ca.crt",
        "clients-ca.key",
        "clients/admin.crt",
        "clients/admin.key",
        "clients/admin.nodeconfig.yaml",
        "clients/ci.crt",
        "clients/ci.key",
        "clients/ci.nodeconfig.yaml",
        "machines",
        "machines-ca.crt",
        "machines-ca.key",
        "machines/node-1.api.yaml",
        "machines/node-1.crt",
        "machines/node-1.key",
        "machines/node-2.api.yaml",
        "machines/node-2.crt",
        "machines/node-2.key",
    ]
    for path in fleet.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o700, path
        elif path.suffix == ".crt":
            assert mode == 0o644, path
        else:  # keys, and the files holding a key
            assert mode == 0o600, path
    assert stat.S_IMODE(fleet.stat().st_mode) == 0o700


def test_two_cas_and_what_each_signs(fleet: Path) -> None:
    machines_ca, clients_ca = cert(fleet / "machines-ca.crt"), cert(fleet / "clients-ca.crt")
    assert machines_ca.subject.rfc4514_string() == "CN=prod machines CA"
    assert machines_ca.public_key() != clients_ca.public_key()
    for ca in (machines_ca, clients_ca):
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    machine = cert(fleet / "machines/node-1.crt")
    machine.verify_directly_issued_by(machines_ca)
    assert usages(machine) == [ExtendedKeyUsageOID.SERVER_AUTH]
    sans = machine.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in sans] == ["node-1", "127.0.0.1", "node-1.example.com"]
    for name, role in (("admin", "admin"), ("ci", "reader")):
        client = cert(fleet / f"clients/{name}.crt")
        client.verify_directly_issued_by(clients_ca)
        assert usages(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert [a.value for a in client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [role]
        assert [a.value for a in client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [name]


def test_the_machines_api_section_is_its_client_ca_and_its_own_pair(fleet: Path) -> None:
    text = (fleet / "machines/node-1.api.yaml").read_text()
    assert "\napi:\n  client_ca: |\n    -----BEGIN CERTIFICATE-----\n" in text
    body = "\n".join(line[4:] for line in text.splitlines() if line.startswith("    "))
    assert (fleet / "clients-ca.crt").read_text().strip() in body
    assert (fleet / "machines/node-1.crt").read_text().strip() in body
    assert (fleet / "machines/node-1.key").read_text().strip() in body
    assert (fleet / "machines-ca.key").read_text().strip() not in body


def test_each_client_gets_a_node_config_for_every_machine(fleet: Path) -> None:
    target = resolve(Flags(config=str(fleet / "clients/ci.nodeconfig.yaml")), environ={})
    assert target.context == "prod"
    assert [str(e) for e in target.endpoints] == ["127.0.0.1:50000", "[fd00::2]:50000"]


def test_an_existing_fleet_is_refused_and_kept(fleet: Path) -> None:
    before = {p: p.read_bytes() for p in fleet.rglob("*") if p.is_file()}
    with pytest.raises(InputError, match="holds a fleet's CAs already"):
        pki.generate(fleet, {}, {"x": "admin"}, fleet="prod", force=False)
    with pytest.raises(InputError, match="exists already"):
        pki.add_client(fleet, "ci", "admin", force=False)
    assert {p: p.read_bytes() for p in fleet.rglob("*") if p.is_file()} == before


def test_more_machines_and_clients_later(fleet: Path) -> None:
    pki.add_machine(fleet, "node-3", ["10.0.0.3"], force=False)
    pki.add_client(fleet, "ops", "operator", force=False, days=30)
    cert(fleet / "machines/node-3.crt").verify_directly_issued_by(cert(fleet / "machines-ca.crt"))
    ops = cert(fleet / "clients/ops.crt")
    assert (ops.not_valid_after_utc - ops.not_valid_before_utc).days == 30
    target = resolve(Flags(config=str(fleet / "clients/ops.nodeconfig.yaml")), environ={})
    assert target.context == "prod" and "10.0.0.3:50000" in [str(e) for e in target.endpoints]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda root: pki.add_client(root, "x", "root", force=False), "role 'root': want one of admin"),
        (lambda root: pki.add_client(root, "Bad_Name", "admin", force=False), "client 'Bad_Name'"),
        (lambda root: pki.add_machine(root, "m", ["not an address"], force=False), "address 'not an address'"),
    ],
)
def test_bad_names_roles_and_addresses(fleet: Path, call: Callable[[Path], object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        call(fleet)


def test_adding_to_no_fleet_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="make the fleet first"):
        pki.add_client(tmp_path / "none", "x", "admin", force=False)


@pytest.fixture
def machine(fleet: Path) -> Iterator[int]:
    """A TLS server with node-1's certificate that, as machined, requires a client certificate from the
    clients CA; it answers one HTTP line per connection with the client's Organization."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(fleet / "machines/node-1.crt", fleet / "machines/node-1.key")
    context.load_verify_locations(fleet / "clients-ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(raw, server_side=True) as conn:
                    conn.recv(4096)
                    subject = {str(rdn[0][0]): str(rdn[0][1]) for rdn in (conn.getpeercert() or {}).get("subject", ())}
                    body = json.dumps({"version": "test", "role": subject.get("organizationName")}).encode()
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                    conn.sendall(head.encode() + body)
            except (ssl.SSLError, OSError):
                raw.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def test_a_client_and_a_machine_trust_each_other(fleet: Path, machine: int) -> None:
    flags = Flags(config=str(fleet / "clients/ci.nodeconfig.yaml"), nodes=f"127.0.0.1:{machine}")
    (client,) = resolve(flags, environ={}).clients(timeout=5)
    assert client.status() == {"version": "test", "role": "reader"}


def test_a_machine_certificate_is_never_a_client(fleet: Path, machine: int) -> None:
    """Refused before any machine is asked; and the machine itself refuses it too (another CA)."""
    flags = Flags(
        nodes=f"127.0.0.1:{machine}",
        ca=str(fleet / "machines-ca.crt"),
        cert=str(fleet / "machines/node-2.crt"),
        key=str(fleet / "machines/node-2.key"),
    )
    with pytest.raises(InputError, match="not a client certificate"):
        resolve(flags, environ={})
    assert not_a_client((fleet / "clients/ci.crt").read_text()) is None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(fleet / "machines-ca.crt")
    context.check_hostname = False
    context.load_cert_chain(fleet / "machines/node-2.crt", fleet / "machines/node-2.key")
    with pytest.raises((ssl.SSLError, OSError)):
        talk(context, machine)


def talk(context: ssl.SSLContext, port: int) -> None:
    """One request; OSError when the server closes without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\n\r\n")
        if not conn.recv(1):
            raise OSError("closed")


def test_the_cli_generates_and_refuses(kiln: Kiln, tmp_path: Path) -> None:
    made = kiln("secrets", "generate", "f", "--machine", "node-1=10.0.0.5", "--json")
    assert made.code == 0, made.err
    files = [Path(f["path"]).name for f in json.loads(made.out)["files"]]
    assert "admin.nodeconfig.yaml" in files and "node-1.api.yaml" in files  # the default client: admin:admin
    assert cert(tmp_path / "f/clients/admin.crt").subject.rfc4514_string() == "CN=admin,O=admin"
    again = kiln("secrets", "generate", "f")
    assert again.code == 2 and "holds a fleet's CAs already" in again.err
    bad = kiln("secrets", "generate", "g", "--client", "bob")
    assert bad.code == 2 and "want NAME:ROLE" in bad.err
    more = kiln("secrets", "client", "f", "ci", "--role", "reader")
    assert more.code == 0 and "role reader" in more.out, more.err
    machine = kiln("secrets", "machine", "f", "node-2", "--address", "10.0.0.6", "--days", "0")
    assert machine.code == 2 and "--days 0" in machine.err
