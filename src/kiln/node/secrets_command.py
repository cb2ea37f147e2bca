"""`kiln secrets generate|machine|client DIR`: argument parsing and output only; pki.py makes the certificates."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.core.errors import InputError, display_path, printable
from kiln.core.verb import Context, generate_action
from kiln.node import pki


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kiln secrets ACTION DIR`: a new fleet, or one more machine or client in it."""
    parser.description = (
        "make a fleet's API certificates: a machines CA and a clients CA, each machine's server certificate and "
        "api: section, each client's certificate (role admin, operator or reader) and kiln node config "
        "(docs/machine-config.md#the-api)"
    )
    actions, gen = generate_action(
        parser,
        "secrets_action",
        "write a fleet's two CAs (machines, clients), machines' API certificates and clients' certificates into DIR",
        "docs/machine-config.md#the-api",
        "the fleet's directory; created with mode 0700 if missing",
    )
    gen.add_argument(
        "--machine",
        action="append",
        default=[],
        metavar="NAME[=ADDR,...]",
        help="a machine and the addresses (IP or DNS) its certificate names; repeat for more",
    )
    gen.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME:ROLE",
        help=f"a client and its role ({', '.join(pki.ROLES)}); repeat for more (default: admin:admin)",
    )
    gen.add_argument(
        "--name",
        default=pki.DEFAULT_FLEET,
        metavar="FLEET",
        help="the fleet's name: the CAs' and node configs' context",
    )
    _common(gen, "replace the fleet DIR holds (every machine and client then needs new certificates)")
    machine = actions.add_parser("machine", help="sign one more machine's API certificate with DIR's machines CA")
    machine.add_argument("dir", metavar="DIR", help="the fleet's directory (kiln secrets generate made it)")
    machine.add_argument("name", metavar="NAME", help="the machine's name (its certificate's first DNS name)")
    machine.add_argument(
        "--address", action="append", default=[], metavar="ADDR", help="an IP address or DNS name it is reached by"
    )
    _days(machine, pki.MACHINE_DAYS)
    _common(machine, "replace the machine's certificate and key")
    client = actions.add_parser("client", help="sign one more client's certificate with DIR's clients CA")
    client.add_argument("dir", metavar="DIR", help="the fleet's directory (kiln secrets generate made it)")
    client.add_argument("name", metavar="NAME", help="the client's name (its certificate's common name)")
    client.add_argument("--role", required=True, choices=pki.ROLES, help="what it may do on the machines")
    _days(client, pki.CLIENT_DAYS)
    _common(client, "replace the client's certificate and key")


def _days(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--days", type=int, default=default, metavar="N", help=f"how long the certificate is valid (default {default})"
    )


def _common(parser: argparse.ArgumentParser, force_text: str) -> None:
    parser.add_argument("--force", action="store_true", help=force_text)
    parser.add_argument("--json", action="store_true", help="list the files written as JSON")


def run(ctx: Context[object]) -> int:
    args = ctx.args
    root = Path(args.dir)
    if args.secrets_action == "generate":
        machines = dict(parse_machine(text) for text in args.machine)
        clients = dict(parse_client(text) for text in args.client or ["admin:admin"])
        written = pki.generate(root, machines, clients, fleet=args.name, force=args.force)
    else:
        if not 0 < args.days <= 36500:
            raise InputError(f"--days {args.days}: want 1 to 36500")
        if args.secrets_action == "machine":
            written = pki.add_machine(root, args.name, args.address, force=args.force, days=args.days)
        else:
            written = pki.add_client(root, args.name, args.role, force=args.force, days=args.days)
    if args.json:
        print(json.dumps({"files": [{"path": str(w.path), "what": w.what} for w in written]}, indent=2))
        return 0
    for w in written:
        print(f"wrote {printable(display_path(w.path))}: {w.what}")
    print(_advice(args.secrets_action))
    return 0


def _advice(action: str) -> str:
    if action == "client":
        return "give the client its .nodeconfig.yaml (kiln node --config FILE); it holds the client's key"
    if action == "machine":
        return (
            "put the machine's .api.yaml into its machine config; node configs made before it do not list it "
            "(add it to their endpoints, or pass --nodes)"
        )
    return (
        "keep DIR/*-ca.key offline; each machine's .api.yaml goes into its config (that config then holds a private "
        "key), each client's .nodeconfig.yaml to the client"
    )


def parse_machine(text: str) -> tuple[str, list[str]]:
    """`NAME` or `NAME=ADDR,ADDR`."""
    name, _, addresses = text.partition("=")
    return pki.check_name(name, "--machine"), [a for a in addresses.split(",") if a]


def parse_client(text: str) -> tuple[str, str]:
    """`NAME:ROLE`."""
    name, sep, role = text.partition(":")
    if not sep:
        raise InputError(f"--client {text!r}: want NAME:ROLE (role {', '.join(pki.ROLES)})")
    return pki.check_name(name, "--client"), role
