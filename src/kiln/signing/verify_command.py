"""`kiln verify DIR|IMAGE --key KEY`: check a release directory against its signed SHA256SUMS and its
signed provenance (kiln.signing.attestation; KEY is release.pub), or an installer image in a registry
against its signatures (kiln.signing.image_signature; KEY is release-image.pub, or release.pub for an
image signed in the first Kiln format). `kiln verify --rebuild RELEASE_DIR` builds the release again
from its provenance and compares (kiln.signing.rebuild).

Exit 0 when everything is what the key signed (or what the rebuild made); 1 (a VerificationError)
when the directory or image fails the check or the rebuild differs; 2 when the command is wrong (no
key named, a key file of the wrong type) or the release cannot be rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core import console
from kiln.core.errors import InputError, KilnError, display_path, printable
from kiln.core.project import RUNNERS
from kiln.core.verb import Context
from kiln.pkg.options import add_schematic_option
from kiln.signing.attestation import check_provenance
from kiln.signing.release import ENVELOPE, SUMS, VerificationError, check_directory, fingerprint, load_public_key

if TYPE_CHECKING:
    from kiln.signing.image_attestation import Attested

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
    add_rebuild_arguments(parser)


# The options only --rebuild takes: (attribute, flag)
REBUILD_ONLY = (
    ("store", "--store"),
    ("rebuild_runner", "--runner"),
    ("allow_dirty", "--allow-dirty"),
    ("keep", "--keep"),
    ("schematic", "--schematic"),
)


def add_rebuild_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="build DIR (a release: its output directories) again from each provenance, with the recorded "
        "commit's own kiln image in a scratch checkout and a store of its own, and compare every artifact's "
        "sha256; exit 1 naming each that differs, with a diffoscope report (docs/provenance.md)",
    )
    parser.add_argument(
        "--store", type=Path, metavar="DIR", help="with --rebuild: the store to build in (default: a new empty one)"
    )
    parser.add_argument(
        "--runner",
        dest="rebuild_runner",  # not `runner`: the CLI fills that one from the project file
        choices=RUNNERS,
        help="with --rebuild: where packages build (default: the recorded runner)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="with --rebuild: rebuild a release made from a dirty tree from its commit (it may differ)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="with --rebuild: keep the checkout, the store and the rebuilt outputs"
    )
    add_schematic_option(
        parser, "with --rebuild: the schematic the release was made with, when its provenance redacted a secret"
    )


def run(ctx: Context[object], environ: Mapping[str, str] = os.environ) -> int:
    args = ctx.args
    try:
        if getattr(args, "rebuild", False):
            return _rebuild(args, environ)
        given = [flag for name, flag in REBUILD_ONLY if getattr(args, name, None) not in (None, False)]
        if given:
            raise InputError(f"{', '.join(given)}: only with --rebuild (kiln verify --rebuild RELEASE_DIR)")
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
            attestation = each["attestation"]
            if attestation:
                print(f"  its SLSA provenance is attested by {attestation['signer']}")
            else:
                print("  no provenance attestation (pushed unsigned, or from a layout with no provenance beside it)")
    return 0


def _rebuild(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`--rebuild`: the outcome as lines (differences on stderr) or JSON; 0 when every artifact is the same."""
    from kiln.core.project import current
    from kiln.signing.rebuild.run import Options, as_json, rebuild, summary_lines

    value = args.key or environ.get(ENV)
    project = getattr(args, "project", None) or current()
    options = Options(
        release=Path(args.directory),
        project_root=project.root,
        key=load_public_key(Path(value)) if value else None,
        store=args.store,
        runner=args.rebuild_runner,
        allow_dirty=args.allow_dirty,
        keep=args.keep,
        schematic=args.schematic,
        progress=getattr(args, "progress", None),
    )
    outcome = rebuild(options)
    if args.json:
        print(json.dumps(as_json(outcome), indent=2))
        return 0 if outcome.ok else 1
    out, err = summary_lines(outcome)
    for line in out:
        print(printable(line))
    for line in err:
        console.error(printable(line))
    return 0 if outcome.ok else 1


def _verify(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """What was verified: a directory's file count and signer, or an image's digests and signers."""
    key = key_path(args.key, environ)
    directory = Path(args.directory)
    if not directory.exists() and "/" in args.directory and (":" in args.directory or "@" in args.directory):
        from kiln.signing import image_signature
        from kiln.signing.image_attestation import verify_image_attestations

        keys = [image_signature.load_public_key(key)]
        found = image_signature.verify_image(args.directory, keys)
        attested = verify_image_attestations(args.directory, [v.digest for v in found], keys)
        images = [
            {"digest": v.digest, "signer": v.signer, "format": v.format, "attestation": _attested(attested[v.digest])}
            for v in found
        ]
        return {"image": args.directory, "images": images}
    return _verify_directory(directory, key)


def _attested(attested: Attested | None) -> dict[str, str] | None:
    return None if attested is None else {"predicate_type": attested.predicate_type, "signer": attested.signer}


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
