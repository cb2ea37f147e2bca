"""A fleet's API certificates, made by Kiln: `kiln secrets generate|machine|client DIR`.

Two CAs, because the two kinds of certificate must never stand in for each other: the machines CA
signs each machine's API server certificate (serverAuth), which clients check; the clients CA signs
clients' certificates (clientAuth, with a role in the Organization: admin, operator or reader), which
machines check (`api.client_ca`). A machine's key sits in its config (user-data, a config drive, an
image's embedded config, a schematic), so it is never a client: machined also refuses any client
certificate without clientAuth, with serverAuth, or holding its own key.

    DIR/machines-ca.crt, machines-ca.key    the machines CA
    DIR/clients-ca.crt, clients-ca.key      the clients CA
    DIR/machines/NAME.crt, NAME.key         a machine's certificate (its name and addresses)
    DIR/machines/NAME.api.yaml              its `api:` section, for its machine config
    DIR/clients/NAME.crt, NAME.key          a client's certificate (its role)
    DIR/clients/NAME.nodeconfig.yaml        a `kiln node` config with it (every machine in DIR)

Private keys, and the files holding them, are 0600 in 0700 directories; every file is written to a
temporary name and renamed, so an interrupted run leaves no half file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kiln.core import certificates
from kiln.core.errors import InputError, display_path

ROLES = ("admin", "operator", "reader")
ROLE_TEXT = {
    "admin": "everything",
    "operator": "status, logs, reboot, rollback, upgrade (keeping /var)",
    "reader": "status, services, logs",
}
CA_DAYS = 3652
MACHINE_DAYS = 3652  # a machine's certificate changes only with its config
CLIENT_DAYS = 365  # a person's: easy to make again, so short
DEFAULT_FLEET = "kiln"
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_DNS = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Fleet:
    """Where a fleet's files are, by the layout above."""

    root: Path

    def ca(self, kind: str) -> tuple[Path, Path]:
        return self.root / f"{kind}-ca.crt", self.root / f"{kind}-ca.key"

    def machine(self, name: str) -> tuple[Path, Path, Path]:
        base = self.root / "machines" / name
        return base.with_suffix(".crt"), base.with_suffix(".key"), base.with_suffix(".api.yaml")

    def client(self, name: str) -> tuple[Path, Path, Path]:
        base = self.root / "clients" / name
        return base.with_suffix(".crt"), base.with_suffix(".key"), base.with_suffix(".nodeconfig.yaml")


@dataclass(frozen=True)
class Authority:
    """A CA's certificate and key."""

    cert: x509.Certificate
    key: Key


@dataclass(frozen=True)
class Written:
    """One file written, and what it is for (the CLI lists them)."""

    path: Path
    what: str


def check_name(name: str, what: str) -> str:
    """A machine's, client's or fleet's name: a lower-case DNS label (it names files too)."""
    if not _NAME.fullmatch(name):
        raise InputError(f"{what} {name!r}: want lower-case letters, digits and '-' (1 to 63, no '-' at the ends)")
    return name


def check_address(text: str) -> str:
    """A machine's address: an IP address or a DNS name, as its certificate will name it."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not _DNS.fullmatch(text):
        raise InputError(f"address {text!r}: want an IP address or a DNS name")
    return text.lower()


def generate(
    root: Path, machines: dict[str, list[str]], clients: dict[str, str], *, fleet: str, force: bool
) -> list[Written]:
    """Both CAs, then each machine's and each client's files; refuses (writing nothing) an existing fleet."""
    check_name(fleet, "--name")
    layout = Fleet(root)
    existing = [p for kind in ("machines", "clients") for p in layout.ca(kind) if os.path.lexists(p)]
    if existing and not force:
        raise InputError(
            f"{display_path(root)}: holds a fleet's CAs already ({existing[0].name}); nothing was written "
            "(--force makes new ones, and every machine and client will need new certificates; "
            "kiln secrets machine|client add to this fleet)"
        )
    _directories(root)
    now = _now()
    written: list[Written] = []
    for kind, text in (
        ("machines", "signs the machines' API certificates"),
        ("clients", "signs clients' certificates"),
    ):
        authority = _new_ca(f"{fleet} {kind} CA", now)
        cert_path, key_path = layout.ca(kind)
        written += [
            _write(key_path, _key_pem(authority.key), 0o600, f"the {kind} CA's private key: keep it offline"),
            _write(cert_path, _cert_pem(authority.cert), 0o644, f"the {kind} CA: {text}"),
        ]
    for name, addresses in machines.items():
        written += add_machine(root, name, addresses, force=force)
    for name, role in clients.items():
        written += add_client(root, name, role, fleet=fleet, force=force)
    return written


def add_machine(root: Path, name: str, addresses: list[str], *, force: bool, days: int = MACHINE_DAYS) -> list[Written]:
    """A machine's server certificate (its name and addresses) and its `api:` section."""
    check_name(name, "machine")
    names = [check_address(a) for a in addresses]
    layout = Fleet(root)
    cert_path, key_path, api_path = layout.machine(name)
    authority, key = _new_leaf_key(layout, "machines", [cert_path, key_path, api_path], f"machine {name}", force=force)
    cert = _leaf(authority, key, name, None, [name, *names], ExtendedKeyUsageOID.SERVER_AUTH, days)
    client_ca = layout.ca("clients")[0].read_text()
    api = api_section(client_ca, _cert_pem(cert).decode(), _key_pem(key).decode())
    return [
        _write(key_path, _key_pem(key), 0o600, f"machine {name}'s API key: only ever in its machine config"),
        _write(cert_path, _cert_pem(cert), 0o644, f"machine {name}'s API certificate ({', '.join([name, *names])})"),
        _write(api_path, api.encode(), 0o600, f"machine {name}'s api: section, for its machine config (holds its key)"),
    ]


def add_client(
    root: Path, name: str, role: str, *, fleet: str | None = None, force: bool, days: int = CLIENT_DAYS
) -> list[Written]:
    """A client's certificate with its role, and a `kiln node` config for every machine of the fleet
    (its context named after the fleet: `fleet`, else the name the CAs carry)."""
    check_name(name, "client")
    if role not in ROLES:
        raise InputError(f"role {role!r}: want one of {', '.join(ROLES)}")
    layout = Fleet(root)
    cert_path, key_path, config_path = layout.client(name)
    authority, key = _new_leaf_key(layout, "clients", [cert_path, key_path, config_path], f"client {name}", force=force)
    cert = _leaf(authority, key, name, role, [], ExtendedKeyUsageOID.CLIENT_AUTH, days)
    machines_ca = layout.ca("machines")[0].read_text()
    context = fleet or fleet_name(authority)
    config = node_config(context, endpoints(layout), machines_ca, _cert_pem(cert).decode(), _key_pem(key).decode())
    return [
        _write(key_path, _key_pem(key), 0o600, f"client {name}'s private key"),
        _write(cert_path, _cert_pem(cert), 0o644, f"client {name}'s certificate, role {role} ({ROLE_TEXT[role]})"),
        _write(config_path, config.encode(), 0o600, f"client {name}'s kiln node config (--config, holds its key)"),
    ]


def load_ca(layout: Fleet, kind: str) -> Authority:
    """A CA of the fleet, its key checked against its certificate."""
    cert_path, key_path = layout.ca(kind)
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise InputError(
            f"{display_path(exc.filename)}: not there: make the fleet first (kiln secrets generate DIR)"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{display_path(layout.root)}: the {kind} CA does not load: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise InputError(f"{display_path(key_path)}: not the key of {cert_path.name}")
    return Authority(cert, key)


def fleet_name(authority: Authority) -> str:
    """The fleet's name, from its CA's common name ("NAME clients CA"), else the default."""
    names = authority.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    first = str(names[0].value).split(" ", 1)[0] if names else ""
    return first if _NAME.fullmatch(first) else DEFAULT_FLEET


def endpoints(layout: Fleet) -> list[str]:
    """Each machine's endpoint, by name: its certificate's first IP address, else its first DNS name."""
    found = []
    for cert_path in sorted((layout.root / "machines").glob("*.crt")):
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (OSError, ValueError, x509.ExtensionNotFound):
            continue  # not one of this fleet's machine certificates
        ips = sans.get_values_for_type(x509.IPAddress)
        dns = sans.get_values_for_type(x509.DNSName)
        if ips or dns:
            found.append(str(ips[0]) if ips else dns[0])
    return found


def api_section(client_ca: str, cert: str, key: str) -> str:
    """The machine config's `api:` section (docs/machine-config.md)."""
    lines = ["# merge into the machine's config; it holds the machine's private key", "api:"]
    for field, text in (("client_ca", client_ca), ("cert", cert), ("key", key)):
        lines += _block(field, text, indent=2)
    return "\n".join(lines) + "\n"


def node_config(context: str, nodes: list[str], ca: str, cert: str, key: str) -> str:
    """A `kiln node` config with one context (docs/node-client.md); the PEM texts inline, so it stands alone."""
    lines = [f"context: {context}", "contexts:", f"  {context}:", f"    endpoints: {json.dumps(nodes)}"]
    for field, text in (("ca", ca), ("cert", cert), ("key", key)):
        lines += _block(field, text, indent=4)
    return "\n".join(lines) + "\n"


def _block(field: str, text: str, *, indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}{field}: |", *(f"{pad}  {line}" for line in text.strip().splitlines())]


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _new_ca(common_name: str, now: datetime) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    not_before, not_after = now - timedelta(minutes=5), now + timedelta(days=CA_DAYS)
    cert = (
        certificates.builder(subject, subject, key.public_key(), not_before, not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(certificates.key_usage(cert_sign=True, crl_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def _leaf(
    authority: Authority,
    key: Key,
    name: str,
    role: str | None,
    sans: list[str],
    usage: x509.ObjectIdentifier,
    days: int,
) -> x509.Certificate:
    """A machine's (serverAuth, names) or a client's (clientAuth, the role as Organization) certificate."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if role is not None:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, role))
    now = _now()
    subject, issuer = x509.Name(attributes), authority.cert.subject
    builder = (
        certificates.builder(subject, issuer, key.public_key(), now - timedelta(minutes=5), now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(certificates.key_usage(cert_sign=False, crl_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(_general_names(sans)), critical=False)
    return builder.sign(authority.key, hashes.SHA256())


def _general_names(names: list[str]) -> list[x509.GeneralName]:
    found: list[x509.GeneralName] = []
    for text in dict.fromkeys(names):
        try:
            found.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            found.append(x509.DNSName(text))
    return found


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _new_leaf_key(layout: Fleet, kind: str, paths: list[Path], what: str, *, force: bool) -> tuple[Authority, Key]:
    """The `kind` CA and a new key for one more machine or client: the CA loads before anything is made,
    and nothing is made when one of `paths` exists unless `force`."""
    authority = load_ca(layout, kind)
    _directories(layout.root)
    _refuse_existing(paths, what, force=force)
    return authority, ec.generate_private_key(ec.SECP256R1())


def _directories(root: Path) -> None:
    """DIR, DIR/machines and DIR/clients, 0700 (they hold private keys)."""
    for path in (root, root / "machines", root / "clients"):
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path, 0o700)  # mkdir's mode passes through the umask, and an old directory keeps its own
        except OSError as exc:
            raise InputError(f"{display_path(path)}: cannot make the directory: {exc.strerror}") from None
        if path.is_symlink() or not path.is_dir():
            raise InputError(f"{display_path(path)}: not a directory")


def _refuse_existing(paths: list[Path], what: str, *, force: bool) -> None:
    present = [p for p in paths if os.path.lexists(p)]
    if present and not force:
        raise InputError(
            f"{display_path(present[0])}: {what} exists already; nothing was written (--force replaces it)"
        )


def _write(path: Path, data: bytes, mode: int, what: str) -> Written:
    """A new file with exactly `mode`, synced, renamed into place (never a half file, never through a link)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Written(path, what)
