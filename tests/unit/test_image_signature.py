"""Installer image signatures without a registry: cosign's simple-signing artifact as Kiln writes it,
every way checking it fails, the first Kiln format kept for one release, and the golden fixture
machined's Go tests verify."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kiln.core.errors import InputError
from kiln.core.registry import INDEX_TYPE
from kiln.signing import image_signature_v1 as v1
from kiln.signing.image_signature import (
    CONFIG_TYPE,
    LAYER_TYPE,
    PAYLOAD_LIMIT,
    SIGNATURE_KEY,
    _index_members,
    check_layer,
    key_fingerprint,
    load_private_key,
    load_public_key,
    payload_for,
    sign_digest,
    signature_config,
    signature_layers,
    signature_tag,
)
from kiln.signing.release import VerificationError, fingerprint
from tests.unit import cosign_golden

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPO = "registry.example:5000/kiln/installer"
KEY = cosign_golden.golden_key()
STRANGER = ec.derive_private_key(12345, ec.SECP256R1())
ED_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def check(manifest: bytes, payload: bytes, keys: list[Any], digest: str = DIGEST) -> str:
    """What a verifier does with one fetched manifest and payload."""
    [layer] = signature_layers(manifest, digest)
    return check_layer(layer, payload, digest, keys)


def resigned(manifest: bytes, payload: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The manifest with its one layer naming `payload`, signed by `key`."""
    document = json.loads(manifest)
    signature = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    document["layers"][0].update(
        digest="sha256:" + hashlib.sha256(payload).hexdigest(),
        size=len(payload),
        annotations={SIGNATURE_KEY: signature},
    )
    return json.dumps(document).encode()


def test_the_artifact_is_cosigns_simple_signing_and_deterministic() -> None:
    first, second = sign_digest(DIGEST, REPO, KEY), sign_digest(DIGEST, REPO, KEY)
    assert first == second  # RFC 6979: a repeated push writes the same signature manifest
    assert json.loads(first.payload) == {
        "critical": {
            "identity": {"docker-reference": REPO},
            "image": {"docker-manifest-digest": DIGEST},
            "type": "cosign container image signature",
        },
        "optional": {"creator": "Kiln"},
    }
    manifest = json.loads(first.manifest)
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"] == {
        "mediaType": CONFIG_TYPE,
        "digest": "sha256:" + hashlib.sha256(first.config).hexdigest(),
        "size": len(first.config),
    }
    config = json.loads(first.config)
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(first.payload).hexdigest()]}
    [layer] = manifest["layers"]
    assert layer["mediaType"] == LAYER_TYPE == "application/vnd.dev.cosign.simplesigning.v1+json"
    assert list(layer["annotations"]) == ["dev.cosignproject.cosign/signature"]
    signature = base64.b64decode(layer["annotations"][SIGNATURE_KEY])
    KEY.public_key().verify(signature, first.payload, ec.ECDSA(hashes.SHA256()))  # what cosign checks
    assert check(first.manifest, first.payload, [KEY.public_key()]) == key_fingerprint(KEY.public_key())
    assert signature_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"


def test_another_key_another_digest_and_a_changed_payload_fail() -> None:
    artifact = sign_digest(DIGEST, REPO, KEY)
    with pytest.raises(VerificationError, match="is not by a trusted key"):
        check(artifact.manifest, artifact.payload, [STRANGER.public_key(), ED_KEY.public_key()])
    moved = sign_digest(OTHER, REPO, KEY)
    with pytest.raises(VerificationError, match=f"names {OTHER}, not the image {DIGEST}"):
        check(moved.manifest, moved.payload, [KEY.public_key()])
    with pytest.raises(VerificationError, match="payload is not the one its manifest names"):
        check(artifact.manifest, payload_for(OTHER, REPO), [KEY.public_key()])
    tampered = artifact.payload.replace(DIGEST.encode(), OTHER.encode())
    spoiled = json.loads(artifact.manifest)
    spoiled["layers"][0].update(digest="sha256:" + hashlib.sha256(tampered).hexdigest())
    with pytest.raises(VerificationError, match="is not by a trusted key"):  # same size, its signature fails
        check(json.dumps(spoiled).encode(), tampered, [KEY.public_key()])


def test_any_trusted_key_serves_and_the_repository_named_is_not_checked() -> None:
    mirror = sign_digest(DIGEST, "mirror.example/elsewhere", KEY)
    keys = [STRANGER.public_key(), ED_KEY.public_key(), KEY.public_key()]
    assert check(mirror.manifest, mirror.payload, keys) == key_fingerprint(KEY.public_key())


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (
            b'{"critical":{"identity":{"docker-reference":"r"},"image":{"docker-manifest-digest":"%s"},"type":"x"}}',
            "type 'x'",
        ),
        (
            b'{"critical":{"image":{"docker-manifest-digest":"%s"},"type":"cosign container image signature"}}',
            "malformed",
        ),
        (b'{"critical":{"identity":{"docker-reference":"r"},"image":{"manifest-digest":"%s"}}}', "malformed"),
        (b"not json %s", "malformed"),
    ],
)
def test_payloads_signed_by_the_key_but_wrong_are_refused(payload: bytes, match: str) -> None:
    body = payload.replace(b"%s", DIGEST.encode())
    manifest = resigned(sign_digest(DIGEST, REPO, KEY).manifest, body, KEY)
    with pytest.raises(VerificationError, match=match):
        check(manifest, body, [KEY.public_key()])


def test_a_payload_naming_a_non_digest_is_named_safely() -> None:
    body = payload_for(DIGEST, REPO).replace(DIGEST.encode(), b"../../x")
    with pytest.raises(VerificationError, match=r"names '\.\./\.\./x', not the image"):
        check(resigned(sign_digest(DIGEST, REPO, KEY).manifest, body, KEY), body, [KEY.public_key()])


def test_an_ed25519_key_verifies_a_cosign_payload_it_signed() -> None:
    """skopeo and cosign's key loader take an Ed25519 PEM too (pure Ed25519 over the payload)."""
    artifact = sign_digest(DIGEST, REPO, KEY)
    document = json.loads(artifact.manifest)
    document["layers"][0]["annotations"][SIGNATURE_KEY] = base64.b64encode(ED_KEY.sign(artifact.payload)).decode()
    assert check(json.dumps(document).encode(), artifact.payload, [ED_KEY.public_key()]) == fingerprint(
        ED_KEY.public_key()
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.update(layers=[]), "has no application/vnd.dev.cosign.simplesigning.v1\\+json layer"),
        (lambda m: m.update(layers=m["layers"] * 17), "at most 16 layers"),
        (lambda m: m.update(schemaVersion=1), "not an image manifest"),
        (lambda m: m["layers"][0].update(mediaType="application/octet-stream"), "has no application"),
        (lambda m: m["layers"][0].update(size=PAYLOAD_LIMIT + 1), "a payload of 4097 bytes, want 1 to 4096"),
        (lambda m: m["layers"][0].update(size="266"), "a payload of '266' bytes"),
        (lambda m: m["layers"][0].update(digest="sha256:../x"), "a payload of"),
        (lambda m: m["layers"][0]["annotations"].pop(SIGNATURE_KEY), "without a usable"),
        (lambda m: m["layers"][0]["annotations"].update({SIGNATURE_KEY: "A" * 513}), "without a usable"),
        (lambda m: m["layers"][0].update(annotations=["x"]), "without a usable"),
    ],
)
def test_malformed_signature_manifests_are_refused(change: Any, match: str) -> None:
    manifest = json.loads(sign_digest(DIGEST, REPO, KEY).manifest)
    change(manifest)
    with pytest.raises(VerificationError, match=match):
        signature_layers(json.dumps(manifest).encode(), DIGEST)


def test_other_layers_beside_a_signature_are_skipped() -> None:
    """cosign may hold attestations or other signers' layers too: only simple-signing layers are read."""
    manifest = json.loads(sign_digest(DIGEST, REPO, KEY).manifest)
    manifest["layers"].insert(0, {"mediaType": "application/vnd.dsse.envelope.v1+json", "size": 9, "digest": "x"})
    [layer] = signature_layers(json.dumps(manifest).encode(), DIGEST)
    assert layer["mediaType"] == LAYER_TYPE


def test_a_non_base64_signature_and_a_bad_digest() -> None:
    artifact = sign_digest(DIGEST, REPO, KEY)
    manifest = json.loads(artifact.manifest)
    manifest["layers"][0]["annotations"][SIGNATURE_KEY] = "not base64!"
    with pytest.raises(VerificationError, match="not base64"):
        check(json.dumps(manifest).encode(), artifact.payload, [KEY.public_key()])
    with pytest.raises(InputError, match="not a sha256 digest"):
        signature_tag("sha256:xyz")


def test_fingerprints_name_ecdsa_keys_by_their_der() -> None:
    public = KEY.public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key_fingerprint(public) == hashlib.sha256(der).hexdigest()[:16]
    assert key_fingerprint(ED_KEY.public_key()) == fingerprint(ED_KEY.public_key())


def test_key_files_of_the_wrong_type_are_input_errors(tmp_path: Path) -> None:
    pem = serialization.Encoding.PEM
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    pkcs8 = serialization.PrivateFormat.PKCS8
    (tmp_path / "p384.pub").write_bytes(ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(pem, spki))
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    (tmp_path / "rsa.pub").write_bytes(rsa_key.public_key().public_bytes(pem, spki))
    for name in ("p384.pub", "rsa.pub"):
        with pytest.raises(InputError, match="not an ECDSA P-256 or Ed25519 public key"):
            load_public_key(tmp_path / name)
    ed = tmp_path / "ed.key"
    ed.write_bytes(ED_KEY.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    ed.chmod(0o600)
    with pytest.raises(InputError, match="not an ECDSA P-256 key"):
        load_private_key(ed)
    with pytest.raises(InputError, match="--add-missing"):
        load_private_key(tmp_path / "release-image.key")


@pytest.mark.parametrize("body", [b"not json", b'{"mediaType": "%s", "manifests": 7}' % INDEX_TYPE.encode()])
def test_a_malformed_index_is_a_verification_error(body: bytes) -> None:
    with pytest.raises(VerificationError, match="index is malformed"):
        _index_members(body)


def test_a_plain_manifest_has_no_members() -> None:
    assert _index_members(b'{"mediaType": "application/vnd.oci.image.manifest.v1+json"}') == []


# The first Kiln format, read and written for one release


def test_the_first_format_is_unchanged_and_recognised() -> None:
    artifact = v1.sign_digest(DIGEST, ED_KEY)
    assert artifact == v1.sign_digest(DIGEST, ED_KEY)
    assert artifact.payload == (
        b'{"critical":{"image":{"manifest-digest":"%s"},"type":"dev.kiln.installer-signature.v1"}}' % DIGEST.encode()
    )
    assert v1.is_v1(artifact.manifest) and not v1.is_v1(sign_digest(DIGEST, REPO, KEY).manifest)
    assert v1.check_artifact(artifact.manifest, artifact.payload, DIGEST, [ED_KEY.public_key()]) == fingerprint(
        ED_KEY.public_key()
    )
    stranger = Ed25519PrivateKey.from_private_bytes(bytes(32)).public_key()
    with pytest.raises(VerificationError, match="is not by a trusted key"):
        v1.check_artifact(artifact.manifest, artifact.payload, DIGEST, [stranger])
    with pytest.raises(VerificationError, match="not a Kiln signature manifest"):
        v1.signature_layer(sign_digest(DIGEST, REPO, KEY).manifest, DIGEST)


# The fixture machined's Go tests verify


def test_the_go_fixture_is_what_the_python_side_writes() -> None:
    """runtime/machined/internal/oci/testdata/cosign/ holds today's bytes (`python -m tests.unit.cosign_golden`)."""
    for name, data in cosign_golden.golden_files().items():
        assert (cosign_golden.GOLDEN / name).read_bytes() == data, f"{name}: run python -m tests.unit.cosign_golden"
    manifest = (cosign_golden.GOLDEN / "manifest.json").read_bytes()
    payload = (cosign_golden.GOLDEN / "payload.json").read_bytes()
    key = load_public_key(cosign_golden.GOLDEN / "key.pub")
    assert (
        check(manifest, payload, [key], cosign_golden.DIGEST)
        == (cosign_golden.GOLDEN / "fingerprint").read_text().strip()
    )


def test_a_signature_cosign_made_verifies_and_its_config_is_the_one_kiln_writes() -> None:
    """runtime/machined/internal/oci/testdata/cosign-made: `cosign sign --key` (cosign 2.5) over a pushed installer."""
    made = cosign_golden.GOLDEN.parent / "cosign-made"
    payload = (made / "payload.json").read_bytes()
    assert (made / "config.json").read_bytes() == signature_config(payload)  # byte for byte
    digest = (made / "digest").read_text().strip()
    key = load_public_key(made / "key.pub")
    assert check((made / "manifest.json").read_bytes(), payload, [key], digest) == key_fingerprint(key)
    assert json.loads(payload)["optional"] is None  # cosign's, without annotations: accepted as well
