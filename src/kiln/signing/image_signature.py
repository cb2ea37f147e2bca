"""Signatures of installer images in a registry, in sigstore's "simple signing" format as cosign
writes it with a key: what `kiln release push --sign` writes, what `kiln verify IMAGE` and machined
check, and what `cosign verify --key` and skopeo (a sigstoreSigned policy) check with the public key
alone (docs/release-signing.md).

The signed thing is an image manifest's digest D (each architecture's manifest; a multi-arch
release's index is signed too). In the same repository, the tag `sha256-<hex of D>.sig` names an
OCI image manifest whose layers are signatures, each of media type
`application/vnd.dev.cosign.simplesigning.v1+json`: its blob is the payload

    {"critical":{"identity":{"docker-reference":"HOST/REPO"},"image":{"docker-manifest-digest":"<D>"},
     "type":"cosign container image signature"},"optional":{"creator":"Kiln"}}

and its `dev.cosignproject.cosign/signature` annotation the base64 signature of the payload's bytes:
ECDSA P-256 over SHA-256 (ASN.1 DER), made with the key directory's release-image.key. The config is
the image config cosign writes, naming the payload as its one diff_id. Kiln writes one layer; cosign
appends one per `cosign sign`, so a verifier takes the first layer that holds for a trusted key.

The docker-reference is the repository pushed to, as cosign writes it. Kiln's verifiers ignore it, as
cosign does (a mirror under another name verifies the same); skopeo compares it with its policy's
signedIdentity. Signing uses RFC 6979 deterministic ECDSA, so the same key and digest give the same
signature manifest and a repeated push changes no tag.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kiln.core.errors import InputError
from kiln.core.registry import INDEX_TYPE, MANIFEST_TYPE, Client, Ref
from kiln.signing.dsse import holds
from kiln.signing.keyset import KeySet
from kiln.signing.release import VerificationError, fingerprint, read_key_file

LAYER_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SIGNATURE_KEY = "dev.cosignproject.cosign/signature"
PAYLOAD_TYPE = "cosign container image signature"
CREATOR = "Kiln"
FORMAT = "cosign"
PAYLOAD_LIMIT = 4096  # bytes of one payload a verifier fetches; Kiln's are about 250
SIGNATURE_LIMIT = 512  # characters of a signature annotation: an ECDSA P-256 one is at most 96
LAYER_LIMIT = 16  # signatures in one manifest a verifier looks at
SIGNATURE_MANIFEST_LIMIT = 64 << 10
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

PublicKey = Ed25519PublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True)
class SignatureArtifact:
    """The blobs and manifest that sign one digest."""

    payload: bytes
    config: bytes
    manifest: bytes

    @property
    def blobs(self) -> tuple[bytes, ...]:
        return (self.config, self.payload)


@dataclass(frozen=True)
class Verified:
    """One digest whose signature held: by which key (fingerprint), in which format."""

    digest: str
    signer: str
    format: str = FORMAT


def signature_tag(digest: str) -> str:
    """Where a digest's signature lives in its repository: `sha256-<hex>.sig`."""
    if not DIGEST.fullmatch(digest):
        raise InputError(f"not a sha256 digest: {digest!r}")
    return digest.replace(":", "-") + ".sig"


def payload_for(digest: str, repository: str) -> bytes:
    """The simple-signing payload naming `digest` in `repository` (HOST[:PORT]/REPO)."""
    critical = {
        "identity": {"docker-reference": repository},
        "image": {"docker-manifest-digest": digest},
        "type": PAYLOAD_TYPE,
    }
    return canonical({"critical": critical, "optional": {"creator": CREATOR}})


def signature_config(payload: bytes) -> bytes:
    """The image config of a signature manifest, the shape cosign gives it: zero times, the payload as its one layer."""
    config = {
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": [_sha256(payload)]},
        "config": {},
    }
    return json.dumps(config, separators=(",", ":")).encode()


def sign_digest(digest: str, repository: str, key: ec.EllipticCurvePrivateKey) -> SignatureArtifact:
    """The signature artifact of `digest` (deterministic: RFC 6979 ECDSA and canonical JSON)."""
    payload = payload_for(digest, repository)
    signature = key.sign(payload, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    return one_layer_artifact(payload, LAYER_TYPE, {SIGNATURE_KEY: base64.b64encode(signature).decode()})


def one_layer_artifact(payload: bytes, media_type: str, annotations: dict[str, str]) -> SignatureArtifact:
    """The manifest cosign writes for a signature or an attestation: `payload` its one layer, annotated."""
    config = signature_config(payload)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(config, CONFIG_TYPE),
        "layers": [{**descriptor(payload, media_type), "annotations": annotations}],
    }
    return SignatureArtifact(payload, config, canonical(manifest))


def push_signature(client: Client, digest: str, key: ec.EllipticCurvePrivateKey) -> str:
    """Upload `digest`'s signature artifact next to it; returns the signature's tag."""
    artifact = sign_digest(digest, f"{client.ref.host}/{client.ref.repo}", key)
    return put_artifact(client, signature_tag(digest), artifact.blobs, artifact.manifest)


def put_artifact(client: Client, tag: str, blobs: tuple[bytes, ...], manifest: bytes) -> str:
    """Upload a signature's (or attestation's) blobs that the registry lacks, then its manifest under `tag`."""
    for blob in blobs:
        if not client.has_blob(_sha256(blob)):
            client.upload_blob(io.BytesIO(blob), _sha256(blob), len(blob), "a signature blob")
    client.put_manifest(tag, manifest)
    return tag


def typed_layers(manifest: bytes, media_type: str, what: str) -> list[dict[str, Any]]:
    """The layers of `media_type` in a signature's (or attestation's) manifest of at most LAYER_LIMIT layers,
    unchecked beyond that; `what` ("signature of sha256:...") begins each error."""
    try:
        document = json.loads(manifest)
        layers = document["layers"]
        ok = document["schemaVersion"] == 2 and isinstance(layers, list) and len(layers) <= LAYER_LIMIT
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise VerificationError([f"{what}: not an image manifest of at most {LAYER_LIMIT} layers"])
    found = [dict(layer) for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == media_type]
    if not found:
        raise VerificationError([f"{what}: the manifest has no {media_type} layer"])
    return found


def signature_layers(manifest: bytes, digest: str) -> list[dict[str, Any]]:
    """The simple-signing layers of a signature manifest, each one's shape checked; other layers are skipped."""
    found = typed_layers(manifest, LAYER_TYPE, f"signature of {digest}")
    for layer in found:
        annotations = layer.get("annotations")
        size, text = layer.get("size"), annotations.get(SIGNATURE_KEY) if isinstance(annotations, dict) else None
        if not (isinstance(size, int) and 0 < size <= PAYLOAD_LIMIT and DIGEST.fullmatch(str(layer.get("digest")))):
            raise VerificationError([f"signature of {digest}: a payload of {size!r} bytes, want 1 to {PAYLOAD_LIMIT}"])
        if not isinstance(text, str) or not 0 < len(text) <= SIGNATURE_LIMIT:
            raise VerificationError([f"signature of {digest}: a layer without a usable {SIGNATURE_KEY} annotation"])
    return found


def check_layer(layer: dict[str, Any], payload: bytes, digest: str, keys: list[PublicKey]) -> str:
    """The fingerprint of the trusted key whose signature in `layer` holds over `payload`, a payload that
    names `digest`; a VerificationError saying why not otherwise."""
    return check_signed_layer(layer, payload, digest, keys, SIGNATURE_KEY, _payload_digest)


def check_signed_layer(
    layer: dict[str, Any],
    payload: bytes,
    digest: str,
    keys: Sequence[PublicKey],
    annotation: str,
    payload_digest: Callable[[bytes, str], str],
) -> str:
    """The check both signature formats make, each with its own annotation and payload reader: the payload
    is the layer's, the base64 signature in `annotation` is a trusted key's, the payload names `digest`.
    The signature is checked before the payload is read."""
    if layer["digest"] != _sha256(payload) or layer["size"] != len(payload):
        raise VerificationError([f"signature of {digest}: the payload is not the one its manifest names"])
    try:
        signature = base64.b64decode(layer["annotations"][annotation], validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError([f"signature of {digest}: the signature annotation is not base64"]) from None
    signer = next((key for key in keys if holds(key, signature, payload)), None)
    if signer is None:
        raise VerificationError([f"signature of {digest} is not by a trusted key"])
    named = payload_digest(payload, digest)
    if named != digest:
        raise VerificationError([f"signature payload names {named}, not the image {digest}"])
    return key_fingerprint(signer)


def verify_image(reference: str, keys: list[PublicKey]) -> list[Verified]:
    """What `HOST[:PORT]/REPO:TAG` (or `@sha256:...`) names, each digest verified: the manifest, or a release
    index and each architecture's manifest in it. Any unsigned one fails."""
    ref, tag = split_reference(reference)
    client = Client(ref)
    found = client.get_manifest(tag, accept=f"{MANIFEST_TYPE}, {INDEX_TYPE}")
    if found is None:
        raise VerificationError([f"{reference}: the registry has no such image"])
    body, digest = found
    return [verify_digest(client, d, keys) for d in [digest, *_index_members(body)]]


def verify_digest(client: Client, digest: str, keys: list[PublicKey]) -> Verified:
    """The signature of one digest in the client's repository, in this format or the first Kiln one."""
    tag = signature_tag(digest)
    found = client.get_manifest(tag, limit=SIGNATURE_MANIFEST_LIMIT)
    if found is None:
        raise VerificationError([f"no signature for {digest}: the registry has no tag {tag}"])
    manifest, _ = found
    from kiln.signing import image_signature_v1 as v1

    if v1.is_v1(manifest):
        return _verify_v1(client, manifest, digest, keys)
    layers = signature_layers(manifest, digest)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kiln-sig-") as tmp:
        for number, layer in enumerate(layers):
            payload = client.get_blob(layer, Path(tmp) / f"payload-{number}").read_bytes()
            try:
                return Verified(digest, check_layer(layer, payload, digest, keys))
            except VerificationError as exc:
                problems += exc.problems
    if len(layers) > 1:
        problems.insert(0, f"none of the {len(layers)} signatures of {digest} holds:")
    raise VerificationError(problems)


def _verify_v1(client: Client, manifest: bytes, digest: str, keys: list[PublicKey]) -> Verified:
    from kiln.signing import image_signature_v1 as v1

    ed25519 = [key for key in keys if isinstance(key, Ed25519PublicKey)]
    if not ed25519:
        raise VerificationError(
            [f"signature of {digest} is in the first Kiln format, which only an Ed25519 key (release.pub) checks"]
        )
    layer = v1.signature_layer(manifest, digest)
    with tempfile.TemporaryDirectory(prefix="kiln-sig-") as tmp:
        payload = client.get_blob(layer, Path(tmp) / "payload").read_bytes()
    return Verified(digest, v1.check_artifact(manifest, payload, digest, ed25519), v1.FORMAT)


def key_fingerprint(key: PublicKey) -> str:
    """How messages name a key: for Ed25519 the release key's fingerprint (its 32 raw bytes hashed); for
    ECDSA the sha256 of its DER SubjectPublicKeyInfo; the first 16 hex digits either way (machined's too)."""
    if isinstance(key, Ed25519PublicKey):
        return fingerprint(key)
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


def load_public_key(path: Path) -> PublicKey:
    """An image release public key in `path` (PEM SubjectPublicKeyInfo): ECDSA P-256 (release-image.pub)
    or Ed25519 (release.pub, for images signed in the first Kiln format)."""
    data = read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not a PEM public key ({exc})") from None
    if isinstance(key, Ed25519PublicKey) or (
        isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1)
    ):
        return key
    raise InputError(f"{path}: not an ECDSA P-256 or Ed25519 public key (release-image.pub is ECDSA P-256)")


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The image release key in `path` (PKCS#8 PEM, ECDSA P-256), after KeySet's owner-only check."""
    if not path.exists() and not path.is_symlink():
        raise InputError(
            f"{path}: missing: key directories made before the image release key existed lack it; "
            f"`kiln keys generate {path.parent} --add-missing` adds it"
        )
    KeySet(path.parent).require(path, private=True)
    data = read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(f"{path}: not an ECDSA P-256 key (the image release key is ECDSA P-256)")
    return key


def _payload_digest(payload: bytes, digest: str) -> str:
    """The digest a payload names, after its type and shape are checked."""
    try:
        critical = json.loads(payload)["critical"]
        kind, named = critical["type"], critical["image"]["docker-manifest-digest"]
        if not isinstance(critical["identity"]["docker-reference"], str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise VerificationError([f"signature of {digest}: a malformed payload"]) from None
    if kind != PAYLOAD_TYPE:
        raise VerificationError([f"signature of {digest}: payload type {kind!r} is not {PAYLOAD_TYPE!r}"])
    return named if isinstance(named, str) and DIGEST.fullmatch(named) else repr(named)


def _index_members(body: bytes) -> list[str]:
    """The manifests a release index lists (none for a plain manifest)."""
    try:
        document = json.loads(body)
        if not isinstance(document, dict) or document.get("mediaType") != INDEX_TYPE:
            return []
        return [str(m["digest"]) for m in document["manifests"] if DIGEST.fullmatch(str(m.get("digest", "")))]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise VerificationError(["the image's index is malformed"]) from None


def split_reference(reference: str) -> tuple[Ref, str]:
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


def descriptor(blob: bytes, media_type: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _sha256(blob), "size": len(blob)}


def canonical(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _sha256(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()
