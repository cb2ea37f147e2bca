"""Kernel module signatures: what the kernel's module loader checks under lockdown.

A signed module is the module's bytes, a detached PKCS#7 signature over them (SHA-256, no
signed attributes, no certificates: the kernel finds the key by issuer and serial), the 12-byte
`struct module_signature` trailer and the magic string, which is what the kernel's own
scripts/sign-file appends. Kiln signs at image time, not in the kernel package, because the key
is the user's and never enters the store; RSA PKCS#1 v1.5 signatures are deterministic, so the
same module and key give the same bytes.
"""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7

from kiln.core import nofollow
from kiln.core.errors import BuildError, InputError
from kiln.signing.keyset import KeySet

MAGIC = b"~Module signature appended~\n"
# struct module_signature: algo, hash, id_type, signer_len, key_id_len, 3 pad bytes, be32 sig_len;
# for PKCS#7 only id_type (2) and sig_len are used.
TRAILER = struct.Struct(">BBBBB3xI")
PKEY_ID_PKCS7 = 2
COMPRESSED = (".ko.xz", ".ko.zst", ".ko.gz")
MODULES = "usr/lib/modules"  # links here are refused: the kernel loads what is below it


def unsigned(data: bytes) -> bytes:
    """The module without its appended signature (the bytes themselves when it has none)."""
    if not data.endswith(MAGIC):
        return data
    end = len(data) - len(MAGIC) - TRAILER.size
    if end < 0:
        raise ValueError("truncated module signature")
    *_, id_type, _signer, _key_id, sig_len = TRAILER.unpack_from(data, end)
    if id_type != PKEY_ID_PKCS7 or sig_len > end:
        raise ValueError("malformed module signature trailer")
    return data[: end - sig_len]


def signature_of(data: bytes) -> bytes | None:
    """The DER PKCS#7 signature appended to a module, or None when it has none."""
    stripped = unsigned(data)
    if stripped is data:
        return None
    return data[len(stripped) : len(data) - len(MAGIC) - TRAILER.size]


@dataclass(frozen=True)
class ModuleSigner:
    """Signs modules with one key; `fingerprint` (the certificate's SHA-256) names it in seeds."""

    key: rsa.RSAPrivateKey
    cert: x509.Certificate

    @classmethod
    def from_keys(cls, keys: KeySet) -> ModuleSigner:
        key_path, cert_path = keys.signing_pair("module")
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise InputError(f"{key_path}: the module key must be RSA (the kernel's module loader checks RSA)")
        return cls(key, x509.load_pem_x509_certificate(cert_path.read_bytes()))

    @property
    def fingerprint(self) -> str:
        return self.cert.fingerprint(hashes.SHA256()).hex()

    def sign(self, data: bytes) -> bytes:
        """`data` signed with this key; any signature it already had is replaced."""
        body = unsigned(data)
        signature = (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(body)
            .add_signer(self.cert, self.key, hashes.SHA256())
            .sign(
                serialization.Encoding.DER,
                [
                    pkcs7.PKCS7Options.DetachedSignature,
                    pkcs7.PKCS7Options.NoAttributes,
                    pkcs7.PKCS7Options.NoCerts,
                    pkcs7.PKCS7Options.Binary,
                ],
            )
        )
        return body + signature + TRAILER.pack(0, 0, PKEY_ID_PKCS7, 0, 0, len(signature)) + MAGIC

    def sign_tree(self, root: Path) -> int:
        """Sign every module (*.ko) under `root`, keeping its mode and times; returns the count.

        `root` is a tree others wrote (the merged rootfs, an extension layer), so it goes through
        kiln.core.nofollow: each module is read and its signed copy written and renamed in place
        through its directory's descriptor, never through a link; a link under /usr/lib/modules is
        refused by name, one elsewhere is left alone. A compressed module is refused: its signature
        belongs inside the compressed stream.
        """
        count = 0
        for entry in nofollow.walk(root, what="module signing"):
            under_modules = entry.rel == MODULES or entry.rel.startswith(MODULES + "/")
            if entry.is_link and (under_modules or MODULES.startswith(entry.rel + "/")):
                raise nofollow.refuse("module signing", entry.shown, "a file or directory")
            if entry.is_link or not entry.is_file:
                continue
            if entry.name.endswith(COMPRESSED):
                raise BuildError(f"{entry.shown}: a compressed module cannot be signed; ship it as .ko")
            if entry.name.endswith(".ko"):
                self._sign_entry(entry)
                count += 1
        return count

    def _sign_entry(self, entry: nofollow.Entry) -> None:
        """One module replaced by its signed bytes: a new inode (the tree may hard-link files of the store,
        which must stay as they are) with the module's mode and times."""
        info = entry.info
        try:
            signed = self.sign(nofollow.read_at(entry.parent, entry.name, entry.shown, what="module signing"))
        except ValueError as error:
            raise BuildError(f"{entry.shown}: {error}") from None
        nofollow.write_at(
            entry.parent,
            entry.name,
            signed,
            entry.shown,
            mode=stat.S_IMODE(info.st_mode),
            times_ns=(info.st_atime_ns, info.st_mtime_ns),
            what="module signing",
        )
