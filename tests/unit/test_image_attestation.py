"""Installer image attestations (kiln.signing.image_attestation): a real provenance (kiln.image.provenance
over a small package tree) restated for a pushed manifest, signed in a DSSE envelope with an ECDSA P-256
key, valid against the in-toto and SLSA schemas; opened only by the key that signed it, and refused when
it names another image, carries other content, or cannot be read. The registry round trip and cosign's
own check are in tests/integration/test_release_push_cosign.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from kiln.core.errors import InputError
from kiln.image.provenance import Part
from kiln.signing import dsse
from kiln.signing.image_attestation import (
    ENVELOPE_TYPE,
    PREDICATE_KEY,
    _check_envelope,
    _envelope_layers,
    attest_digest,
    attestation_tag,
    read_provenance,
)
from kiln.signing.image_signature import SIGNATURE_KEY, key_fingerprint
from kiln.signing.release import VerificationError
from tests.unit.test_provenance import SCHEMAS, output_directory, part, written

__all__ = ["part"]  # the provenance fixture this module's tests take

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPOSITORY = "registry.example:5000/kiln/installer"


@pytest.fixture
def provenance(tmp_path: Path, part: Part) -> dict[str, Any]:
    written(output_directory(tmp_path / "edge", part.profile), part)
    return read_provenance(tmp_path / "edge" / "provenance.intoto.json")


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def statement_of(envelope: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    return payload


def test_the_attestation_is_cosigns_shape_deterministic_and_valid_slsa(
    provenance: dict[str, Any], key: ec.EllipticCurvePrivateKey
) -> None:
    artifact = attest_digest(DIGEST, REPOSITORY, provenance, key)
    assert artifact == attest_digest(DIGEST, REPOSITORY, provenance, key)  # RFC 6979: a repeated push changes nothing
    [layer] = json.loads(artifact.manifest)["layers"]
    assert layer["mediaType"] == ENVELOPE_TYPE and layer["size"] == len(artifact.payload)
    assert layer["annotations"] == {SIGNATURE_KEY: "", PREDICATE_KEY: "https://slsa.dev/provenance/v1"}
    assert json.loads(artifact.config)["rootfs"]["diff_ids"] == [layer["digest"]]
    assert attestation_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"

    statement = statement_of(artifact.payload)
    assert statement["subject"] == [{"name": REPOSITORY, "digest": {"sha256": "ab" * 32}}]
    assert statement["predicate"] == provenance["predicate"]  # the build's definition and run, unchanged
    for name, instance in (
        ("in-toto-statement-v1.schema.json", statement),
        ("slsa-provenance-v1.schema.json", statement["predicate"]),
    ):
        jsonschema.Draft202012Validator(json.loads((SCHEMAS / name).read_text())).validate(instance)

    attested = _check_envelope(artifact.payload, DIGEST, [key.public_key()])
    assert attested.signer == key_fingerprint(key.public_key())


def test_another_key_another_image_or_a_changed_statement_is_refused(
    provenance: dict[str, Any], key: ec.EllipticCurvePrivateKey
) -> None:
    envelope = attest_digest(DIGEST, REPOSITORY, provenance, key).payload
    stranger = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(VerificationError, match="not by a trusted key"):
        _check_envelope(envelope, DIGEST, [stranger])
    with pytest.raises(VerificationError, match="names other images"):
        _check_envelope(envelope, OTHER, [key.public_key()])  # a genuine attestation copied to another image

    document = json.loads(envelope)
    statement = statement_of(envelope)
    statement["predicate"]["runDetails"]["builder"]["id"] = "https://attacker.example/"
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(VerificationError, match="not by a trusted key"):
        _check_envelope(json.dumps(document).encode(), DIGEST, [key.public_key()])

    # a signature that holds over a statement that is no SLSA provenance
    other_kind = dsse.sign(json.dumps({"_type": "x", "predicateType": "x", "subject": []}).encode(), key, keyid="")
    with pytest.raises(VerificationError, match="not SLSA provenance"):
        _check_envelope(other_kind, DIGEST, [key.public_key()])
    with pytest.raises(VerificationError, match=r"not a DSSE envelope|not JSON"):
        _check_envelope(b"[]", DIGEST, [key.public_key()])


def test_attestation_manifests_are_read_with_bounds() -> None:
    layer = {"mediaType": ENVELOPE_TYPE, "digest": DIGEST, "size": dsse.MAX_ENVELOPE + 1}
    with pytest.raises(VerificationError, match="an envelope of"):
        _envelope_layers(json.dumps({"schemaVersion": 2, "layers": [layer]}).encode(), DIGEST)
    with pytest.raises(VerificationError, match="at most 16 layers"):
        _envelope_layers(json.dumps({"schemaVersion": 2, "layers": [layer] * 17}).encode(), DIGEST)
    with pytest.raises(VerificationError, match=r"has no application/vnd\.dsse"):
        _envelope_layers(json.dumps({"schemaVersion": 2, "layers": [{**layer, "mediaType": "x"}]}).encode(), DIGEST)


def test_a_provenance_that_is_not_slsa_is_refused_before_anything_is_pushed(tmp_path: Path) -> None:
    cases = {
        "not-json": b"{",
        "not-in-toto": b'{"_type": "x"}',
        "not-slsa": json.dumps({"_type": "https://in-toto.io/Statement/v1", "predicateType": "x"}).encode(),
    }
    for name, body in cases.items():
        (tmp_path / name).write_bytes(body)
        with pytest.raises(InputError, match=rf"{name}: not"):
            read_provenance(tmp_path / name)
    with pytest.raises(InputError, match="missing: missing"):
        read_provenance(tmp_path / "missing")
    (tmp_path / "linked").symlink_to(tmp_path / "not-slsa")
    with pytest.raises(InputError, match="a symbolic link is not followed"):
        read_provenance(tmp_path / "linked")
    with pytest.raises(InputError, match="not a sha256 digest"):
        attestation_tag("sha256:short")
