"""`kiln keys generate` with the real efitools: the signature lists and signed updates it writes are
what firmware takes, and virt-fw-vars (how Kiln enrols keys into QEMU's OVMF) accepts the certificates.

A missing tool skips these tests on a workstation; where CI is set it fails them, so a CI host without
efitools cannot pass by skipping.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kiln.core.errors import BuildError
from kiln.core.tools import run
from kiln.signing.efivars import DBX, EFI_CERT_TYPE_PKCS7, EFI_CERT_X509, parse_signature_list
from kiln.signing.generate import generate
from kiln.signing.keyset import UEFI_KEYS, KeySet
from kiln.signing.shim import VENDOR_CERT

pytestmark = pytest.mark.integration

VIRT_FW_VARS = str(Path(sys.executable).parent / "virt-fw-vars")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
EFI_GLOBAL_VARIABLE = "8be4df61-93ca-11d2-aa0d-00e098032b8c"  # PK and KEK live here
EFI_IMAGE_SECURITY_DATABASE = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"  # db
SIGNER = {"PK": "PK", "KEK": "PK", "db": "KEK", "dbx": "KEK"}  # UEFI: PK signs PK and KEK, KEK signs db and dbx
VENDOR = {
    "PK": EFI_GLOBAL_VARIABLE,
    "KEK": EFI_GLOBAL_VARIABLE,
    "db": EFI_IMAGE_SECURITY_DATABASE,
    "dbx": EFI_IMAGE_SECURITY_DATABASE,
}
VARIABLES = (*UEFI_KEYS, DBX)
# NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS | TIME_BASED_AUTHENTICATED_WRITE_ACCESS
ATTRIBUTES = 0x27
EFI_TIME = 16
WIN_CERT_HEADER = 24  # u32 length, u16 revision, u16 type, 16-byte certificate type GUID


def need(*paths: str | Path) -> None:
    """Skip (workstation) or fail (CI) when a tool or file these tests use is not installed."""
    missing = [str(p) for p in paths if not (Path(p).exists() if Path(p).is_absolute() else shutil.which(str(p)))]
    if not missing:
        return
    message = f"not installed: {', '.join(missing)} (Debian: efitools, openssl, ovmf; pip: virt-firmware)"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: these tests must run)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeySet:
    need("cert-to-efi-sig-list", "sign-efi-sig-list")
    return generate(tmp_path_factory.mktemp("efitools") / "keys", common_name="Kiln Test")


def der(keys: KeySet, name: str) -> bytes:
    cert = x509.load_pem_x509_certificate(keys.cert(name).read_bytes())
    return cert.public_bytes(serialization.Encoding.DER)


def split_auth(data: bytes) -> tuple[bytes, int, int, str, bytes, bytes]:
    """EFI_VARIABLE_AUTHENTICATION_2: (EFI_TIME, revision, type, cert type GUID, PKCS#7, the list)."""
    length, revision, kind = struct.unpack_from("<IHH", data, EFI_TIME)
    cert_type = str(uuid.UUID(bytes_le=data[EFI_TIME + 8 : EFI_TIME + WIN_CERT_HEADER]))
    end = EFI_TIME + length
    assert length > WIN_CERT_HEADER and end <= len(data)
    return data[:EFI_TIME], revision, kind, cert_type, data[EFI_TIME + WIN_CERT_HEADER : end], data[end:]


def der_tlv(tag: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes([tag, size]) + body
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(octets)]) + octets + body


def content_info(signed_data: bytes) -> bytes:
    """Wrap the bare SignedData UEFI stores into the ContentInfo openssl cms reads."""
    signed_data_oid = bytes.fromhex("06092a864886f70d010702")  # 1.2.840.113549.1.7.2
    return der_tlv(0x30, signed_data_oid + der_tlv(0xA0, signed_data))


def test_each_list_holds_its_certificate_with_the_owner_guid(keys: KeySet) -> None:
    owner = keys.owner_guid()
    for name in UEFI_KEYS:
        assert parse_signature_list(keys.esl(name).read_bytes()) == [(EFI_CERT_X509, owner, der(keys, name))], name
    # dbx forbids the certificate shim trusts besides db (Debian's CA in shim-unsigned)
    assert parse_signature_list(keys.esl(DBX).read_bytes()) == [(EFI_CERT_X509, owner, VENDOR_CERT.read_bytes())]


def test_each_update_is_an_authenticated_variable_over_its_list(keys: KeySet) -> None:
    for name in VARIABLES:
        timestamp, revision, kind, cert_type, pkcs7, payload = split_auth(keys.auth(name).read_bytes())
        assert (revision, kind, cert_type) == (0x0200, 0x0EF1, EFI_CERT_TYPE_PKCS7), name
        assert struct.unpack_from("<H", timestamp)[0] >= 2024, name  # year of the EFI_TIME
        assert payload == keys.esl(name).read_bytes(), name
        assert pkcs7[:1] == b"\x30", name


@pytest.mark.parametrize("name", VARIABLES)
def test_each_update_is_signed_by_the_key_above_it_and_no_other(keys: KeySet, name: str, tmp_path: Path) -> None:
    need("openssl")
    timestamp, _, _, _, pkcs7, payload = split_auth(keys.auth(name).read_bytes())
    signed = tmp_path / "signed"  # what UEFI signs: name, vendor GUID, attributes, time, data
    signed.write_bytes(
        name.encode("utf-16-le")
        + uuid.UUID(VENDOR[name]).bytes_le
        + struct.pack("<I", ATTRIBUTES)
        + timestamp
        + payload
    )
    signature = tmp_path / "p7.der"
    signature.write_bytes(content_info(pkcs7))
    verify = ["openssl", "cms", "-verify", "-inform", "DER", "-in", str(signature), "-binary"]
    verify += ["-content", str(signed), "-purpose", "any", "-out", os.devnull, "-CAfile"]
    run([*verify, str(keys.cert(SIGNER[name]))], what=f"verifying {name}.auth")
    other = "KEK" if SIGNER[name] == "PK" else "PK"
    with pytest.raises(BuildError, match="verif"):
        run([*verify, str(keys.cert(other))], what=f"verifying {name}.auth against {other}")


def test_virt_fw_vars_enrols_the_certificates_into_ovmf(keys: KeySet, tmp_path: Path) -> None:
    need(VIRT_FW_VARS, OVMF_VARS)
    guid = keys.owner_guid()
    out = tmp_path / "OVMF_VARS.fd"
    enrol = [VIRT_FW_VARS, "-i", str(OVMF_VARS), "--set-pk", guid, str(keys.cert("PK"))]
    enrol += ["--add-kek", guid, str(keys.cert("KEK")), "--add-db", guid, str(keys.cert("db")), "--sb", "-o", str(out)]
    run(enrol, what="virt-fw-vars (enrol)")
    printed = run([VIRT_FW_VARS, "-i", str(out), "-p", "-v"], what="virt-fw-vars (print)")
    text = (printed.stdout + printed.stderr).decode()
    for name in UEFI_KEYS:
        assert f"subject CN=Kiln Test {name}" in text, text
    assert re.search(r"name=SecureBootEnable .*\n\s+bool: ON", text), text  # --sb turned it on


def test_the_command_writes_the_set_and_refuses_to_overwrite_it(tmp_path: Path) -> None:
    need("cert-to-efi-sig-list", "sign-efi-sig-list")
    kiln = [sys.executable, "-m", "kiln.cli", "keys", "generate", str(tmp_path / "keys")]
    first = subprocess.run(kiln, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert "wrote " in first.stdout and "BEGIN" not in first.stdout
    pk = (tmp_path / "keys" / "PK.key").read_bytes()
    second = subprocess.run(kiln, capture_output=True, text=True, check=False)
    assert second.returncode == 2 and "holds keys already" in second.stderr, second.stderr
    assert "Traceback" not in second.stderr and (tmp_path / "keys" / "PK.key").read_bytes() == pk
