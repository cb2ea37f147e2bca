"""What every certificate Kiln makes starts from: the fleet's API certificates (kiln secrets) and the
Secure Boot and module certificates (kiln keys) differ in their extensions, not in these."""

from __future__ import annotations

from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes


def builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: CertificatePublicKeyTypes,
    not_before: datetime,
    not_after: datetime,
) -> x509.CertificateBuilder:
    """A certificate's names, key, random serial and validity, its extensions still to add."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def key_usage(*, cert_sign: bool, crl_sign: bool) -> x509.KeyUsage:
    """digitalSignature, and keyCertSign and cRLSign where asked: nothing else any Kiln certificate needs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )
