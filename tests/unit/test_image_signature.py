"""Installer image signatures without a registry: the artifact's bytes and every way checking it fails."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kiln.core.errors import InputError
from kiln.core.registry import INDEX_TYPE
from kiln.signing.image_signature import (
    LAYER_TYPE,
    PAYLOAD_TYPE,
    SIGNATURE_KEY,
    _index_members,
    check_artifact,
    payload_for,
    sign_digest,
    signature_tag,
)
from kiln.signing.release import VerificationError, fingerprint

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def test_the_artifact_is_deterministic_and_checks() -> None:
    first, second = sign_digest(DIGEST, KEY), sign_digest(DIGEST, KEY)
    assert first == second
    assert first.payload == (
        b'{"critical":{"image":{"manifest-digest":"%s"},"type":"%s"}}' % (DIGEST.encode(), PAYLOAD_TYPE.encode())
    )
    assert first.tag == "sha256-" + "ab" * 32 + ".sig" == signature_tag(DIGEST)
    manifest = json.loads(first.manifest)
    [layer] = manifest["layers"]
    assert layer["mediaType"] == LAYER_TYPE and layer["digest"] == "sha256:" + hashlib.sha256(first.payload).hexdigest()
    assert check_artifact(first.manifest, first.payload, DIGEST, [KEY.public_key()]) == fingerprint(KEY.public_key())


def test_another_key_another_digest_and_a_changed_payload_fail() -> None:
    artifact = sign_digest(DIGEST, KEY)
    stranger = Ed25519PrivateKey.from_private_bytes(bytes(32)).public_key()
    with pytest.raises(VerificationError, match="is not by a trusted key"):
        check_artifact(artifact.manifest, artifact.payload, DIGEST, [stranger])
    moved = sign_digest(OTHER, KEY)
    with pytest.raises(VerificationError, match=f"names {OTHER}, not the image {DIGEST}"):
        check_artifact(moved.manifest, moved.payload, DIGEST, [KEY.public_key()])
    with pytest.raises(VerificationError, match="payload is not the one its manifest names"):
        check_artifact(artifact.manifest, payload_for(OTHER), DIGEST, [KEY.public_key()])


def test_a_wrong_payload_type_signed_by_the_key_is_refused() -> None:
    payload = b'{"critical":{"image":{"manifest-digest":"%s"},"type":"other"}}' % DIGEST.encode()
    manifest = json.loads(sign_digest(DIGEST, KEY).manifest)
    manifest["layers"][0].update(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    manifest["layers"][0]["annotations"][SIGNATURE_KEY] = base64.b64encode(KEY.sign(payload)).decode()
    with pytest.raises(VerificationError, match="payload type 'other'"):
        check_artifact(json.dumps(manifest).encode(), payload, DIGEST, [KEY.public_key()])


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(layers=[]),
        lambda m: m.update(layers=m["layers"] * 2),
        lambda m: m["layers"][0].update(mediaType="application/octet-stream"),
        lambda m: m["layers"][0].update(size=1 << 20),
        lambda m: m["layers"][0]["annotations"].pop(SIGNATURE_KEY),
    ],
)
def test_malformed_signature_manifests_are_refused(change: object) -> None:
    artifact = sign_digest(DIGEST, KEY)
    manifest = json.loads(artifact.manifest)
    change(manifest)  # type: ignore[operator]
    with pytest.raises(VerificationError, match="not a Kiln signature manifest"):
        check_artifact(json.dumps(manifest).encode(), artifact.payload, DIGEST, [KEY.public_key()])


def test_a_non_base64_signature_and_a_bad_digest() -> None:
    artifact = sign_digest(DIGEST, KEY)
    manifest = json.loads(artifact.manifest)
    manifest["layers"][0]["annotations"][SIGNATURE_KEY] = "not base64!"
    with pytest.raises(VerificationError, match="not base64"):
        check_artifact(json.dumps(manifest).encode(), artifact.payload, DIGEST, [KEY.public_key()])
    with pytest.raises(InputError, match="not a sha256 digest"):
        signature_tag("sha256:xyz")


@pytest.mark.parametrize("body", [b"not json", b'{"mediaType": "%s", "manifests": 7}' % INDEX_TYPE.encode()])
def test_a_malformed_index_is_a_verification_error(body: bytes) -> None:
    with pytest.raises(VerificationError, match="index is malformed"):
        _index_members(body)


def test_a_plain_manifest_has_no_members() -> None:
    assert _index_members(b'{"mediaType": "application/vnd.oci.image.manifest.v1+json"}') == []
