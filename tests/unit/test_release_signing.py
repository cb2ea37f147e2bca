"""Signed release checksums: SHA256SUMS + its Ed25519 signature, checked by Kiln, openssl and sha256sum."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kiln.core.errors import InputError, InputErrors
from kiln.core.tools import run
from kiln.signing.keyset import RELEASE, KeySet
from kiln.signing.release import (
    SIGNATURE,
    SUMS,
    VerificationError,
    sign_release,
    sign_sums,
    verify_directory,
    write_sums,
)
from tests.conftest import Result

FILES = {
    "disk.raw": b"\0" * (3 << 19) + b"end of disk",  # 1.5 MiB: more than one hashing chunk
    "vmlinuz": b"fake kernel",
    "boot/grub/grub.cfg": b"menuentry kiln {}\n",
    "boot.txt": b"sorts before boot/ as bytes",
    "Z.txt": b"sorts before a as bytes",
    "a b.txt": b"a space in the name",
}
NAMES = sorted(FILES, key=str.encode)


def make_keys(root: Path) -> KeySet:
    """A key directory holding only a release key, written the way keyset.py documents."""
    root.mkdir(parents=True)
    key = Ed25519PrivateKey.generate()
    keys = KeySet(root)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    keys.key(RELEASE).write_bytes(pem)
    keys.key(RELEASE).chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    keys.release_public.write_bytes(public)
    return keys


def fingerprint_of(keys: KeySet) -> str:
    """The fingerprint computed independently of release.py: sha256 of the raw key, 16 hex digits."""
    public = serialization.load_pem_public_key(keys.release_public.read_bytes())
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def make_tree(root: Path) -> Path:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def keys(tmp_path: Path) -> KeySet:
    return make_keys(tmp_path / "keys")


@pytest.fixture
def signed(tmp_path: Path, keys: KeySet) -> Path:
    out = make_tree(tmp_path / "out")
    sign_release(out, keys)
    return out


def problems(out: Path, keys: KeySet) -> list[str]:
    with pytest.raises(VerificationError) as caught:
        verify_directory(out, keys.release_public)
    assert caught.value.exit_code == 1
    return caught.value.problems


def test_round_trip(signed: Path, keys: KeySet) -> None:
    expected = "".join(f"{hashlib.sha256(FILES[name]).hexdigest()}  {name}\n" for name in NAMES)
    assert (signed / SUMS).read_text() == expected
    assert NAMES[:3] == ["Z.txt", "a b.txt", "boot.txt"]  # bytes order, not the locale's
    assert len((signed / SIGNATURE).read_bytes()) == 64
    assert verify_directory(signed, keys.release_public) == NAMES


def test_sha256sum_checks_the_sums(signed: Path) -> None:
    result = run(["sha256sum", "--strict", "-c", SUMS], cwd=signed)
    assert result.stdout.decode().count(": OK") == len(FILES)


def test_same_keys_and_files_give_the_same_bytes(tmp_path: Path, signed: Path, keys: KeySet) -> None:
    first = (signed / SUMS).read_bytes(), (signed / SIGNATURE).read_bytes()
    sign_release(signed, keys)
    assert ((signed / SUMS).read_bytes(), (signed / SIGNATURE).read_bytes()) == first
    other = make_tree(tmp_path / "elsewhere")
    sign_release(other, keys)
    assert ((other / SUMS).read_bytes(), (other / SIGNATURE).read_bytes()) == first
    assert not [p.name for p in signed.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_openssl_verifies_the_signature(signed: Path, keys: KeySet) -> None:
    argv = ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(keys.release_public), "-rawin"]
    argv += ["-in", str(signed / SUMS), "-sigfile", str(signed / SIGNATURE)]
    assert "Signature Verified Successfully" in run(argv).stdout.decode()
    with (signed / SUMS).open("ab") as sums:
        sums.write(b"\n")
    assert run(argv, ok=(0, 1)).returncode == 1


def test_a_changed_byte(signed: Path, keys: KeySet) -> None:
    data = bytearray((signed / "disk.raw").read_bytes())
    data[len(data) // 2] ^= 1
    (signed / "disk.raw").write_bytes(bytes(data))
    assert problems(signed, keys) == ["disk.raw: checksum differs"]


def test_a_changed_sums_line(signed: Path, keys: KeySet) -> None:
    sums = (signed / SUMS).read_text()
    digest = hashlib.sha256(FILES["vmlinuz"]).hexdigest()
    (signed / "vmlinuz").write_bytes(b"evil kernel")
    (signed / SUMS).write_text(sums.replace(digest, hashlib.sha256(b"evil kernel").hexdigest()))
    [problem] = problems(signed, keys)
    assert problem.startswith(f"{SIGNATURE}: the signature does not match the key {fingerprint_of(keys)}")


def test_an_added_file(signed: Path, keys: KeySet) -> None:
    (signed / "boot" / "extra.efi").write_bytes(b"not signed")
    assert problems(signed, keys) == ["boot/extra.efi: not listed"]


def test_a_removed_file(signed: Path, keys: KeySet) -> None:
    (signed / "vmlinuz").unlink()
    assert problems(signed, keys) == ["vmlinuz: listed but missing"]


def test_every_problem_at_once(signed: Path, keys: KeySet) -> None:
    (signed / "vmlinuz").unlink()
    (signed / "Z.txt").write_bytes(b"changed")
    (signed / "new").write_bytes(b"added")
    assert sorted(problems(signed, keys)) == [
        "Z.txt: checksum differs",
        "new: not listed",
        "vmlinuz: listed but missing",
    ]


def test_a_signature_from_another_key(tmp_path: Path, signed: Path, keys: KeySet) -> None:
    sign_sums(signed, make_keys(tmp_path / "other").key(RELEASE))
    [problem] = problems(signed, keys)
    assert "the signature does not match the key" in problem


def test_a_truncated_signature(signed: Path, keys: KeySet) -> None:
    (signed / SIGNATURE).write_bytes((signed / SIGNATURE).read_bytes()[:63])
    assert problems(signed, keys) == [f"{SIGNATURE}: 63 bytes, not a 64-byte Ed25519 signature (truncated?)"]


def test_an_unsigned_directory(tmp_path: Path, keys: KeySet) -> None:
    out = make_tree(tmp_path / "plain")
    assert problems(out, keys) == [f"{SUMS}: missing"]


def test_a_symlink_is_refused_not_followed(tmp_path: Path, signed: Path, keys: KeySet) -> None:
    (tmp_path / "outside").write_bytes(b"not part of the release")
    os.symlink(tmp_path / "outside", signed / "boot" / "link")
    with pytest.raises(InputErrors) as caught:
        write_sums(signed)
    [error] = caught.value.errors
    assert str(error).endswith("boot/link: a symbolic link: only regular files are signed, links are not followed")
    assert problems(signed, keys) == [
        "boot/link: a symbolic link: only regular files are signed, links are not followed"
    ]


def test_a_fifo_is_refused(signed: Path, keys: KeySet) -> None:
    os.mkfifo(signed / "pipe")
    assert problems(signed, keys) == ["pipe: a special file (device, FIFO or socket): only regular files are signed"]


def test_a_symlinked_sums_file_is_not_read(tmp_path: Path, signed: Path, keys: KeySet) -> None:
    shutil.move(signed / SUMS, tmp_path / "sums")
    os.symlink(tmp_path / "sums", signed / SUMS)
    [problem] = problems(signed, keys)
    assert problem.startswith(f"{SUMS}: cannot open")


VMLINUZ = hashlib.sha256(FILES["vmlinuz"]).hexdigest()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"{VMLINUZ}  /etc/passwd", "/etc/passwd: an absolute path"),
        (f"{VMLINUZ}  boot/../vmlinuz", "boot/../vmlinuz: a '..' component"),
        (f"{VMLINUZ}  boot//vmlinuz", "boot//vmlinuz: an empty or '.' component"),
        (f"{VMLINUZ[:63]}g  vmlinuz", f"'{VMLINUZ[:63]}g' is not a sha256 (64 lowercase hex digits)"),
        (f"{VMLINUZ.upper()}  vmlinuz", "is not a sha256 (64 lowercase hex digits)"),
        (f"{VMLINUZ} vmlinuz", "not '<sha256>  <relative path>'"),
        (f"{VMLINUZ}  {SUMS}", f"{SUMS}: lists the checksum files themselves"),
        (f"{VMLINUZ}  vmlinuz", "vmlinuz: listed twice (first on line 1)"),
    ],
)
def test_malformed_lines(signed: Path, keys: KeySet, line: str, message: str) -> None:
    """Each line is signed, so only the parser can refuse it; the first line stays a valid one."""
    (signed / SUMS).write_text(f"{VMLINUZ}  vmlinuz\n{line}\n")
    sign_sums(signed, keys.key(RELEASE))
    [problem] = problems(signed, keys)
    assert problem.startswith(f"{SUMS}:2: ")
    assert message in problem


def test_a_sums_file_without_its_last_newline(signed: Path, keys: KeySet) -> None:
    (signed / SUMS).write_bytes((signed / SUMS).read_bytes()[:-1])
    sign_sums(signed, keys.key(RELEASE))
    assert problems(signed, keys) == [f"{SUMS}: does not end with a newline (truncated?)"]


def test_a_private_key_others_can_read_is_refused(signed: Path, keys: KeySet) -> None:
    keys.key(RELEASE).chmod(0o640)
    with pytest.raises(InputError, match="a private key others can read"):
        sign_release(signed, keys)


def test_cli_verifies(kiln: Callable[..., Result], signed: Path, keys: KeySet) -> None:
    result = kiln("verify", "out", "--key", "keys/release.pub")
    assert (result.code, result.err) == (0, "")
    assert result.out == f"verified {len(FILES)} files in out (SHA256SUMS signed by {fingerprint_of(keys)})\n"


def test_cli_takes_the_key_from_the_environment(
    kiln: Callable[..., Result], signed: Path, keys: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_RELEASE_KEY", str(keys.release_public))
    assert kiln("verify", "out").code == 0


def test_cli_reports_tampering(kiln: Callable[..., Result], signed: Path, keys: KeySet) -> None:
    (signed / "vmlinuz").write_bytes(b"evil kernel")
    result = kiln("verify", "out", "--key", "keys/release.pub")
    assert (result.code, result.out, result.err) == (1, "", "vmlinuz: checksum differs\n")


def test_cli_needs_a_key(kiln: Callable[..., Result], signed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_RELEASE_KEY", raising=False)
    result = kiln("verify", "out")
    assert result.code == 2
    assert "--key release.pub" in result.err
