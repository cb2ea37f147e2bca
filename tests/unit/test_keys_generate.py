"""`kiln keys generate`: the keys and certificates, their files and modes, refusals, and the EFI
signature list reader. efitools is replaced by a stand-in here (tests/integration/test_keys_efitools.py
runs the real one)."""

from __future__ import annotations

import os
import stat
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.cli import main
from kiln.core.errors import BuildError, InputError
from kiln.signing import generate as generate_module
from kiln.signing.efivars import DBX, EFI_CERT_X509, parse_signature_list
from kiln.signing.generate import add_missing, files, generate, image_key_files
from kiln.signing.keyset import RELEASE, RELEASE_IMAGE, UEFI_KEYS, X509_KEYS, KeySet

OWNER = "8f2b5a8e-0c1d-4e0f-9a3b-6c5d4e3f2a1b"


def fake_lists(keys: KeySet) -> None:
    """What write_signature_lists leaves behind, without efitools."""
    for name in (*UEFI_KEYS, DBX):
        keys.esl(name).write_bytes(f"esl {name}".encode())
        keys.auth(name).write_bytes(f"auth {name}".encode())


@pytest.fixture(autouse=True)
def no_efitools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate_module, "write_signature_lists", fake_lists)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeySet]:
    """One generated set for the read-only checks: RSA key generation is the slow part."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generate_module, "write_signature_lists", fake_lists)
        yield generate(tmp_path_factory.mktemp("k") / "keys", common_name="Acme")


def load_cert(keys: KeySet, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(keys.cert(name).read_bytes())


def load_key(path: Path) -> object:
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def listing(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.iterdir())}


# The keys and certificates


@pytest.mark.parametrize("name", X509_KEYS)
def test_x509_keys_are_rsa_2048_with_a_self_signed_sha256_certificate(keys: KeySet, name: str) -> None:
    key = load_key(keys.key(name))
    cert = load_cert(keys, name)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert cert.public_key() == key.public_key()
    assert cert.subject.rfc4514_string() == f"CN=Acme {name}" and cert.issuer == cert.subject
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    cert.verify_directly_issued_by(cert)
    assert cert.serial_number > 0


@pytest.mark.parametrize("name", X509_KEYS)
def test_certificates_are_valid_for_ten_years_from_now(keys: KeySet, name: str) -> None:
    cert = load_cert(keys, name)
    assert abs(cert.not_valid_before_utc - datetime.now(UTC)) < timedelta(minutes=5)
    assert timedelta(days=3650) <= cert.not_valid_after_utc - cert.not_valid_before_utc <= timedelta(days=3653)


@pytest.mark.parametrize("name", X509_KEYS)
def test_pk_and_kek_are_cas_db_and_module_only_sign(keys: KeySet, name: str) -> None:
    cert = load_cert(keys, name)
    ca = name in ("PK", "KEK")
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert constraints.critical and constraints.value.ca is ca
    assert usage.critical and usage.value.digital_signature and usage.value.key_cert_sign is ca
    skid = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert skid == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())


def test_the_module_certificate_is_for_code_signing(keys: KeySet) -> None:
    cert = load_cert(keys, "module")
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CODE_SIGNING]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for name in UEFI_KEYS:  # only the module key carries it
        with pytest.raises(x509.ExtensionNotFound):
            load_cert(keys, name).extensions.get_extension_for_class(x509.ExtendedKeyUsage)


def test_serials_and_keys_differ_between_certificates(keys: KeySet) -> None:
    certs = [load_cert(keys, name) for name in X509_KEYS]
    assert len({c.serial_number for c in certs}) == len(certs)
    assert len({c.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
                for c in certs}) == len(certs)  # fmt: skip


def test_private_keys_are_unencrypted_pkcs8(keys: KeySet) -> None:
    for name in (*X509_KEYS, RELEASE, RELEASE_IMAGE):
        text = keys.key(name).read_text()
        assert text.startswith("-----BEGIN PRIVATE KEY-----\n"), name  # PKCS#8, not "RSA PRIVATE KEY"
        load_key(keys.key(name))


def test_the_release_key_signs_and_its_public_half_verifies(keys: KeySet) -> None:
    private = load_key(keys.key(RELEASE))
    public = serialization.load_pem_public_key(keys.release_public.read_bytes())
    assert isinstance(private, ed25519.Ed25519PrivateKey) and isinstance(public, ed25519.Ed25519PublicKey)
    assert keys.release_public.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    signature = private.sign(b"SHA256SUMS")
    public.verify(signature, b"SHA256SUMS")
    with pytest.raises(InvalidSignature):
        public.verify(signature, b"SHA256SUMS tampered")


def test_the_image_release_key_is_ecdsa_p256_and_signs_what_its_public_half_verifies(keys: KeySet) -> None:
    private = load_key(keys.key(RELEASE_IMAGE))
    public = serialization.load_pem_public_key(keys.release_image_public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(private.curve, ec.SECP256R1)
    assert isinstance(public, ec.EllipticCurvePublicKey) and isinstance(public.curve, ec.SECP256R1)
    assert keys.release_image_public.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    signature = private.sign(b"payload", ec.ECDSA(hashes.SHA256()))
    public.verify(signature, b"payload", ec.ECDSA(hashes.SHA256()))
    with pytest.raises(InvalidSignature):
        public.verify(signature, b"payload tampered", ec.ECDSA(hashes.SHA256()))


def test_owner_guid_is_one_line_of_a_random_uuid(keys: KeySet) -> None:
    text = keys.owner_guid_file.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    assert uuid.UUID(text.strip()).version == 4 and keys.owner_guid() == text.strip()


# Files and modes


def test_private_keys_are_0600_in_a_0700_directory(keys: KeySet) -> None:
    assert mode(keys.root) == 0o700
    for name in (*X509_KEYS, RELEASE, RELEASE_IMAGE):
        assert mode(keys.key(name)) == 0o600, name
        keys.require(keys.key(name), private=True)
    for path, _ in files(keys):
        if path.suffix != ".key":
            assert mode(path) == 0o644, path


def test_every_listed_file_and_nothing_else_is_written(keys: KeySet) -> None:
    assert sorted(p.name for p in keys.root.iterdir()) == sorted(p.name for p, _ in files(keys))


def test_an_existing_directory_keeps_its_mode_and_missing_parents_are_made(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o750)
    os.chmod(mine, 0o750)
    generate(mine)
    assert mode(mine) == 0o750
    nested = tmp_path / "a" / "b" / "keys"
    generate(nested)
    assert mode(nested) == 0o700 and nested.joinpath("PK.key").is_file()


# Refusals


@pytest.mark.parametrize("existing", ["PK.key", "db.crt", "release.pub", "owner.guid", "KEK.esl", "db.auth"])
def test_a_directory_with_any_key_file_is_refused_and_left_alone(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_bytes(b"the user's own")
    (tmp_path / "notes.txt").write_bytes(b"unrelated")
    before = listing(tmp_path)
    with pytest.raises(InputError, match=f"holds keys already \\({existing}\\).*nothing was written.*--force"):
        generate(tmp_path)
    assert listing(tmp_path) == before


def test_a_second_run_is_refused_without_touching_the_first_set(tmp_path: Path) -> None:
    generate(tmp_path)
    before = listing(tmp_path)
    with pytest.raises(InputError, match=r"PK\.key and 23 more"):
        generate(tmp_path)
    assert listing(tmp_path) == before


def test_force_replaces_every_file(tmp_path: Path) -> None:
    first = KeySet(tmp_path)
    generate(tmp_path)
    before = listing(tmp_path)
    os.chmod(first.key("db"), 0o644)
    generate(tmp_path, force=True)
    after = listing(tmp_path)
    assert after.keys() == before.keys()
    for name in (*X509_KEYS, RELEASE):
        for path in (first.key(name), first.cert(name) if name != RELEASE else first.release_public):
            assert after[path.name] != before[path.name], path.name
        assert mode(first.key(name)) == 0o600
    assert after["owner.guid"] != before["owner.guid"]


def test_force_replaces_a_symlink_and_not_what_it_points_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"not a key")
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "PK.key").symlink_to(outside)
    generate(keys, force=True)
    assert outside.read_bytes() == b"not a key"
    assert not (keys / "PK.key").is_symlink() and mode(keys / "PK.key") == 0o600


def test_force_refuses_a_directory_where_a_key_belongs(tmp_path: Path) -> None:
    (tmp_path / "db.key").mkdir()
    with pytest.raises(InputError, match="a directory where a key file belongs"):
        generate(tmp_path, force=True)


def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        generate(tmp_path / "keys")


@pytest.mark.parametrize("name", ["", "  ", "A" * 58, "evil\x1b[2J", "two\nlines"])
def test_bad_common_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="--name"):
        generate(tmp_path / "keys", common_name=name)
    assert not (tmp_path / "keys").exists()


def test_a_failed_run_leaves_no_key_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(keys: KeySet) -> None:
        raise BuildError("sign-efi-sig-list failed (exit 1): no")

    monkeypatch.setattr(generate_module, "write_signature_lists", fail)
    with pytest.raises(BuildError):
        generate(tmp_path / "keys")
    assert list((tmp_path / "keys").iterdir()) == []  # not even the staging directory
    monkeypatch.setattr(generate_module, "write_signature_lists", fake_lists)
    generate(tmp_path / "keys")  # and the next run needs no --force


# KeySet.require


def test_require_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing from the key directory"):
        KeySet(tmp_path).require(KeySet(tmp_path).key("db"), private=True)


def test_require_refuses_a_symlink_even_to_a_good_key(tmp_path: Path) -> None:
    real = tmp_path / "real.key"
    real.write_text("k")
    os.chmod(real, 0o600)
    (tmp_path / "db.key").symlink_to(real)
    with pytest.raises(InputError, match="not a regular file"):
        KeySet(tmp_path).require(tmp_path / "db.key", private=True)


def test_require_refuses_a_private_key_others_can_read(tmp_path: Path) -> None:
    keys = KeySet(tmp_path)
    keys.key("db").write_text("k")
    os.chmod(keys.key("db"), 0o644)
    with pytest.raises(InputError, match=r"mode 0644.*chmod 600"):
        keys.require(keys.key("db"), private=True)
    os.chmod(keys.key("db"), 0o600)
    assert keys.require(keys.key("db"), private=True) == keys.key("db")
    keys.cert("db").write_text("c")
    os.chmod(keys.cert("db"), 0o644)
    assert keys.require(keys.cert("db")) == keys.cert("db")  # a certificate may be readable


# EFI signature lists


def signature_list(
    kind: str,
    entries: list[tuple[str, bytes]],
    *,
    header: bytes = b"",
    sig_size: int | None = None,
    list_size: int | None = None,
) -> bytes:
    size = sig_size if sig_size is not None else 16 + len(entries[0][1])
    body = b"".join(uuid.UUID(owner).bytes_le + data for owner, data in entries)
    total = list_size if list_size is not None else 28 + len(header) + len(body)
    return uuid.UUID(kind).bytes_le + struct.pack("<III", total, len(header), size) + header + body


def test_a_list_is_read_in_efi_byte_order() -> None:
    data = signature_list(EFI_CERT_X509, [(OWNER, b"DER")])
    assert data[:4] == bytes.fromhex("a159c0a5")  # the GUID's first field is little-endian on disk
    assert parse_signature_list(data) == [(EFI_CERT_X509, OWNER, b"DER")]


def test_several_entries_lists_and_a_header_are_read() -> None:
    sha256 = "c1c41626-504c-4092-aca9-41f936934328"
    other = str(uuid.uuid4())
    data = signature_list(sha256, [(OWNER, b"a" * 32), (other, b"b" * 32)], header=b"HDR!")
    data += signature_list(EFI_CERT_X509, [(OWNER, b"cert")])
    assert parse_signature_list(data) == [
        (sha256, OWNER, b"a" * 32),
        (sha256, other, b"b" * 32),
        (EFI_CERT_X509, OWNER, b"cert"),
    ]
    assert parse_signature_list(b"") == []


GOOD = signature_list(EFI_CERT_X509, [(OWNER, b"cert")])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (GOOD[:27], "truncated header"),
        (GOOD[:-1], "list size"),  # truncated body: the list claims more than is there
        (GOOD + GOOD[:10], "truncated header at byte 48"),
        (signature_list(EFI_CERT_X509, [(OWNER, b"cert")], list_size=0xFFFFFFFF), "list size 4294967295"),
        (signature_list(EFI_CERT_X509, [(OWNER, b"cert")], list_size=10), "list size 10"),
        (signature_list(EFI_CERT_X509, [], sig_size=0), "signature size 0"),
        (signature_list(EFI_CERT_X509, [(OWNER, b"")], sig_size=16), "signature size 16"),
        (signature_list(EFI_CERT_X509, [(OWNER, b"cert")], sig_size=7), "signature size 7"),
        (GOOD[:20] + struct.pack("<I", 0xFFFFFFF0) + GOOD[24:], "list size"),  # header size past the end
    ],
)
def test_malformed_lists_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(InputError, match=f"malformed EFI signature list: .*{reason}"):
        parse_signature_list(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))
def test_any_bytes_are_read_or_refused_never_crash(tail: bytes, list_size: int, header: int, size: int) -> None:
    data = uuid.UUID(EFI_CERT_X509).bytes_le + struct.pack("<III", list_size, header, size) + tail
    for candidate in (data, tail):
        try:
            entries = parse_signature_list(candidate)
        except InputError:
            continue
        assert sum(16 + len(payload) for _, _, payload in entries) <= len(candidate)


# The command line


def test_the_command_lists_what_it_wrote_and_refuses_a_second_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "keys"
    assert main(["keys", "generate", str(root), "--name", "Acme Corp"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    keys = KeySet(root)
    assert len(lines) == len(files(keys)) + 1
    for (path, _), line in zip(files(keys), lines, strict=False):
        assert line.startswith(f"wrote {path}: ")
    assert "offline" in lines[-1] and "docs/secure-boot.md" in lines[-1]
    assert "PRIVATE KEY" not in out
    assert load_cert(keys, "db").subject.rfc4514_string() == "CN=Acme Corp db"

    before = listing(root)
    assert main(["keys", "generate", str(root)]) == 2
    err = capsys.readouterr().err
    assert "holds keys already" in err and "Traceback" not in err
    assert listing(root) == before
    assert main(["keys", "generate", str(root), "--force"]) == 0
    assert listing(root)["PK.key"] != before["PK.key"]


# --add-missing: a key directory made before the image release key existed


def test_add_missing_gives_an_older_key_set_the_image_key_and_changes_nothing_else(tmp_path: Path) -> None:
    generate(tmp_path)
    for path, _ in image_key_files(KeySet(tmp_path)):
        path.unlink()
    before = listing(tmp_path)
    written = add_missing(tmp_path)
    assert [p.name for p, _ in written] == ["release-image.key", "release-image.pub"]
    after = listing(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("release-image")} == before
    assert mode(KeySet(tmp_path).key(RELEASE_IMAGE)) == 0o600 and mode(KeySet(tmp_path).release_image_public) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kiln-keys-")]
    assert add_missing(tmp_path) == [] and listing(tmp_path) == after  # a second run has nothing to add


def test_add_missing_refuses_a_partial_set_and_half_a_key(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such key directory"):
        add_missing(tmp_path / "none")
    (tmp_path / "PK.key").write_bytes(b"x")
    with pytest.raises(InputError, match=r"not a whole key set .* is missing.*adds only release-image"):
        add_missing(tmp_path)
    generate(tmp_path / "set")
    KeySet(tmp_path / "set").release_image_public.unlink()
    with pytest.raises(InputError, match=r"release-image\.key: half of the image release key is there"):
        add_missing(tmp_path / "set")


def test_the_cli_adds_the_missing_key_and_refuses_force_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generate(tmp_path)
    for path, _ in image_key_files(KeySet(tmp_path)):
        path.unlink()
    assert main(["keys", "generate", str(tmp_path), "--add-missing"]) == 0
    assert "wrote" in capsys.readouterr().out and KeySet(tmp_path).release_image_public.is_file()
    assert main(["keys", "generate", str(tmp_path), "--add-missing", "--force"]) == 2
    assert "give one of them" in capsys.readouterr().err
