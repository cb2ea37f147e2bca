"""Attestations of installer images in a registry, in cosign's format: the SLSA provenance of the
`kiln image` run that made an installer, restated for each pushed manifest and signed with the image
release key. `kiln release push --sign` writes them beside the signatures (kiln.signing.image_signature),
`kiln verify IMAGE` checks them, and so does `cosign verify-attestation --key --type slsaprovenance1`
with the public key alone (docs/provenance.md).

For a manifest digest D, the tag `sha256-<hex of D>.att` in the same repository names an OCI image
manifest whose layer is a DSSE envelope (kiln.signing.dsse; media type
`application/vnd.dsse.envelope.v1+json`, payload type `application/vnd.in-toto+json`), annotated with
its `predicateType` and an empty `dev.cosignproject.cosign/signature` (the signature is inside the
envelope), as cosign writes an attestation made with a key. The envelope's statement is an in-toto
Statement v1 whose one subject is HOST/REPO with D's sha256, and whose predicate is the release
directory's provenance.intoto.json predicate: the build definition and run of the installer's build.
The subject is the pushed manifest, not the directory's files, since that is what a puller holds.

Signing is deterministic (RFC 6979 and canonical JSON): pushing the same release again writes the
same attestation. A verifier trusts nothing before the envelope's signature holds, and reads every
registry answer with a bound.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from kiln.core.errors import InputError
from kiln.core.registry import Client
from kiln.signing import dsse
from kiln.signing.attestation import SLSA_PROVENANCE, STATEMENT_TYPE
from kiln.signing.image_signature import (
    SIGNATURE_KEY,
    SIGNATURE_MANIFEST_LIMIT,
    PublicKey,
    SignatureArtifact,
    canonical,
    key_fingerprint,
    one_layer_artifact,
    put_artifact,
    signature_tag,
    split_reference,
    typed_layers,
)
from kiln.signing.release import MAX_PROVENANCE, VerificationError, read_signed

ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
PREDICATE_KEY = "predicateType"


@dataclass(frozen=True)
class Attested:
    """One digest whose attestation held: by which key (fingerprint), with which predicate."""

    digest: str
    signer: str
    predicate_type: str


def attestation_tag(digest: str) -> str:
    """Where a digest's attestation lives in its repository: `sha256-<hex>.att`."""
    return signature_tag(digest).removesuffix(".sig") + ".att"


def read_provenance(path: Path) -> dict[str, Any]:
    """The SLSA v1 provenance statement in `path` (a release directory's provenance.intoto.json): a regular
    file, read with a bound and without following a link."""
    try:
        data = read_signed(path.parent, path.name, MAX_PROVENANCE)
    except VerificationError as exc:
        raise InputError(f"{path}: {exc.problems[0].removeprefix(path.name + ': ')}") from None
    try:
        statement = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise InputError(f"{path}: not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise InputError(f"{path}: not an in-toto statement ({STATEMENT_TYPE})")
    if statement.get("predicateType") != SLSA_PROVENANCE or not isinstance(statement.get("predicate"), dict):
        raise InputError(f"{path}: not SLSA provenance ({SLSA_PROVENANCE})")
    return statement


def statement_for(digest: str, repository: str, provenance: dict[str, Any]) -> bytes:
    """The statement attesting `digest` in `repository` (HOST[:PORT]/REPO) with the provenance's predicate."""
    subject = {"name": repository, "digest": {"sha256": digest.removeprefix("sha256:")}}
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [subject],
        "predicateType": SLSA_PROVENANCE,
        "predicate": provenance["predicate"],
    }
    return canonical(statement)


def attest_digest(
    digest: str, repository: str, provenance: dict[str, Any], key: ec.EllipticCurvePrivateKey
) -> SignatureArtifact:
    """The attestation artifact of `digest`: the envelope as its one layer."""
    attestation_tag(digest)  # checks the digest's form
    envelope = dsse.sign(statement_for(digest, repository, provenance), key, keyid="").rstrip(b"\n")
    return one_layer_artifact(envelope, ENVELOPE_TYPE, {SIGNATURE_KEY: "", PREDICATE_KEY: SLSA_PROVENANCE})


def push_attestation(client: Client, digest: str, provenance: dict[str, Any], key: ec.EllipticCurvePrivateKey) -> str:
    """Upload `digest`'s attestation next to it; returns the attestation's tag."""
    artifact = attest_digest(digest, f"{client.ref.host}/{client.ref.repo}", provenance, key)
    return put_artifact(client, attestation_tag(digest), artifact.blobs, artifact.manifest)


def verify_attestation(client: Client, digest: str, keys: list[PublicKey]) -> Attested | None:
    """The attestation of one digest in the client's repository, checked; None when it has none."""
    found = client.get_manifest(attestation_tag(digest), limit=SIGNATURE_MANIFEST_LIMIT)
    if found is None:
        return None
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kiln-att-") as tmp:
        for number, layer in enumerate(_envelope_layers(found[0], digest)):
            envelope = client.get_blob(layer, Path(tmp) / f"envelope-{number}").read_bytes()
            try:
                return _check_envelope(envelope, digest, keys)
            except VerificationError as exc:
                problems += exc.problems
    raise VerificationError(problems)


def _envelope_layers(manifest: bytes, digest: str) -> list[dict[str, Any]]:
    """The DSSE layers of an attestation manifest, each one's size bounded before it is fetched."""
    found = typed_layers(manifest, ENVELOPE_TYPE, f"attestation of {digest}")
    for layer in found:
        size = layer.get("size")
        if not isinstance(size, int) or not 0 < size <= dsse.MAX_ENVELOPE:
            raise VerificationError([f"attestation of {digest}: an envelope of {size!r} bytes"])
    return found


def _check_envelope(envelope: bytes, digest: str, keys: list[PublicKey]) -> Attested:
    """The envelope opened by a trusted key, its statement SLSA provenance naming `digest`."""
    for key in keys:
        try:
            payload = dsse.open_envelope(envelope, key)
        except dsse.NotSigned:
            continue
        except dsse.EnvelopeError as exc:
            raise VerificationError([f"attestation of {digest}: {exc}"]) from None
        _check_statement(payload, digest)
        return Attested(digest, key_fingerprint(key), SLSA_PROVENANCE)
    raise VerificationError([f"attestation of {digest} is not by a trusted key"])


def _check_statement(payload: bytes, digest: str) -> None:
    try:
        statement = json.loads(payload)
        kind, predicate_type, subjects = statement["_type"], statement["predicateType"], statement["subject"]
        named = {str(entry["digest"]["sha256"]) for entry in subjects}
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise VerificationError([f"attestation of {digest}: a malformed statement"]) from None
    if kind != STATEMENT_TYPE or predicate_type != SLSA_PROVENANCE:
        raise VerificationError([f"attestation of {digest}: not SLSA provenance in an in-toto statement"])
    if digest.removeprefix("sha256:") not in named:
        raise VerificationError([f"attestation of {digest}: its statement names other images"])


def verify_image_attestations(reference: str, digests: list[str], keys: list[PublicKey]) -> dict[str, Attested | None]:
    """Each of `digests` (those `verify_image` found signed) in the reference's repository: its attestation
    checked, or None when it has none (an image pushed before Kiln attested them, or without a provenance)."""
    ref, _ = split_reference(reference)
    client = Client(ref)
    return {digest: verify_attestation(client, digest, keys) for digest in digests}
