"""The shim Kiln's Secure Boot chain starts with, and the certificate it trusts besides the db.

Debian's shim-unsigned embeds Debian's Secure Boot CA as its vendor certificate: signed with the
user's db key, it would also start anything Debian signed (Debian's GRUB, then Debian's kernels
with any initramfs), which is outside the user's chain. So that certificate goes into dbx with the
user's keys (kiln keys generate writes dbx.auth; kiln boot --secure-boot enrols it): shim and the
firmware refuse what it signed, and the kernel blacklists it instead of trusting it as a MOK.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kiln.core.errors import BuildError

SHIM = Path("/usr/lib/shim/shimx64.efi")
# shim's MokManager, which shim starts from its own directory when a MOK change waits for the
# console's confirmation (mokutil --import, --trust-mok): how the module key gets enrolled.
MOK_MANAGER = Path("/usr/lib/shim/mmx64.efi")
VENDOR_CERT = Path("/usr/share/shim/debian-uefi-ca.der")


def vendor_cert_pem() -> bytes:
    """shim's vendor certificate as PEM (what efitools read)."""
    if not VENDOR_CERT.exists():
        raise BuildError(f"shim's vendor certificate {VENDOR_CERT} is missing: apt install shim-unsigned")
    return x509.load_der_x509_certificate(VENDOR_CERT.read_bytes()).public_bytes(serialization.Encoding.PEM)
