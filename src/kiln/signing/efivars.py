"""EFI signature lists and the signed variable updates that enrol a key set's certificates.

Besides the key set's own, `dbx.esl`/`dbx.auth` forbid shim's vendor certificate (kiln.signing.shim).

`PK.esl`, `KEK.esl` and `db.esl` each hold one certificate; `PK.auth`, `KEK.auth` and `db.auth` are
the same lists wrapped as time-based authenticated updates (PK signs PK and KEK, KEK signs db), which
is what firmware setup menus, KeyTool and `efi-updatevar` take. Debian's efitools writes both: the
format is UEFI's, and a list firmware rejects is worse than a dependency.
"""

from __future__ import annotations

import os
import struct
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.core.errors import BuildError, InputError
from kiln.core.tools import run
from kiln.signing.keyset import UEFI_KEYS, KeySet
from kiln.signing.shim import vendor_cert_pem

EFI_CERT_X509 = "a5c059a1-94e4-4aa7-87b5-ab155c2bf072"  # EFI_CERT_X509_GUID: the payload is one DER cert
EFI_CERT_TYPE_PKCS7 = "4aafd29d-68df-49ee-8aa9-347d375665a7"  # an authenticated update's signature type
# Who signs each variable's update: the platform key signs itself and KEK, KEK signs db and dbx.
SIGNER = {"PK": "PK", "KEK": "PK", "db": "KEK", "dbx": "KEK"}
DBX = "dbx"  # the forbidden signatures: shim's vendor certificate (kiln.signing.shim)

_HEADER = struct.Struct("<16sIII")  # EFI_SIGNATURE_LIST: type GUID, list size, header size, signature size
_GUID = 16


def write_signature_lists(keys: KeySet) -> None:
    """Write NAME.esl and NAME.auth for PK, KEK and db from the certificates and keys in `keys`."""
    guid = keys.owner_guid()
    for name in UEFI_KEYS:
        cert = keys.require(keys.cert(name))
        with _output(keys.esl(name)) as tmp:
            run(["cert-to-efi-sig-list", "-g", guid, str(cert), str(tmp)], what=f"cert-to-efi-sig-list ({name})")
            _check_list(tmp.read_bytes(), guid, name)
    with _output(keys.esl(DBX)) as tmp:
        vendor = tmp.with_name(tmp.name + ".pem")
        try:
            vendor.write_bytes(vendor_cert_pem())
            run(["cert-to-efi-sig-list", "-g", guid, str(vendor), str(tmp)], what="cert-to-efi-sig-list (dbx)")
        finally:
            vendor.unlink(missing_ok=True)
        _check_list(tmp.read_bytes(), guid, DBX)
    for name in (*UEFI_KEYS, DBX):
        key, cert = keys.signing_pair(SIGNER[name])
        with _output(keys.auth(name)) as tmp:
            argv = ["sign-efi-sig-list", "-g", guid, "-k", str(key), "-c", str(cert), name]
            run([*argv, str(keys.esl(name)), str(tmp)], what=f"sign-efi-sig-list ({name})")


def parse_signature_list(data: bytes) -> list[tuple[str, str, bytes]]:
    """(signature type GUID, owner GUID, payload) of every entry of the EFI signature lists in `data`.

    Every length is checked against what is left before it is used, and each list consumes at least
    its header, so a hostile or truncated file is refused rather than read past or looped over.
    """
    entries: list[tuple[str, str, bytes]] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            raise InputError(f"malformed EFI signature list: truncated header at byte {offset}")
        kind, list_size, header_size, sig_size = _HEADER.unpack_from(data, offset)
        body = list_size - _HEADER.size - header_size
        if list_size > len(data) - offset or body < 0:
            raise InputError(f"malformed EFI signature list: list size {list_size} at byte {offset} does not fit")
        if sig_size <= _GUID or body % sig_size:
            raise InputError(f"malformed EFI signature list: signature size {sig_size} at byte {offset}")
        kind_text = str(uuid.UUID(bytes_le=kind))
        start = offset + _HEADER.size + header_size
        for entry in range(start, start + body, sig_size):
            owner = str(uuid.UUID(bytes_le=data[entry : entry + _GUID]))
            entries.append((kind_text, owner, data[entry + _GUID : entry + sig_size]))
        offset += list_size
    return entries


def _check_list(data: bytes, guid: str, name: str) -> None:
    """One X.509 entry owned by `guid`: what enrolment needs, checked before the file is kept."""
    entries = parse_signature_list(data)
    if [(kind, owner) for kind, owner, _ in entries] != [(EFI_CERT_X509, guid)]:
        raise BuildError(f"cert-to-efi-sig-list wrote an unexpected signature list for {name}")


@contextmanager
def _output(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` for a program to write; on success it is synced and renamed
    onto `path`, so a failed or interrupted run never leaves a half-written list."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
