"""A key directory: which file holds which key, and the checks before Kiln reads one.

`kiln keys generate DIR` writes this layout; profiles and `--keys` name the directory. The
private keys (`*.key`) must be regular files only their owner can read: a key others can read is
refused, since whoever can read it can sign as the user.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import InputError

# Secure Boot's three levels (platform key, key exchange key, signature database), the kernel
# module key and the two release keys. PK/KEK/db/module are RSA-2048 X.509 (what UEFI firmware and
# the kernel's module loader accept everywhere); release is Ed25519 (deterministic signatures over
# SHA256SUMS, checked by OpenSSL and Go's standard library); release-image is ECDSA P-256, the key
# type the sigstore signature spec requires every verifier to support, so cosign and skopeo check
# installer image signatures made with it.
UEFI_KEYS = ("PK", "KEK", "db")
X509_KEYS = (*UEFI_KEYS, "module")
RELEASE = "release"
RELEASE_IMAGE = "release-image"
PCR = "pcr"  # RSA-2048 (what TPM2 PolicyAuthorize and systemd check): signs PCR 11 policies
OWNER_GUID = "owner.guid"  # the EFI signature owner GUID the lists carry, one line


@dataclass(frozen=True)
class KeySet:
    """The files of one key directory (see the module docstring for the layout)."""

    root: Path

    def key(self, name: str) -> Path:
        """The private key `name` (PEM, PKCS#8): PK, KEK, db, module, pcr, release or release-image."""
        return self.root / f"{name}.key"

    def cert(self, name: str) -> Path:
        """The X.509 certificate (PEM) of PK, KEK, db or module."""
        return self.root / f"{name}.crt"

    def esl(self, name: str) -> Path:
        """The EFI signature list holding `name`'s certificate (PK, KEK or db)."""
        return self.root / f"{name}.esl"

    def auth(self, name: str) -> Path:
        """The signed (authenticated) variable update that enrols `name` (PK, KEK or db) from setup mode."""
        return self.root / f"{name}.auth"

    @property
    def module_der(self) -> Path:
        """The module certificate in DER: what `mokutil --import` enrols as a Machine Owner Key."""
        return self.root / "module.der"

    @property
    def pcr_public(self) -> Path:
        """The PCR key's public half (PEM): the UKI's .pcrpkey, what a TPM policy names."""
        return self.root / f"{PCR}.pub"

    @property
    def release_public(self) -> Path:
        """The release key's public half (PEM SubjectPublicKeyInfo): what verifiers are given."""
        return self.root / f"{RELEASE}.pub"

    @property
    def release_image_public(self) -> Path:
        """The image release key's public half (PEM SubjectPublicKeyInfo): cosign's --key, skopeo's keyPath,
        a machine config's release_keys."""
        return self.root / f"{RELEASE_IMAGE}.pub"

    @property
    def owner_guid_file(self) -> Path:
        return self.root / OWNER_GUID

    def owner_guid(self) -> str:
        return self.require(self.owner_guid_file).read_text().strip()

    def require(self, path: Path, *, private: bool = False) -> Path:
        """`path` if it is a regular file (not a link); a private key must also be unreadable by others."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise InputError(f"{path}: missing from the key directory (kiln keys generate writes it)") from None
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file")
        if private and info.st_mode & 0o077:
            raise InputError(
                f"{path}: a private key others can read (mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
            )
        return path

    def signing_pair(self, name: str) -> tuple[Path, Path]:
        """(private key, certificate) of an X.509 key, both checked."""
        return self.require(self.key(name), private=True), self.require(self.cert(name))
