"""`kiln keys generate DIR`: argument parsing and output only; the keys are made in generate.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.core.errors import InputError, display_path, printable
from kiln.core.verb import Context, generate_action
from kiln.signing.generate import MAX_NAME, add_missing, files, generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kiln keys ACTION`: only `generate` so far."""
    parser.description = "make your own Secure Boot, kernel module and release keys (docs/secure-boot.md)"
    _, gen = generate_action(
        parser,
        "keys_action",
        "write new Secure Boot (PK, KEK, db), kernel module and release keys into DIR",
        "docs/secure-boot.md",
        "the key directory; created with mode 0700 if missing",
    )
    gen.add_argument(
        "--name",
        default="Kiln",
        metavar="CN",
        help=f"common name the certificates start with (default Kiln: 'Kiln PK', 'Kiln db', ...; "
        f"up to {MAX_NAME} characters)",
    )
    gen.add_argument("--force", action="store_true", help="replace the keys DIR holds already")
    gen.add_argument(
        "--add-missing",
        action="store_true",
        help="only add the image release key (release-image.key/.pub) to a key directory made before it existed",
    )
    gen.add_argument("--json", action="store_true", help="list the files written as JSON")


def run(ctx: Context[object]) -> int:
    args = ctx.args
    if args.add_missing:
        return _add_missing(args)
    keys = generate(Path(args.dir), common_name=args.name, force=args.force)
    if args.json:
        print(json.dumps({"files": [{"path": str(path), "what": what} for path, what in files(keys)]}, indent=2))
        return 0
    for path, what in files(keys):
        print(f"wrote {printable(display_path(path))}: {what}")
    print("keep the private keys (*.key) offline, readable only by you; docs/secure-boot.md explains how to enrol them")
    return 0


def _add_missing(args: argparse.Namespace) -> int:
    """--add-missing: an older key directory gets the image release key, and nothing else changes."""
    if args.force:
        raise InputError("--add-missing keeps every key DIR holds and --force replaces them all: give one of them")
    written = add_missing(Path(args.dir))
    if args.json:
        print(json.dumps({"files": [{"path": str(path), "what": what} for path, what in written]}, indent=2))
        return 0
    if not written:
        print(f"{printable(display_path(Path(args.dir)))}: has every key already; nothing was written")
    for path, what in written:
        print(f"wrote {printable(display_path(path))}: {what}")
    return 0
