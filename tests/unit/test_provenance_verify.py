"""`kiln verify DIR` on a release directory with a provenance: the release key's DSSE envelope over it,
its subjects against the files and the signed SHA256SUMS, and one changed byte reported by name, exit 1."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.core.hashing import file_sha256
from kiln.signing import dsse
from kiln.signing.keyset import RELEASE, KeySet
from kiln.signing.release import (
    ENVELOPE,
    PROVENANCE,
    SUMS,
    VerificationError,
    load_private_key,
    parse_sums,
    sign_release,
    verify_directory,
)
from tests.conftest import Result
from tests.unit.test_release_signing import make_keys

ARTIFACTS = {"disk.raw": b"\0" * 70000 + b"disk", "boot/grub.cfg": b"menuentry kiln {}\n", "manifest.json": b"{}\n"}


def statement(directory: Path, names: list[str] | None = None) -> bytes:
    """A minimal SLSA provenance statement over the directory's files (what write_provenance makes)."""
    subjects = [
        {"name": name, "digest": {"sha256": file_sha256(directory / name)}}
        for name in sorted(names if names is not None else ARTIFACTS, key=str.encode)
    ]
    predicate = {
        "buildDefinition": {"buildType": "https://kiln.invalid/buildtypes/image/v1", "externalParameters": {}},
        "runDetails": {"builder": {"id": "https://kiln.invalid/builders/sandbox"}},
    }
    body = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": predicate,
    }
    return json.dumps(body, indent=2).encode() + b"\n"


def release(root: Path, keys: KeySet) -> Path:
    for name, data in ARTIFACTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / PROVENANCE).write_bytes(statement(root))
    sign_release(root, keys)
    return root


@pytest.fixture
def keys(tmp_path: Path) -> KeySet:
    return make_keys(tmp_path / "keys")


@pytest.fixture
def signed(tmp_path: Path, keys: KeySet) -> Path:
    return release(tmp_path / "out", keys)


def problems(directory: Path, keys: KeySet, kiln: Callable[..., Result]) -> list[str]:
    result = kiln("verify", str(directory), "--key", str(keys.release_public))
    assert result.code == 1, result
    assert "Traceback" not in result.err
    return result.err.strip().splitlines()


def test_signing_writes_the_envelope_and_leaves_the_provenance_out_of_the_sums(signed: Path, keys: KeySet) -> None:
    assert sorted(p.name for p in signed.iterdir()) == sorted(
        ["SHA256SUMS", "SHA256SUMS.sig", "boot", "disk.raw", "manifest.json", PROVENANCE, ENVELOPE]
    )
    assert PROVENANCE not in (signed / SUMS).read_text() and ENVELOPE not in (signed / SUMS).read_text()
    envelope = (signed / ENVELOPE).read_bytes()
    assert (
        dsse.open_envelope(envelope, load_private_key(keys.key(RELEASE)).public_key())
        == (signed / PROVENANCE).read_bytes()
    )
    assert sorted(verify_directory(signed, keys.release_public)) == sorted(ARTIFACTS, key=str.encode)


def test_kiln_verify_checks_the_provenance(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    result = kiln("verify", str(signed), "--key", str(keys.release_public))
    assert result.code == 0, result
    assert "verified 3 files" in result.out
    assert f"verified the provenance of out: 3 subjects ({ENVELOPE} signed by" in result.out
    as_json = kiln("verify", str(signed), "--key", str(keys.release_public), "--json")
    assert json.loads(as_json.out)["provenance"] == {"subjects": 3}


def test_one_changed_byte_names_the_artifact(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    data = bytearray((signed / "disk.raw").read_bytes())
    data[1000] ^= 1
    (signed / "disk.raw").write_bytes(bytes(data))
    assert problems(signed, keys, kiln) == [
        "disk.raw: checksum differs",
        "disk.raw: changed since the provenance was signed (its sha256 is not the subject's)",
    ]


def test_a_changed_statement_is_refused(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    (signed / PROVENANCE).write_bytes((signed / PROVENANCE).read_bytes().replace(b"sandbox", b"docker"))
    assert problems(signed, keys, kiln) == [f"{PROVENANCE}: differs from the statement {ENVELOPE} signs"]


def test_a_changed_envelope_payload_is_refused(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    envelope = json.loads((signed / ENVELOPE).read_bytes())
    payload = (signed / PROVENANCE).read_bytes().replace(b"sandbox", b"docker")
    envelope["payload"] = base64.b64encode(payload).decode()
    (signed / ENVELOPE).write_text(json.dumps(envelope) + "\n")
    [line] = problems(signed, keys, kiln)
    assert line.startswith(f"{ENVELOPE}: not signed by the key ") and "the statement changed after signing" in line


def test_an_envelope_from_another_key_is_refused(
    tmp_path: Path, signed: Path, keys: KeySet, kiln: Callable[..., Result]
) -> None:
    other = make_keys(tmp_path / "other")
    envelope = dsse.sign((signed / PROVENANCE).read_bytes(), load_private_key(other.key(RELEASE)), "other")
    (signed / ENVELOPE).write_bytes(envelope)
    [line] = problems(signed, keys, kiln)
    assert line.startswith(f"{ENVELOPE}: not signed by the key ")


def test_an_unsigned_provenance_is_refused(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    (signed / ENVELOPE).unlink()
    assert problems(signed, keys, kiln) == [f"{ENVELOPE}: missing, so nothing vouches for {PROVENANCE}"]


def test_the_envelope_alone_is_enough(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    (signed / PROVENANCE).unlink()
    assert kiln("verify", str(signed), "--key", str(keys.release_public)).code == 0


def test_subjects_and_sha256sums_must_name_the_same_files(
    tmp_path: Path, keys: KeySet, kiln: Callable[..., Result]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name, data in ARTIFACTS.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    (out / PROVENANCE).write_bytes(statement(out, ["disk.raw", "manifest.json"]))  # grub.cfg left out
    sign_release(out, keys)
    assert problems(out, keys, kiln) == [f"boot/grub.cfg: listed in {SUMS} but not a subject of the provenance"]


def test_a_subject_missing_from_the_directory(signed: Path, keys: KeySet, kiln: Callable[..., Result]) -> None:
    shutil.rmtree(signed / "boot")
    assert problems(signed, keys, kiln) == [
        "boot/grub.cfg: listed but missing",
        "boot/grub.cfg: a subject of the provenance, missing from the directory",
    ]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace(b"Statement/v1", b"Statement/v0.1"), "_type is not https://in-toto.io/Statement/v1"),
        (lambda s: s.replace(b"provenance/v1", b"provenance/v0.2"), "predicateType is not https://slsa.dev/"),
        (lambda s: s.replace(b'"disk.raw"', b'"../disk.raw"'), "subject[1]: ../disk.raw: a '..' component"),
    ],
)
def test_a_signed_but_malformed_statement_is_refused(
    signed: Path, keys: KeySet, kiln: Callable[..., Result], edit: Callable[[bytes], bytes], message: str
) -> None:
    """Even the release key's signature does not make a statement Kiln cannot read trusted."""
    payload = edit((signed / PROVENANCE).read_bytes())
    (signed / PROVENANCE).write_bytes(payload)
    (signed / ENVELOPE).write_bytes(dsse.sign(payload, load_private_key(keys.key(RELEASE)), ""))
    lines = problems(signed, keys, kiln)
    assert any(line.startswith(f"{ENVELOPE}: {message}") for line in lines), lines


def test_a_release_without_provenance_verifies_as_before(
    tmp_path: Path, keys: KeySet, kiln: Callable[..., Result]
) -> None:
    out = tmp_path / "old"
    out.mkdir()
    (out / "disk.raw").write_bytes(b"disk")
    sign_release(out, keys)
    result = kiln("verify", str(out), "--key", str(keys.release_public))
    assert result.code == 0 and "provenance" not in result.out


def test_sha256sums_listing_the_provenance_is_refused() -> None:
    with pytest.raises(VerificationError, match="lists the provenance"):
        parse_sums(f"{'0' * 64}  {PROVENANCE}\n".encode())
