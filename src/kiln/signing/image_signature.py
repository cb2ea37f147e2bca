"""Signatures of installer images in a registry: what `kiln release push --sign` writes, what
`kiln verify IMAGE` and machined check before an upgrade.

The signed thing is an image manifest's digest D (each architecture's manifest; a multi-arch
release's index is signed too). In the same repository, the tag `sha256-<hex of D>.sig` names an
OCI image manifest whose one layer is the payload, canonical JSON

    {"critical":{"image":{"manifest-digest":"<D>"},"type":"dev.kiln.installer-signature.v1"}}

with the Ed25519 signature of the payload's bytes, base64, in the layer's `dev.kiln.signature`
annotation (the release key, as for SHA256SUMS). The config is the empty JSON blob `{}`. The tag
scheme is cosign's, so registries without the OCI referrers API keep signatures too; the payload
is Kiln's own, and what is checked is the same everywhere: the signature holds for a trusted key
and the payload names the very digest being installed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kiln.core.errors import InputError
from kiln.core.registry import INDEX_TYPE, MANIFEST_TYPE, Client, Ref
from kiln.signing.release import VerificationError, fingerprint

PAYLOAD_TYPE = "dev.kiln.installer-signature.v1"
LAYER_TYPE = "application/vnd.dev.kiln.signature.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
SIGNATURE_KEY = "dev.kiln.signature"
SIGNED_DIGEST_KEY = "dev.kiln.signed-digest"
PAYLOAD_LIMIT = 4096
SIGNATURE_MANIFEST_LIMIT = 64 << 10
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class SignatureArtifact:
    """The blobs and manifest that sign one digest."""

    payload: bytes
    manifest: bytes

    @property
    def tag(self) -> str:
        return signature_tag(json.loads(self.manifest)["annotations"][SIGNED_DIGEST_KEY])


def signature_tag(digest: str) -> str:
    """Where a digest's signature lives in its repository: `sha256-<hex>.sig`."""
    if not _DIGEST.fullmatch(digest):
        raise InputError(f"not a sha256 digest: {digest!r}")
    return digest.replace(":", "-") + ".sig"


def payload_for(digest: str) -> bytes:
    return _canonical({"critical": {"image": {"manifest-digest": digest}, "type": PAYLOAD_TYPE}})


def sign_digest(digest: str, key: Ed25519PrivateKey) -> SignatureArtifact:
    """The signature artifact of `digest` (deterministic: Ed25519 and canonical JSON)."""
    payload = payload_for(digest)
    signature = base64.b64encode(key.sign(payload)).decode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _descriptor(EMPTY, EMPTY_TYPE),
        "layers": [{**_descriptor(payload, LAYER_TYPE), "annotations": {SIGNATURE_KEY: signature}}],
        "annotations": {SIGNED_DIGEST_KEY: digest},
    }
    return SignatureArtifact(payload, _canonical(manifest))


def check_artifact(manifest: bytes, payload: bytes, digest: str, keys: list[Ed25519PublicKey]) -> str:
    """The fingerprint of the trusted key that signed `digest`, or a VerificationError saying why not."""
    layer = _signature_layer(manifest, digest)
    if layer["digest"] != "sha256:" + hashlib.sha256(payload).hexdigest() or layer["size"] != len(payload):
        raise VerificationError([f"signature of {digest}: the payload is not the one its manifest names"])
    try:
        signature = base64.b64decode(layer["annotations"][SIGNATURE_KEY], validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError([f"signature of {digest}: the signature annotation is not base64"]) from None
    signer = _signer(keys, signature, payload)
    if signer is None:
        raise VerificationError([f"signature of {digest} is not by a trusted key"])
    named = _payload_digest(payload, digest)
    if named != digest:
        raise VerificationError([f"signature payload names {named}, not the image {digest}"])
    return fingerprint(signer)


def push_signature(client: Client, digest: str, key: Ed25519PrivateKey) -> str:
    """Upload `digest`'s signature artifact next to it; returns the signature's tag."""
    artifact = sign_digest(digest, key)
    for blob in (EMPTY, artifact.payload):
        blob_digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        if not client.has_blob(blob_digest):
            client.upload_blob(io.BytesIO(blob), blob_digest, len(blob), "a signature blob")
    client.put_manifest(artifact.tag, artifact.manifest)
    return artifact.tag


def verify_image(reference: str, keys: list[Ed25519PublicKey]) -> list[tuple[str, str]]:
    """[(digest, signer fingerprint)] for what `HOST[:PORT]/REPO:TAG` (or `@sha256:...`) names: the
    manifest, or a release index and each architecture's manifest in it. Any unsigned one fails."""
    ref, tag = _split_reference(reference)
    client = Client(ref)
    found = client.get_manifest(tag, accept=f"{MANIFEST_TYPE}, {INDEX_TYPE}")
    if found is None:
        raise VerificationError([f"{reference}: the registry has no such image"])
    body, digest = found
    digests = [digest, *_index_members(body)]
    return [(d, _verify_one(client, d, keys)) for d in digests]


def _verify_one(client: Client, digest: str, keys: list[Ed25519PublicKey]) -> str:
    tag = signature_tag(digest)
    found = client.get_manifest(tag, limit=SIGNATURE_MANIFEST_LIMIT)
    if found is None:
        raise VerificationError([f"no signature for {digest}: the registry has no tag {tag}"])
    manifest, _ = found
    layer = _signature_layer(manifest, digest)
    with tempfile.TemporaryDirectory(prefix="kiln-sig-") as tmp:
        payload = client.get_blob(layer, Path(tmp) / "payload").read_bytes()
    return check_artifact(manifest, payload, digest, keys)


def _signature_layer(manifest: bytes, digest: str) -> dict[str, Any]:
    """The one payload layer of a signature manifest, its shape checked."""
    try:
        document = json.loads(manifest)
        [layer] = document["layers"]
        ok = (
            layer["mediaType"] == LAYER_TYPE
            and isinstance(layer["annotations"][SIGNATURE_KEY], str)
            and isinstance(layer["size"], int)
            and 0 < layer["size"] <= PAYLOAD_LIMIT
            and _DIGEST.fullmatch(layer["digest"])
        )
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise VerificationError([f"signature of {digest}: not a Kiln signature manifest (one {LAYER_TYPE} layer)"])
    return dict(layer)


def _signer(keys: list[Ed25519PublicKey], signature: bytes, payload: bytes) -> Ed25519PublicKey | None:
    for key in keys:
        try:
            key.verify(signature, payload)
            return key
        except InvalidSignature:
            continue
    return None


def _payload_digest(payload: bytes, digest: str) -> str:
    try:
        document = json.loads(payload)
        critical = document["critical"]
        if critical["type"] != PAYLOAD_TYPE:
            raise VerificationError([f"signature of {digest}: payload type {critical['type']!r} is not {PAYLOAD_TYPE}"])
        return str(critical["image"]["manifest-digest"])
    except (ValueError, KeyError, TypeError):
        raise VerificationError([f"signature of {digest}: a malformed payload"]) from None


def _index_members(body: bytes) -> list[str]:
    """The manifests a release index lists (none for a plain manifest)."""
    try:
        document = json.loads(body)
        if not isinstance(document, dict) or document.get("mediaType") != INDEX_TYPE:
            return []
        return [str(m["digest"]) for m in document["manifests"] if _DIGEST.fullmatch(str(m.get("digest", "")))]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise VerificationError(["the image's index is malformed"]) from None


def _split_reference(reference: str) -> tuple[Ref, str]:
    """`HOST[:PORT]/REPO:TAG` or `HOST[:PORT]/REPO@sha256:...` -> (repository, tag or digest)."""
    if "@" in reference:
        name, _, tag = reference.partition("@")
    else:
        head, slash, last = reference.rpartition("/")
        name_part, colon, tag = last.partition(":")
        if not slash or not colon:
            raise InputError(f"{reference}: name an image as HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:...")
        name = f"{head}/{name_part}"
    return Ref.parse(name), tag


def _descriptor(blob: bytes, media_type: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def _canonical(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
