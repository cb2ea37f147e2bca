"""DSSE envelopes signed with the release key (kiln.signing.dsse): the round trip, the encoding the
signature covers, and every tampering refused: payload, signature, key, payload type, shape."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kiln.signing import dsse

PAYLOAD = b'{"_type": "https://in-toto.io/Statement/v1", "subject": []}\n'


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def envelope(data: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(data)
    return value


def encoded(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode() + b"\n"


def test_round_trip_and_the_same_bytes_every_time(key: Ed25519PrivateKey) -> None:
    signed = dsse.sign(PAYLOAD, key, "abc")
    assert signed.endswith(b"\n") and signed.count(b"\n") == 1  # one JSON line
    assert dsse.open_envelope(signed, key.public_key()) == PAYLOAD
    assert dsse.sign(PAYLOAD, key, "abc") == signed  # Ed25519 is deterministic
    fields = envelope(signed)
    assert fields["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(str(fields["payload"])) == PAYLOAD
    assert fields["signatures"] == [{"keyid": "abc", "sig": fields["signatures"][0]["sig"]}]


def test_the_signature_covers_the_pre_authentication_encoding(key: Ed25519PrivateKey) -> None:
    """DSSE's example: the type and payload with their lengths in decimal, after `DSSEv1`."""
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    sig = base64.b64decode(envelope(dsse.sign(PAYLOAD, key, ""))["signatures"][0]["sig"])
    key.public_key().verify(sig, dsse.pae(dsse.IN_TOTO, PAYLOAD))  # raises if not


def test_a_changed_payload_is_refused(key: Ed25519PrivateKey) -> None:
    fields = envelope(dsse.sign(PAYLOAD, key, ""))
    fields["payload"] = base64.b64encode(PAYLOAD.replace(b"[]", b"[{}]")).decode()
    with pytest.raises(dsse.NotSigned):
        dsse.open_envelope(encoded(fields), key.public_key())


def test_a_changed_signature_is_refused(key: Ed25519PrivateKey) -> None:
    fields = envelope(dsse.sign(PAYLOAD, key, ""))
    sig = bytearray(base64.b64decode(fields["signatures"][0]["sig"]))
    sig[10] ^= 1
    fields["signatures"] = [{"keyid": "", "sig": base64.b64encode(bytes(sig)).decode()}]
    with pytest.raises(dsse.NotSigned):
        dsse.open_envelope(encoded(fields), key.public_key())


def test_another_key_is_refused(key: Ed25519PrivateKey) -> None:
    signed = dsse.sign(PAYLOAD, Ed25519PrivateKey.generate(), "")
    with pytest.raises(dsse.NotSigned):
        dsse.open_envelope(signed, key.public_key())


def test_one_good_signature_among_others_is_enough(key: Ed25519PrivateKey) -> None:
    fields = envelope(dsse.sign(PAYLOAD, key, "mine"))
    other = envelope(dsse.sign(PAYLOAD, Ed25519PrivateKey.generate(), "other"))
    fields["signatures"] = [*other["signatures"], *fields["signatures"]]
    assert dsse.open_envelope(encoded(fields), key.public_key()) == PAYLOAD


def test_another_payload_type_is_refused_even_if_signed(key: Ed25519PrivateKey) -> None:
    signed = dsse.sign(PAYLOAD, key, "", payload_type="application/json")
    with pytest.raises(dsse.EnvelopeError, match="payload type 'application/json'"):
        dsse.open_envelope(signed, key.public_key())
    fields = envelope(dsse.sign(PAYLOAD, key, ""))
    fields["payloadType"] = "application/json"  # the type is signed too: relabelling breaks the signature
    with pytest.raises(dsse.NotSigned):
        dsse.open_envelope(encoded(fields), key.public_key(), "application/json")


def test_url_safe_unpadded_base64_is_read(key: Ed25519PrivateKey) -> None:
    fields = envelope(dsse.sign(PAYLOAD, key, ""))
    for field, name in ((fields, "payload"), (fields["signatures"][0], "sig")):
        raw = base64.b64decode(field[name])
        field[name] = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert dsse.open_envelope(encoded(fields), key.public_key()) == PAYLOAD


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "0 lines"),
        (b"not json\n", "not JSON"),
        (b"[]\n", "not an object"),
        (b'{"payloadType": "a/b", "payload": "", "signatures": []}\n', "no signatures"),
        (b'{"payloadType": "a/b", "payload": 1, "signatures": [{}]}\n', "must be strings"),
        (b'{"payloadType": "application/vnd.in-toto+json", "payload": "!!", "signatures": [{}]}\n', "not base64"),
        (b'{"payloadType": "application/vnd.in-toto+json", "payload": "", "signatures": [{}]}\n', "not a string"),
        (b"{}\n{}\n", "2 lines"),
    ],
)
def test_malformed_envelopes_say_why(key: Ed25519PrivateKey, data: bytes, message: str) -> None:
    with pytest.raises(dsse.EnvelopeError, match=message):
        dsse.open_envelope(data, key.public_key())


def test_an_oversized_envelope_is_not_parsed(key: Ed25519PrivateKey) -> None:
    with pytest.raises(dsse.EnvelopeError, match="larger than"):
        dsse.open_envelope(b" " * (dsse.MAX_ENVELOPE + 1), key.public_key())
