"""`kiln verify DIR|IMAGE --key KEY`: check a release directory against its signed SHA256SUMS (KEY is
release.pub), or an installer image in a registry against its signatures (kiln.signing.image_signature;
KEY is release-image.pub, or release.pub for an image signed in the first Kiln format).

Exit 0 when everything is what the key signed; 1 (a VerificationError) when the directory or image
fails the check; 2 when the command is wrong (no key named, a key file of the wrong type).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError, KilnError, display_path, printable
from kiln.signing.release import SUMS, fingerprint, load_public_key, verify_directory

ENV = "KILN_RELEASE_KEY"  # the release public key when --key is absent
OLD_FORMAT_NOTE = (
    "in the first Kiln signature format, which machined refuses from Kiln 0.3.0: "
    "re-sign it with kiln release push --sign KEYDIR"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory",
        metavar="DIR|IMAGE",
        help="a profile's output directory holding SHA256SUMS(.sig), or an image in a registry: "
        "HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:... (kiln release push --sign)",
    )
    parser.add_argument(
        "--key",
        metavar="FILE",
        help=f"the public key: release.pub for a directory, release-image.pub for an image (default: ${ENV})",
    )
    parser.add_argument(
        "--json", action="store_true", help="the result as JSON: ok, and what was verified or the error"
    )


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    try:
        result = _verify(args, environ)
    except KilnError as exc:
        if not getattr(args, "json", False):
            raise
        print(json.dumps({"ok": False, "error": exc.message, "exit_code": exc.exit_code}, indent=2))
        return exc.exit_code
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, **result}, indent=2))
    elif "files" in result:
        shown = printable(display_path(Path(args.directory)))
        print(f"verified {result['files']} files in {shown} ({SUMS} signed by {result['signer']})")
    else:
        for each in result["images"]:
            old = f" ({OLD_FORMAT_NOTE})" if each["format"] != "cosign" else ""
            print(f"verified {printable(args.directory)}: {each['digest']} signed by {each['signer']}{old}")
    return 0


def _verify(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """What was verified: a directory's file count and signer, or an image's digests and signers."""
    key = key_path(args.key, environ)
    directory = Path(args.directory)
    if not directory.exists() and "/" in args.directory and (":" in args.directory or "@" in args.directory):
        from kiln.signing import image_signature

        found = image_signature.verify_image(args.directory, [image_signature.load_public_key(key)])
        images = [{"digest": v.digest, "signer": v.signer, "format": v.format} for v in found]
        return {"image": args.directory, "images": images}
    names = verify_directory(directory, key)
    return {"directory": str(directory), "files": len(names), "signer": fingerprint(load_public_key(key))}


def key_path(flag: str | None, environ: Mapping[str, str]) -> Path:
    """--key, else $KILN_RELEASE_KEY: a verifier must say which key it trusts, there is no default."""
    value = flag or environ.get(ENV)
    if not value:
        raise InputError(f"name the release public key: --key release.pub (or set {ENV})")
    return Path(value)
