"""The TPM2 PolicyPCR digest Kiln computes to check a measured PCR 11 against a UKI's signed policy.

The expected digest is what systemd-measure 252 (through a TPM's trial session) wrote into the
"pol" field for that PCR 11 value: an independent implementation of the same computation."""

from __future__ import annotations

from kiln.signing.pcr import policy_digest

PCR11 = bytes.fromhex("e5f9bb83e3ac4673f63fc0b9aa8e0650baad733d0f157a6fbcf6d2aa5326eead")
SYSTEMD_POLICY = "39e8cdeda3a89285b9d27c8ac289ad94d580099d76c61979a12f1124d64ca998"


def test_policy_digest_matches_systemd_measure() -> None:
    assert policy_digest(PCR11).hex() == SYSTEMD_POLICY


def test_policy_digest_depends_on_every_byte_of_the_value() -> None:
    changed = bytes([PCR11[0] ^ 1]) + PCR11[1:]
    assert policy_digest(changed) != policy_digest(PCR11)
    assert len({policy_digest(bytes([i]) * 32) for i in range(16)}) == 16
