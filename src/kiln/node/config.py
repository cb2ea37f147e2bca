"""The node client's config file, talosconfig-like: named contexts of machines and the certificates to reach them.

    context: prod                 # the context used when --context is not given
    contexts:
      prod:
        endpoints: [10.0.0.5, "10.0.0.6:50001", node-3.example.com]   # host[:port], port 50000 by default
        ca: ca.crt                # PEM text (a `|` block) or a file, relative to this file's directory
        cert: admin.crt
        key: admin.key

The file is `--config FILE`, else `$KILN_NODECONFIG`, else `~/.config/kiln/nodeconfig.yaml`, read with
Kiln's one hardened YAML reader and checked against `nodeconfig.schema.json`. Flags win over the file:
`--nodes A,B` replaces the endpoints, `--ca`/`--cert`/`--key` the certificates, `--context` the choice;
with all four of `--nodes`, `--ca`, `--cert` and `--key` no file is needed at all. Every problem is an
InputError at `file:line` (exit 2), found before any machine is contacted.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, Location, display_path
from kiln.core.yamlfile import Positioned, read_text_file, read_yaml_file
from kiln.node.client import DEFAULT_TIMEOUT, Credentials, Endpoint, NodeClient, Tls, parse_endpoint

ENV = "KILN_NODECONFIG"
DEFAULT = Path("~/.config/kiln/nodeconfig.yaml")
MAX_PEM = 1 << 20
_MARKERS = {"ca": "-----BEGIN CERTIFICATE-----", "cert": "-----BEGIN CERTIFICATE-----", "key": "PRIVATE KEY-----"}
_WHAT = {"ca": "a PEM CA certificate", "cert": "a PEM certificate", "key": "a PEM private key"}


@dataclass(frozen=True)
class Flags:
    """What the command line says; None where it says nothing."""

    config: str | None = None
    context: str | None = None
    nodes: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class ConfigFile:
    """A loaded, schema-checked config file and the line of each of its values."""

    path: Path
    data: dict[str, Any]
    positioned: Positioned

    def at(self, *path: str | int) -> Location:
        return Location(str(self.path), self.positioned.line(path))


@dataclass(frozen=True)
class Target:
    """The machines a command talks to, in order, and the TLS to do it with."""

    endpoints: tuple[Endpoint, ...]
    tls: Tls
    context: str | None = None  # the context used; None when flags alone said everything

    def clients(self, timeout: float = DEFAULT_TIMEOUT) -> list[NodeClient]:
        return [NodeClient(endpoint, self.tls, timeout=timeout) for endpoint in self.endpoints]


def config_path(flags: Flags, environ: Mapping[str, str] = os.environ) -> tuple[Path, bool]:
    """The config file and whether it was named (a named file must exist; the default may be absent)."""
    if flags.config:
        return Path(flags.config).expanduser(), True
    if environ.get(ENV):
        return Path(environ[ENV]).expanduser(), True
    return DEFAULT.expanduser(), False


def load(path: Path) -> ConfigFile:
    """Read and check a config file; every problem an InputError at file:line."""
    positioned = read_yaml_file(path, what="node config")
    data = positioned.value
    if not isinstance(data, dict):
        raise InputError("a node config must be a mapping (context:, contexts:)", Location(str(path), 1))
    problems = schema.validate(data, "nodeconfig.schema.json", "kiln.node")
    if problems:
        raise InputErrors([InputError(message, Location(str(path), positioned.line(at))) for at, message in problems])
    return ConfigFile(path, data, positioned)


def resolve(flags: Flags, environ: Mapping[str, str] = os.environ) -> Target:
    """The endpoints and TLS of this command: the config file's chosen context with the flags over it."""
    path, named = config_path(flags, environ)
    file = load(path) if named or os.path.lexists(path) else None
    if file is None and flags.context:
        raise InputError(f"--context {flags.context}: there is no node config ({display_path(path)})")
    name, context = choose_context(file, flags.context) if file else (None, {})
    endpoints = _endpoints(flags, file, name, context)
    pems = {kind: _pem(kind, getattr(flags, kind), file, name, context) for kind in ("ca", "cert", "key")}
    return Target(endpoints, _tls(pems, flags, file, name), name)


def choose_context(file: ConfigFile, wanted: str | None) -> tuple[str, dict[str, Any]]:
    """--context, else the file's `context`, else its only context."""
    contexts: dict[str, Any] = file.data["contexts"]
    name = wanted or file.data.get("context")
    known = ", ".join(sorted(contexts))
    if name is None:
        if len(contexts) == 1:
            name = next(iter(contexts))
        else:
            raise InputError(f"no context chosen: set 'context' or pass --context ({known})", file.at("contexts"))
    if name not in contexts:
        named_by = "--context" if wanted else "context"
        raise InputError(
            f"{named_by} '{name}' is not one of the contexts ({known}){schema.suggest(name, set(contexts))}",
            file.at("contexts") if wanted else file.at("context"),
        )
    return name, contexts[name]


def _endpoints(
    flags: Flags, file: ConfigFile | None, name: str | None, context: dict[str, Any]
) -> tuple[Endpoint, ...]:
    named: list[tuple[str, str, Location | None]]
    if flags.nodes is not None:
        named = [(text, "--nodes", None) for text in flags.nodes.split(",") if text.strip()]
    elif file and name and context.get("endpoints"):
        located = enumerate(context["endpoints"])
        named = [(text, f"endpoints[{i}]", file.at("contexts", name, "endpoints", i)) for i, text in located]
    else:
        where = file.at("contexts", name) if file and name else None
        raise InputError("no nodes: pass --nodes A,B or list endpoints in the context", where)
    if not named:
        raise InputError("--nodes names no node")
    endpoints: list[Endpoint] = []
    for text, what, where in named:
        try:
            endpoint = parse_endpoint(text)
        except ValueError as exc:
            raise InputError(f"{what}: {exc}", where) from None
        if endpoint in endpoints:
            raise InputError(f"{what}: {endpoint} is listed twice", where)
        endpoints.append(endpoint)
    return tuple(endpoints)


def _pem(kind: str, flag: str | None, file: ConfigFile | None, name: str | None, context: dict[str, Any]) -> str:
    """One of ca, cert, key as PEM text: --KIND FILE, else the context's value (PEM text or a file)."""
    if flag:
        text, where = read_text_file(Path(flag).expanduser(), MAX_PEM, what=f"--{kind} file"), None
    elif file and name and kind in context:
        value: str = context[kind]
        where = file.at("contexts", name, kind)
        text = value if "-----BEGIN" in value else _read_pem(file.path.parent / Path(value).expanduser(), kind, where)
    else:
        raise InputError(f"no {kind}: pass --{kind} FILE or set {kind} in the node config's context")
    if _MARKERS[kind] not in text:
        raise InputError(f"{kind} is not {_WHAT[kind]} (no {_MARKERS[kind]!r} line)", where)
    return text


def _read_pem(path: Path, kind: str, where: Location) -> str:
    try:
        return read_text_file(path, MAX_PEM, what=f"{kind} file")
    except InputError as exc:
        raise InputError(f"{kind}: {exc.message}: {display_path(path)}", where) from None


def _tls(pems: dict[str, str], flags: Flags, file: ConfigFile | None, name: str | None) -> Tls:
    """The TLS contexts, or an InputError at the value that does not load (the CA, or the cert and key)."""

    def where(kind: str) -> Location | None:
        return None if getattr(flags, kind) or not (file and name) else file.at("contexts", name, kind)

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pems["ca"])
    except (ssl.SSLError, ValueError) as exc:
        raise InputError(f"ca does not load as a CA certificate: {exc}", where("ca")) from None
    refusal = not_a_client(pems["cert"])
    if refusal:
        raise InputError(refusal, where("cert"))
    try:
        return Tls(Credentials(pems["ca"], pems["cert"], pems["key"]))
    except (ssl.SSLError, ValueError) as exc:
        reason = "the key does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else str(exc)
        raise InputError(f"cert and key do not load: {reason}", where("cert")) from None


def not_a_client(cert_pem: str) -> str | None:
    """Why a certificate cannot be a client's, when its extended key usage says so (a machine's
    certificate, serverAuth only): machined would refuse it, so it is refused before any machine is asked."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, x509.ExtensionNotFound):
        return None  # no such limit said here: machined decides
    if ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        return None
    return (
        "cert is not a client certificate (its extended key usage has no clientAuth; a machine's certificate "
        "is never a client): make one with kiln secrets client"
    )
