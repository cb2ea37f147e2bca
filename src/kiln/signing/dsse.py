"""DSSE envelopes (Dead Simple Signing Envelope v1) signed with the release key: how a provenance is signed.

An envelope is JSON: `payloadType`, `payload` (the signed bytes, base64) and `signatures`, each
a `sig` (base64) with a `keyid` hint. What is signed is not the payload alone but its
pre-authentication encoding, `DSSEv1 <len(type)> <type> <len(payload)> <payload>` (lengths in
ASCII decimal), so a signature over one payload type can never be passed off as one over another.
A release directory's provenance is signed with the release key (Ed25519), an installer image's
attestation with the image release key (ECDSA P-256, RFC 6979); both are deterministic, so the same
key and payload give the same envelope. cosign (`verify-blob-attestation`, `verify-attestation`) and
in-toto's tools read the same format.

Opening an envelope trusts nothing in it before a signature verifies: its size is bounded, its
fields checked, and the payload returned only once the key's signature over the encoding holds.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

IN_TOTO = "application/vnd.in-toto+json"
MAX_ENVELOPE = 16 << 20  # bytes of an envelope a verifier reads: a provenance is a few hundred KiB
MAX_SIGNATURES = 16

PrivateKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = Ed25519PublicKey | ec.EllipticCurvePublicKey


class EnvelopeError(Exception):
    """Why an envelope was not opened, in a phrase; callers put the file's name before it."""


class NotSigned(EnvelopeError):
    """A well-formed envelope with no signature by the key: the payload changed, or another key signed it."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """The pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign(payload: bytes, key: PrivateKey, keyid: str, payload_type: str = IN_TOTO) -> bytes:
    """The envelope over `payload`, as one line of JSON with its newline (a JSON Lines file of one);
    `keyid` is a hint for verifiers holding several keys, never trusted. An ECDSA signature is ASN.1 DER
    over SHA-256, as cosign writes it."""
    message = pae(payload_type, payload)
    if isinstance(key, Ed25519PrivateKey):
        signature = key.sign(message)
    else:
        signature = key.sign(message, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    envelope = {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": keyid, "sig": base64.b64encode(signature).decode()}],
    }
    return json.dumps(envelope, separators=(",", ":")).encode() + b"\n"


def open_envelope(data: bytes, key: PublicKey, payload_type: str = IN_TOTO) -> bytes:
    """The payload of the envelope in `data`, once one of its signatures is `key`'s.

    Every way it can fail is an EnvelopeError: not an envelope, another payload type, no
    signature by this key (another key's, or a payload changed after signing).
    """
    envelope = _parse(data)
    if envelope["payloadType"] != payload_type:
        shown = str(envelope["payloadType"])[:80]
        raise EnvelopeError(f"payload type {shown!r}, not {payload_type!r}")
    payload = _base64(envelope["payload"], "payload")
    message = pae(payload_type, payload)
    for index, entry in enumerate(envelope["signatures"]):
        signature = _base64(entry.get("sig"), f"signatures[{index}].sig")
        if holds(key, signature, message):
            return payload
    raise NotSigned("no signature by this key (the payload changed, or another key signed it)")


def holds(key: PublicKey, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is `key`'s over `message` (Ed25519, or ECDSA over SHA-256 in ASN.1 DER)."""
    try:
        if isinstance(key, Ed25519PublicKey):
            key.verify(signature, message)
        else:
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def _parse(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_ENVELOPE:
        raise EnvelopeError(f"larger than {MAX_ENVELOPE} bytes")
    lines = [line for line in data.splitlines() if line.strip()]
    if len(lines) != 1:  # JSON Lines: Kiln writes one envelope, on one line
        raise EnvelopeError(f"{len(lines)} lines, not one DSSE envelope")
    try:
        envelope = json.loads(lines[0])
    except (UnicodeDecodeError, ValueError):
        raise EnvelopeError("not JSON") from None
    problem = _shape_problem(envelope)
    if problem:
        raise EnvelopeError(f"not a DSSE envelope ({problem})")
    return envelope  # type: ignore[no-any-return]


def _shape_problem(envelope: Any) -> str:
    """What keeps `envelope` from being a DSSE envelope; empty when nothing does."""
    if not isinstance(envelope, dict):
        return "not an object"
    if not isinstance(envelope.get("payloadType"), str) or not isinstance(envelope.get("payload"), str):
        return "payloadType and payload must be strings"
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        return "no signatures"
    if len(signatures) > MAX_SIGNATURES:
        return f"more than {MAX_SIGNATURES} signatures"
    if not all(isinstance(entry, dict) for entry in signatures):
        return "a signature that is not an object"
    return ""


def _base64(value: Any, field: str) -> bytes:
    """Standard or URL-safe base64, padded or not: DSSE lets a signer choose."""
    if not isinstance(value, str):
        raise EnvelopeError(f"{field} is not a string")
    standard = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"{field} is not base64") from None
