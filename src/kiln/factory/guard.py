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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core.errors import BuildError, InputError
from kiln.core.secrets import findings
from kiln.factory.builds import Runner, Target
from kiln.image.oci_extension import Reference, is_oci

ALLOWED_ENTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?")


def secrets_in(fields: dict[str, Any]) -> list[str]:
    """Where a schematic's canonical fields hold a secret, as `path: what` lines (empty: none);
    the rule is kiln.core.secrets', field names counting inside a machine config only."""
    return [f"{path}: {what}" for path, what in findings(fields, _in_config, top="schematic")]


def _in_config(path: tuple[str, ...]) -> bool:
    """Whether a path is inside a machine config (the schematic's own keys are never secrets)."""
    return "machine_config" in path[:-1]


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
