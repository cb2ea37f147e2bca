"""`kiln keys generate DIR`: a user's own Secure Boot, module and release keys, in keyset.py's layout.

Everything is made in a staging directory inside DIR (same file system) and renamed into place only
once every key, certificate and signature list exists, so a failed or interrupted run leaves no half
key and no partial set that the next run would have to --force over.

`--add-missing` (add_missing) gives a key directory made before the image release key existed that
key alone, the same way, and touches nothing else.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kiln.core import certificates
from kiln.core.errors import InputError, display_path
from kiln.signing.efivars import DBX, SIGNER, write_signature_lists
from kiln.signing.keyset import PCR, RELEASE, RELEASE_IMAGE, UEFI_KEYS, X509_KEYS, KeySet

RSA_BITS = 2048  # what every UEFI implementation and the kernel's module loader accept
VALIDITY = timedelta(days=3652)  # ten years, leap days included
MAX_NAME = 57  # X.509 caps a common name at 64 characters; "<name> module" must fit
CA_KEYS = ("PK", "KEK")  # they certify the level below; db and module only sign

ROLE = {
    "PK": "platform key (PK): signs updates of PK and KEK",
    "KEK": "key exchange key (KEK): signs updates of db",
    "db": "signature database key (db): signs the EFI binaries the firmware boots",
    "module": "kernel module key: for signing kernel modules",
}


def files(keys: KeySet) -> list[tuple[Path, str]]:
    """Every file generate() writes, with what it is for: the refusal check and the CLI's listing."""
    listing: list[tuple[Path, str]] = []
    for name in X509_KEYS:
        listing += [(keys.key(name), f"private {ROLE[name]}"), (keys.cert(name), f"certificate of the {name} key")]
    listing += [
        (keys.module_der, "module certificate (DER) to enrol as a MOK: mokutil --import"),
        (keys.key(PCR), "private PCR key (RSA-2048): signs the PCR 11 policy of each UKI (measured boot)"),
        (keys.pcr_public, "PCR public key: a UKI's .pcrpkey, what TPM-sealed secrets name"),
        (keys.key(RELEASE), "private release key (Ed25519): signs release checksums"),
        (keys.release_public, "release public key: what kiln verify checks release checksums with"),
        *image_key_files(keys),
        (keys.owner_guid_file, "owner GUID the EFI signature lists carry"),
    ]
    listing += [(keys.esl(name), f"EFI signature list of the {name} certificate") for name in UEFI_KEYS]
    listing.append((keys.esl(DBX), "EFI signature list forbidding shim's vendor certificate (Debian's CA)"))
    listing += [
        (keys.auth(name), f"signed {name} update for firmware setup mode (signed by {SIGNER[name]})")
        for name in (*UEFI_KEYS, DBX)
    ]
    return listing


def image_key_files(keys: KeySet) -> list[tuple[Path, str]]:
    """The image release key's two files: what --add-missing may add to an older key directory."""
    return [
        (keys.key(RELEASE_IMAGE), "private image release key (ECDSA P-256): signs installer images (cosign format)"),
        (keys.release_image_public, "image release public key: machines' release_keys, cosign --key, skopeo keyPath"),
    ]


def generate(root: Path, *, common_name: str = "Kiln", force: bool = False) -> KeySet:
    """Write a fresh key set into `root`; refuse (writing nothing) if any of its files exist, unless `force`."""
    _check_name(common_name)
    keys = KeySet(root)
    _make_root(root)
    _refuse_existing(keys, force=force)
    try:
        stage = Path(tempfile.mkdtemp(prefix=".kiln-keys-", dir=root))
    except OSError as exc:
        raise InputError(f"{display_path(root)}: cannot write there: {exc.strerror}") from None
    try:
        staged = KeySet(stage)
        _write_keys(staged, common_name)
        write_signature_lists(staged)
        _publish(staged, keys)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return keys


def add_missing(root: Path) -> list[tuple[Path, str]]:
    """Give an existing key directory the image release key it lacks (made before that key existed);
    returns the files written. Every other file must be there already, and is left as it is."""
    keys = KeySet(root)
    if not root.is_dir():
        raise InputError(f"{display_path(root)}: no such key directory (kiln keys generate DIR makes one)")
    added = image_key_files(keys)
    if all(os.path.lexists(path) for path, _ in added):
        return []
    new = {path for path, _ in added}
    absent = [path for path, _ in files(keys) if path not in new and not os.path.lexists(path)]
    if absent:
        raise InputError(
            f"{display_path(root)}: not a whole key set ({absent[0].name} is missing); --add-missing adds only "
            f"{RELEASE_IMAGE}.key and {RELEASE_IMAGE}.pub"
        )
    present = [path for path, _ in added if os.path.lexists(path)]
    if present:
        raise InputError(f"{display_path(present[0])}: half of the image release key is there; remove it first")
    try:
        stage = Path(tempfile.mkdtemp(prefix=".kiln-keys-", dir=root))
    except OSError as exc:
        raise InputError(f"{display_path(root)}: cannot write there: {exc.strerror}") from None
    try:
        _write_image_key(KeySet(stage))
        for path, _ in added:
            os.replace(stage / path.name, path)
        _sync_directory(root)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return added


def _check_name(common_name: str) -> None:
    if not common_name.strip() or not common_name.isprintable() or len(common_name) > MAX_NAME:
        raise InputError(f"--name {common_name!r}: want 1 to {MAX_NAME} printable characters")


def _make_root(root: Path) -> None:
    try:
        root.mkdir(mode=0o700, parents=True)
        os.chmod(root, 0o700)  # mkdir's mode passes through the umask
    except FileExistsError:
        if not root.is_dir():
            raise InputError(f"{display_path(root)}: not a directory") from None
    except OSError as exc:
        raise InputError(f"{display_path(root)}: cannot create the key directory: {exc.strerror}") from None


def _refuse_existing(keys: KeySet, *, force: bool) -> None:
    present = [path for path, _ in files(keys) if os.path.lexists(path)]
    if present and not force:
        more = f" and {len(present) - 1} more" if len(present) > 1 else ""
        raise InputError(
            f"{display_path(keys.root)}: holds keys already ({present[0].name}{more}); nothing was written "
            "(--force replaces them, and machines enrolled with the old keys will need the new ones)"
        )
    for path in present:
        if path.is_dir() and not path.is_symlink():
            raise InputError(f"{display_path(path)}: a directory where a key file belongs")


def _write_keys(keys: KeySet, common_name: str) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    for name in X509_KEYS:
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
        cert = _certificate(key, f"{common_name} {name}", name, now)
        _write(keys.key(name), _private_pem(key), 0o600)
        _write(keys.cert(name), cert.public_bytes(serialization.Encoding.PEM), 0o644)
        if name == "module":
            _write(keys.module_der, cert.public_bytes(serialization.Encoding.DER), 0o644)
    pcr = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    _write(keys.key(PCR), _private_pem(pcr), 0o600)
    _write(keys.pcr_public, _public_pem(pcr), 0o644)
    release = Ed25519PrivateKey.generate()
    public = release.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(keys.key(RELEASE), _private_pem(release), 0o600)
    _write(keys.release_public, public, 0o644)
    _write_image_key(keys)
    _write(keys.owner_guid_file, f"{uuid.uuid4()}\n".encode(), 0o644)


def _write_image_key(keys: KeySet) -> None:
    image = ec.generate_private_key(ec.SECP256R1())
    _write(keys.key(RELEASE_IMAGE), _private_pem(image), 0o600)
    _write(keys.release_image_public, _public_pem(image), 0o644)


def _public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _private_pem(key: rsa.RSAPrivateKey | Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate(key: rsa.RSAPrivateKey, cn: str, name: str, now: datetime) -> x509.Certificate:
    """Self-signed. PK and KEK are CAs; the module certificate carries what the kernel's sign-file and
    X.509 parser look for (codeSigning, a subject key identifier)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    skid = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    ca = name in CA_KEYS
    builder = (
        certificates.builder(subject, subject, key.public_key(), now, now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(certificates.key_usage(cert_sign=ca, crl_sign=False), critical=True)
        .add_extension(skid, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(skid), critical=False)
    )
    if name == "module":
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(key, hashes.SHA256())


def _write(path: Path, data: bytes, mode: int) -> None:
    """A new file with exactly `mode` (not widened by the umask, not left to it), synced to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with open(fd, "wb") as handle:
        os.fchmod(fd, mode)
        handle.write(data)
        handle.flush()
        os.fsync(fd)


def _publish(staged: KeySet, keys: KeySet) -> None:
    """Rename every staged file onto its place in `keys` (same file system: each rename is atomic)."""
    for path, _ in files(keys):
        os.replace(staged.root / path.name, path)
    _sync_directory(keys.root)


def _sync_directory(root: Path) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
