"""`kiln verify DIR|IMAGE --key release.pub`: check a release directory against its signed SHA256SUMS,
or an installer image in a registry against its signatures (kiln.signing.image_signature).

Exit 0 when every file is what the release key signed; 1 (a VerificationError) when the directory
fails the check; 2 when the command is wrong (no key named, a key file that is not Ed25519).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from kiln.core.errors import InputError, display_path, printable
from kiln.signing.release import SUMS, fingerprint, load_public_key, verify_directory

ENV = "KILN_RELEASE_KEY"  # the release public key when --key is absent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory",
        metavar="DIR|IMAGE",
        help="a profile's output directory holding SHA256SUMS(.sig), or an image in a registry: "
        "HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:... (kiln release push --sign)",
    )
    parser.add_argument("--key", metavar="FILE", help=f"the release public key, release.pub (default: ${ENV})")


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    key = key_path(args.key, environ)
    directory = Path(args.directory)
    if not directory.exists() and "/" in args.directory and (":" in args.directory or "@" in args.directory):
        return verify_image_command(args.directory, key)
    names = verify_directory(directory, key)
    signer = fingerprint(load_public_key(key))
    print(f"verified {len(names)} files in {printable(display_path(directory))} ({SUMS} signed by {signer})")
    return 0


def verify_image_command(reference: str, key: Path) -> int:
    from kiln.signing.image_signature import verify_image

    for digest, signer in verify_image(reference, [load_public_key(key)]):
        print(f"verified {printable(reference)}: {digest} signed by {signer}")
    return 0


def key_path(flag: str | None, environ: Mapping[str, str]) -> Path:
    """--key, else $KILN_RELEASE_KEY: a verifier must say which key it trusts, there is no default."""
    value = flag or environ.get(ENV)
    if not value:
        raise InputError(f"name the release public key: --key release.pub (or set {ENV})")
    return Path(value)
