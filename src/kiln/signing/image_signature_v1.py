"""The first Kiln format of installer image signatures, kept for one release: what machined before
Kiln 0.2 checks, so `kiln release push --sign KEYDIR --signature-format kiln-v1` can sign the release
that moves such a fleet on, and `kiln verify IMAGE` still reads images signed this way. machined
refuses it from Kiln 0.3.0 (docs/release-signing.md).

The tag is the same as cosign's (`sha256-<hex>.sig`); the manifest's config is the empty blob `{}`,
its one layer (`application/vnd.dev.kiln.signature.v1+json`) is the canonical JSON payload

    {"critical":{"image":{"manifest-digest":"<D>"},"type":"dev.kiln.installer-signature.v1"}}

and the layer's `dev.kiln.signature` annotation is the Ed25519 signature of it (release.key), base64.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kiln.core.registry import MANIFEST_TYPE, Client
from kiln.signing.image_signature import (
    DIGEST,
    PAYLOAD_LIMIT,
    canonical,
    check_signed_layer,
    descriptor,
    put_artifact,
    signature_tag,
)
from kiln.signing.release import VerificationError

PAYLOAD_TYPE = "dev.kiln.installer-signature.v1"
LAYER_TYPE = "application/vnd.dev.kiln.signature.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
SIGNATURE_KEY = "dev.kiln.signature"
SIGNED_DIGEST_KEY = "dev.kiln.signed-digest"
FORMAT = "kiln-v1"


@dataclass(frozen=True)
class SignatureArtifact:
    """The blobs and manifest that sign one digest."""

    payload: bytes
    manifest: bytes

    @property
    def blobs(self) -> tuple[bytes, ...]:
        return (EMPTY, self.payload)


def payload_for(digest: str) -> bytes:
    return canonical({"critical": {"image": {"manifest-digest": digest}, "type": PAYLOAD_TYPE}})


def sign_digest(digest: str, key: Ed25519PrivateKey) -> SignatureArtifact:
    """The signature artifact of `digest` (deterministic: Ed25519 and canonical JSON)."""
    payload = payload_for(digest)
    signature = base64.b64encode(key.sign(payload)).decode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(EMPTY, EMPTY_TYPE),
        "layers": [{**descriptor(payload, LAYER_TYPE), "annotations": {SIGNATURE_KEY: signature}}],
        "annotations": {SIGNED_DIGEST_KEY: digest},
    }
    return SignatureArtifact(payload, canonical(manifest))


def push_signature(client: Client, digest: str, key: Ed25519PrivateKey) -> str:
    """Upload `digest`'s signature in this format next to it; returns the signature's tag."""
    artifact = sign_digest(digest, key)
    return put_artifact(client, signature_tag(digest), artifact.blobs, artifact.manifest)


def is_v1(manifest: bytes) -> bool:
    """Whether a signature manifest is in this format: a layer of it is this format's payload (machined's test too)."""
    try:
        layers = json.loads(manifest)["layers"]
        return any(isinstance(layer, dict) and layer.get("mediaType") == LAYER_TYPE for layer in layers)
    except (ValueError, KeyError, TypeError):
        return False


def check_artifact(manifest: bytes, payload: bytes, digest: str, keys: list[Ed25519PublicKey]) -> str:
    """The fingerprint of the trusted key that signed `digest`, or a VerificationError saying why not."""
    layer = signature_layer(manifest, digest)
    return check_signed_layer(layer, payload, digest, keys, SIGNATURE_KEY, _payload_digest)


def signature_layer(manifest: bytes, digest: str) -> dict[str, Any]:
    """The one payload layer of a signature manifest, its shape checked."""
    try:
        document = json.loads(manifest)
        [layer] = document["layers"]
        ok = (
            layer["mediaType"] == LAYER_TYPE
            and isinstance(layer["annotations"][SIGNATURE_KEY], str)
            and isinstance(layer["size"], int)
            and 0 < layer["size"] <= PAYLOAD_LIMIT
            and DIGEST.fullmatch(layer["digest"])
        )
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise VerificationError([f"signature of {digest}: not a Kiln signature manifest (one {LAYER_TYPE} layer)"])
    return dict(layer)


def _payload_digest(payload: bytes, digest: str) -> str:
    try:
        document = json.loads(payload)
        critical = document["critical"]
        if critical["type"] != PAYLOAD_TYPE:
            raise VerificationError([f"signature of {digest}: payload type {critical['type']!r} is not {PAYLOAD_TYPE}"])
        return str(critical["image"]["manifest-digest"])
    except (ValueError, KeyError, TypeError):
        raise VerificationError([f"signature of {digest}: a malformed payload"]) from None
