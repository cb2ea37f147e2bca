"""The HTTPS client of machined's API: mutual TLS, JSON in and out, every failure a `NodeError`.

Trust: the server's certificate must chain to the CA of the client config, the fleet's machines CA
(`kiln secrets generate`). Its name is checked only when the endpoint is a DNS name; an endpoint
given as an IP address is trusted on the chain alone, because machines are often reached on
addresses (DHCP, NAT) their certificate never named, and every certificate the machines CA signs
belongs to the fleet anyway. A client presents its own certificate and key, signed by the clients
CA with a role, which machined checks (api.client_ca) before it lets the client do anything.

Failures never leave as tracebacks: `NodeUnreachable` when nothing answers (refused, reset, timed
out: what a rebooting machine does), `ApiError` for an HTTP error with machined's `{"error"}`,
`NodeError` for the rest (TLS trust, an answer that is not JSON). All exit 1.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlencode

from kiln.core.errors import KilnError, printable

DEFAULT_PORT = 50000
MAX_ANSWER = 16 << 20  # logs are the largest answer; a machine keeps a bounded number of lines
DEFAULT_TIMEOUT = 10.0
# a machine ends each watch within 25 s with an "expired" line: this long without a line is a dead link
WATCH_TIMEOUT = 60.0
MAX_WATCH_LINE = 4 << 20  # one resource's JSON line


class NodeError(KilnError):
    """A node could not do what was asked, or could not be asked; `reason` is the message without the node."""

    exit_code = 1

    def __init__(self, node: str, reason: str) -> None:
        self.node = printable(node)
        self.reason = printable(reason)
        super().__init__(f"{self.node}: {self.reason}")


class NodeUnreachable(NodeError):
    """Nothing answered: refused, reset, timed out or unresolvable. Expected while a node reboots."""


class ApiError(NodeError):
    """machined answered with an HTTP error; `status` is its code, `reason` its `error` text."""

    def __init__(self, node: str, status: int, reason: str) -> None:
        super().__init__(node, reason)
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """One machine's API address; `host` is a DNS name or an IP address (IPv6 without brackets)."""

    host: str
    port: int = DEFAULT_PORT

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`host`, `host:port`, `[v6]` or `[v6]:port`; ValueError says what is wrong."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not host[:port] ([v6addr]:port for IPv6)")
        port_text = rest[1:] if rest else ""
    elif text.count(":") > 1:
        host, port_text = text, ""  # a bare IPv6 address
        _check_host(host, text)
        return Endpoint(host)
    else:
        host, _, port_text = text.partition(":")
    _check_host(host, text)
    return Endpoint(host, _port(port_text, text) if port_text or text.endswith(":") else DEFAULT_PORT)


def _check_host(host: str, whole: str) -> None:
    if not host or any(c.isspace() or c in "/@?#[]" for c in host):
        raise ValueError(f"{whole!r} is not host[:port]")


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{whole!r}: the port must be a number from 1 to 65535")
    return int(text)


@dataclass(frozen=True)
class Credentials:
    """PEM texts: the CA that signs the machines' certificates, and this client's certificate and key."""

    ca: str
    cert: str | None = None
    key: str | None = None


class Tls:
    """The client's TLS contexts, built once: chain-and-name for DNS endpoints, chain-only for IPs.

    Raises ssl.SSLError (or ValueError) when the CA, certificate or key do not load.
    """

    def __init__(self, credentials: Credentials) -> None:
        self.strict = _context(credentials, check_hostname=True)
        self.chain_only = _context(credentials, check_hostname=False)

    def context_for(self, endpoint: Endpoint) -> ssl.SSLContext:
        return self.chain_only if endpoint.is_ip else self.strict


def _context(credentials: Credentials, *, check_hostname: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode is CERT_REQUIRED: the chain is always checked
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    context.load_verify_locations(cadata=credentials.ca)
    if credentials.cert is not None:
        _load_chain(context, credentials.cert, credentials.key or credentials.cert)
    return context


def _load_chain(context: ssl.SSLContext, cert: str, key: str) -> None:
    """load_cert_chain reads only files: the PEM texts go to a private (0700) temporary directory,
    which is removed as soon as they are loaded."""
    with tempfile.TemporaryDirectory(prefix="kiln-node-") as directory:
        paths = []
        for name, text in (("cert.pem", cert), ("key.pem", key)):
            path = Path(directory) / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])


@dataclass(frozen=True)
class UpgradeRequest:
    """The body of POST /v1/upgrade: exactly one source (image, url, or channel with repository)."""

    image: str | None = None
    url: str | None = None
    digest: str | None = None
    channel: str | None = None
    repository: str | None = None
    preserve: bool = True
    allow_downgrade: bool = False

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.image:
            body["image"] = self.image
        elif self.url:
            body["url"] = self.url
            if self.digest:
                body["digest"] = self.digest
        else:
            body["channel"], body["repository"] = self.channel, self.repository
        body["preserve"] = self.preserve
        body["allow_downgrade"] = self.allow_downgrade
        return body

    def describe(self) -> str:
        if self.image:
            return self.image
        if self.url:
            return self.url
        return f"channel {self.channel} of {self.repository}"


class NodeClient:
    """One machine's API. `name` is how messages and summaries name it (its endpoint)."""

    def __init__(self, endpoint: Endpoint, tls: Tls, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint
        self.name = str(endpoint)
        self._context = tls.context_for(endpoint)
        self._timeout = timeout

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """GET /v1/status."""
        return self._object("GET", "/v1/status", timeout=timeout)

    def services(self) -> list[dict[str, Any]]:
        """GET /v1/services: each service's state."""
        services = self._object("GET", "/v1/services").get("services")
        if not isinstance(services, list):
            raise NodeError(self.name, "answered /v1/services without a list of services")
        return [s for s in services if isinstance(s, dict)]

    def logs(self, service: str) -> list[str]:
        """GET /v1/logs?service=NAME: the lines the machine kept ("machined" for machined's own)."""
        lines = self._object("GET", "/v1/logs?" + urlencode({"service": service})).get("lines")
        if not isinstance(lines, list):
            raise NodeError(self.name, "answered /v1/logs without a list of lines")
        return [str(line) for line in lines]

    def resources(self, kind: str = "", ident: str = "") -> list[dict[str, Any]]:
        """GET /v1/resources[?type=TYPE[&id=ID]]: the machine's resources (type, id, version, phase, owner, spec)."""
        resources = self._object("GET", _resources_path(kind, ident)).get("resources")
        if not isinstance(resources, list):
            raise NodeError(self.name, "answered /v1/resources without a list of resources")
        return [r for r in resources if isinstance(r, dict)]

    def watch(self, kind: str = "", ident: str = "") -> Iterator[dict[str, Any]]:
        """GET /v1/resources?watch=1: the stream's lines as they come (`event`: current, then synced, then
        updated or destroyed, each but synced with its `resource`), until its last one, `expired`; a stream
        that ends without it is NodeUnreachable. Each watch is its own connection."""
        path = _resources_path(kind, ident, watch=True)
        connection = self._connect(WATCH_TIMEOUT)
        try:
            with self._failures():
                connection.request("GET", path, headers={"Accept": "application/x-ndjson"})
                response = connection.getresponse()
                if response.status != 200:
                    self._raise_for(response.status, response.read(MAX_ANSWER + 1), "GET", path)
                yield from self._lines(response)
        finally:
            connection.close()

    def _lines(self, response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
        while True:
            line = response.readline(MAX_WATCH_LINE + 1)
            if not line:
                raise NodeUnreachable(self.name, "the watch ended before its last line (the machine went away)")
            event = _json(line)
            if len(line) > MAX_WATCH_LINE or not isinstance(event, dict) or not isinstance(event.get("event"), str):
                raise NodeError(self.name, "the watch sent a line that is not a JSON event")
            yield event
            if event["event"] == "expired":
                return

    def apply_config(self, document: bytes, mode: str) -> dict[str, Any]:
        """POST /v1/config?mode=MODE (auto, staged or dry_run) with the config as it is, YAML or JSON: the
        machine's report (`sections`, each `applied`, `staged for the next boot`, `unchanged` or `not
        applied`). A config the machine refuses is an ApiError: 400 invalid, 409 not here, 413 too large."""
        path = "/v1/config?" + urlencode({"mode": mode})
        return self._object("POST", path, raw=(document, "application/yaml"))

    def rollback(self) -> dict[str, Any]:
        """POST /v1/rollback: `{"slot"}` the machine reboots into; ApiError 409 when it cannot."""
        return self._object("POST", "/v1/rollback", body={})

    def upgrade(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/upgrade: the upgrade object (state, image, version...) the machine started."""
        upgrade = self._object("POST", "/v1/upgrade", body=dict(request)).get("upgrade")
        if not isinstance(upgrade, dict):
            raise NodeError(self.name, "answered /v1/upgrade without an upgrade object")
        return upgrade

    def _object(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        raw: tuple[bytes, str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request whose answer is a JSON object; `raw` is a body as it is, with its content type."""
        payload = raw or ((json.dumps(body).encode(), "application/json") if body is not None else None)
        status, data = self._exchange(method, path, payload, timeout)
        if not 200 <= status < 300:
            self._raise_for(status, data, method, path)
        answer = _json(data)
        if not isinstance(answer, dict):
            raise NodeError(self.name, f"{method} {path}: the answer is not a JSON object")
        return answer

    def _raise_for(self, status: int, data: bytes, method: str, path: str) -> NoReturn:
        """An HTTP error as ApiError, with machined's `{"error"}` text when it sent one."""
        answer = _json(data[:MAX_ANSWER])
        error = answer.get("error") if isinstance(answer, dict) else None
        raise ApiError(self.name, status, str(error) if error else f"{method} {path}: HTTP {status}")

    def _connect(self, timeout: float | None) -> http.client.HTTPSConnection:
        host, port = self.endpoint.host, self.endpoint.port
        return http.client.HTTPSConnection(host, port, context=self._context, timeout=timeout or self._timeout)

    def _exchange(
        self, method: str, path: str, payload: tuple[bytes, str] | None, timeout: float | None
    ) -> tuple[int, bytes]:
        """One request on its own connection (machines reboot between requests: nothing is kept open)."""
        connection = self._connect(timeout)
        headers = {"Accept": "application/json"} | ({"Content-Type": payload[1]} if payload else {})
        try:
            with self._failures():
                connection.request(method, path, body=payload[0] if payload else None, headers=headers)
                response = connection.getresponse()
                data = response.read(MAX_ANSWER + 1)
        finally:
            connection.close()
        if len(data) > MAX_ANSWER:
            raise NodeError(self.name, f"{method} {path}: the answer is larger than {MAX_ANSWER} bytes")
        return response.status, data

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """TLS and network failures as this node's NodeErrors."""
        try:
            yield
        except ssl.SSLCertVerificationError as exc:
            raise NodeError(self.name, f"TLS: the server's certificate is not trusted: {exc.verify_message}") from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            raise NodeUnreachable(self.name, _CLOSED) from None
        except ssl.SSLError as exc:
            raise NodeError(self.name, _tls_reason(exc)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise NodeUnreachable(self.name, f"not answering: {_network_reason(exc)}") from None


def _resources_path(kind: str, ident: str, *, watch: bool = False) -> str:
    query = [(key, value) for key, value in (("watch", "1" if watch else ""), ("type", kind), ("id", ident)) if value]
    return "/v1/resources" + ("?" + urlencode(query) if query else "")


_CLOSED = "the connection closed during TLS (rebooting, or the machine does not accept this client's certificate)"
_REFUSED_ALERTS = ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "ACCESS_DENIED")


def _tls_reason(exc: ssl.SSLError) -> str:
    reason = str(exc.reason or exc)
    if any(alert in reason for alert in _REFUSED_ALERTS):
        return f"TLS: the machine refused this client's certificate ({reason})"
    return f"TLS: {reason}"


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _network_reason(exc: BaseException) -> str:
    """A short reason for a network failure: `connection refused`, `timed out`, ..."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__
