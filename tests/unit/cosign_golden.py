"""The golden signature machined's Go tests verify: an installer image signature exactly as the Python
side writes it (kiln.signing.image_signature), with a test key derived from a fixed string, so the
fixture is the same bytes every time (RFC 6979 ECDSA) and test_image_signature checks it stays so.

`python -m tests.unit.cosign_golden` rewrites runtime/machined/internal/oci/testdata/cosign/ after a
deliberate change of the format.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kiln.signing.image_signature import key_fingerprint, sign_digest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "runtime/machined/internal/oci/testdata/cosign"
DIGEST = "sha256:" + hashlib.sha256(b"the golden installer manifest").hexdigest()
REPOSITORY = "registry.example:5000/kiln/installer"


def golden_key() -> ec.EllipticCurvePrivateKey:
    """A P-256 key from a fixed string: for fixtures only, never for signing anything real."""
    scalar = int.from_bytes(hashlib.sha256(b"kiln golden test key, not secret").digest(), "big")
    return ec.derive_private_key(scalar, ec.SECP256R1())


def golden_files() -> dict[str, bytes]:
    """name -> bytes of each fixture file."""
    key = golden_key()
    artifact = sign_digest(DIGEST, REPOSITORY, key)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "digest": DIGEST.encode() + b"\n",
        "key.pub": public,
        "fingerprint": key_fingerprint(key.public_key()).encode() + b"\n",
        "manifest.json": artifact.manifest,
        "payload.json": artifact.payload,
        "config.json": artifact.config,
    }


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, data in golden_files().items():
        (GOLDEN / name).write_bytes(data)
        print(f"wrote {GOLDEN / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
