"""`kiln verify DIR|IMAGE --key KEY`: check a release directory against its signed SHA256SUMS and its
signed provenance (kiln.signing.attestation; KEY is release.pub), or an installer image in a registry
against its signatures (kiln.signing.image_signature; KEY is release-image.pub, or release.pub for an
image signed in the first Kiln format).

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
from kiln.core.verb import Context
from kiln.signing.attestation import check_provenance
from kiln.signing.release import ENVELOPE, SUMS, VerificationError, check_directory, fingerprint, load_public_key

ENV = "KILN_RELEASE_KEY"  # the release public key when --key is absent
OLD_FORMAT_NOTE = (
    "in the first Kiln signature format, which machined refuses from Kiln 0.3.0: "
    "re-sign it with kiln release push --sign KEYDIR"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "check that DIR holds exactly the files its SHA256SUMS lists, that SHA256SUMS.sig is the release key's "
        "signature over it, and that its provenance (provenance.intoto.jsonl) is signed by the same key and names "
        "the same files and digests (docs/release-signing.md, docs/provenance.md)"
    )
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


def run(ctx: Context[object], environ: Mapping[str, str] = os.environ) -> int:
    args = ctx.args
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
        if result["provenance"]:
            subjects = result["provenance"]["subjects"]
            print(f"verified the provenance of {shown}: {subjects} subjects ({ENVELOPE} signed by {result['signer']})")
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
    return _verify_directory(directory, key)


def _verify_directory(directory: Path, key_file: Path) -> dict[str, Any]:
    """SHA256SUMS and the provenance, every problem of both at once."""
    key = load_public_key(key_file)
    checked = check_directory(directory, key)
    provenance = check_provenance(directory, key, checked)
    problems = checked.problems + provenance.problems
    if problems:
        raise VerificationError(problems)
    return {
        "directory": str(directory),
        "files": len(checked.listed),
        "signer": fingerprint(key),
        "provenance": {"subjects": provenance.subjects} if provenance.subjects else None,
    }


def key_path(flag: str | None, environ: Mapping[str, str]) -> Path:
    """--key, else $KILN_RELEASE_KEY: a verifier must say which key it trusts, there is no default."""
    value = flag or environ.get(ENV)
    if not value:
        raise InputError(f"name the release public key: --key release.pub (or set {ENV})")
    return Path(value)
