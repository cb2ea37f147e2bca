"""What a factory refuses in a schematic before it keeps or builds it: secrets, and registries it must not reach.

A schematic is public: `GET /schematics/<id>` serves it and every image made from it carries it
(`/usr/lib/kiln/schematic.json`, its machine config in the rootfs), and images are fetched without
the token. So a schematic that holds a secret (a PEM private key, a field named like a password or
an API key, a token in a known format) is refused when it is posted, and one kept from before is
neither served nor built.

Its `oci://` extensions are fetched by the factory's builds, from the factory's network: a name
that is, or resolves to, a loopback, link-local, private or otherwise non-public address is
refused unless the operator listed it (`--allow-registry HOST[:PORT]`); with a list, only the
listed registries are allowed. The check runs when the schematic is posted and again before
each build (a name may resolve elsewhere by then).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core.errors import BuildError, InputError
from kiln.factory.builds import Runner, Target
from kiln.image.oci_extension import Reference, is_oci

PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")
# Tokens in formats their issuers publish: AWS access key IDs, GitHub, GitLab, Slack, Google API keys, Stripe.
TOKEN_FORMATS = re.compile(
    r"\b(AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|[sr]k_live_[0-9A-Za-z]{16,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"  # and signed JWTs
)
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE)  # scheme://user:password@
# Field names (machine_config keys, service env names, NAME=value in arguments) that hold secrets.
SECRET_NAME = re.compile(
    r"(?:^|[_.-])(?:password|passwd|passphrase|secret|token|api[_-]?key|apikey|private[_-]?key|access[_-]?key"
    r"|secret[_-]?key|client[_-]?secret|credentials?|auth[_-]?key)(?:$|[_.-])",
    re.IGNORECASE,
)
NAMES_A_PLACE = re.compile(r"[_.-](?:file|path|dir|url)$", re.IGNORECASE)
ASSIGNMENT = re.compile(r"^-{0,2}(?P<name>[A-Za-z0-9_.-]+)=(?P<value>.+)$")
ALLOWED_ENTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?")
KEY_FIELDS = {("api", "key")}  # machine_config paths that hold a private key whatever its text


def secrets_in(fields: dict[str, Any]) -> list[str]:
    """Where a schematic's canonical fields hold a secret, as `path: what` lines (empty: none)."""
    return [f"{path}: {what}" for path, what in _walk(fields, ())]


def _walk(value: Any, path: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    where = ".".join(path) or "schematic"
    if isinstance(value, dict):
        for key, item in value.items():
            inner = (*path, str(key))
            if _in_config(inner) and item not in (None, "", [], {}) and _secret_field(inner):
                yield ".".join(inner), f"a field named {key!r} holds a secret"
                continue
            yield from _walk(item, inner)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, str(index)))
    elif isinstance(value, str):
        what = _secret_text(value)
        if what:
            yield where, what


def _secret_field(path: tuple[str, ...]) -> bool:
    return path[-2:] in KEY_FIELDS or _secret_name(path[-1])


def _in_config(path: tuple[str, ...]) -> bool:
    """Whether a path is inside a machine config (the schematic's own keys are never secrets)."""
    return "machine_config" in path[:-1]


def _secret_text(text: str) -> str:
    if PRIVATE_KEY.search(text):
        return "holds a PEM private key"
    if TOKEN_FORMATS.search(text):
        return "holds an access token"
    if URL_PASSWORD.search(text):
        return "holds a URL with a password"
    assigned = ASSIGNMENT.match(text)
    if assigned and _secret_name(assigned["name"]):
        return f"sets {assigned['name']!r}, a secret"
    return ""


def _secret_name(name: str) -> bool:
    """A name that says it holds a secret (`API_KEY`, `db_password`), not where one is (`TOKEN_FILE`)."""
    return bool(SECRET_NAME.search(name)) and not NAMES_A_PLACE.search(name)


Resolver = Callable[[str, int], Iterable[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address a name resolves to (the system resolver, as the build will use)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in found})


@dataclass(frozen=True)
class Registries:
    """Which registries a schematic's `oci://` extensions may name."""

    allowed: frozenset[str] = frozenset()  # HOST or HOST:PORT, lower-case
    resolver: Resolver = resolve

    @classmethod
    def of(cls, entries: Iterable[str], resolver: Resolver = resolve) -> Registries:
        """From `--allow-registry` values: HOST or HOST:PORT (an `oci://` before it is allowed and dropped)."""
        allowed = {entry.strip().lower().removeprefix("oci://") for entry in entries}
        for entry in allowed:
            if not ALLOWED_ENTRY.fullmatch(entry):
                raise InputError(f"--allow-registry {entry!r}: expected HOST or HOST:PORT")
        return cls(frozenset(allowed), resolver)

    def refusals(self, extensions: Iterable[str]) -> list[str]:
        """Why each refused registry is refused (empty: all allowed); each host resolved once."""
        hosts: dict[str, None] = {}
        problems: list[str] = []
        for text in filter(is_oci, extensions):
            try:
                hosts[Reference.parse(text).repository.host.lower()] = None
            except InputError as exc:
                problems.append(str(exc))
        return problems + [why for host in hosts for why in [self._refusal(host)] if why]

    def _refusal(self, host: str) -> str:
        name, _, port = host.partition(":")
        if host in self.allowed or name in self.allowed:
            return ""
        if self.allowed:
            return f"{host}: not a registry this factory may use ({', '.join(sorted(self.allowed))})"
        try:
            addresses = list(self.resolver(name, int(port or 443)))
        except (OSError, UnicodeError) as exc:
            return f"{host}: does not resolve ({exc})"
        inner = [a for a in addresses if not _public(a)]
        if inner or not addresses:
            shown = ", ".join(inner) or "nothing"
            return f"{host}: resolves to {shown}, not a public address (the operator may allow it: --allow-registry)"
        return ""


def _public(address: str) -> bool:
    """A global unicast address: not loopback, link-local, private, shared, reserved or multicast."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def checked_runner(runner: Runner, schematics: Path, registries: Registries) -> Runner:
    """`runner`, after the schematic's registries are checked again: a name may resolve elsewhere by now."""

    def run(target: Target, out: Path, log: Path) -> None:
        fields = json.loads((schematics / f"{target.schematic}.json").read_bytes())
        refused = registries.refusals(fields.get("extensions", []))
        if refused:
            log.write_text("".join(f"kiln factory: refused: {why}\n" for why in refused))
            raise BuildError(f"refused registry: {'; '.join(refused)}")
        runner(target, out, log)

    return run
