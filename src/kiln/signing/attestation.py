"""A release directory's provenance, checked: the DSSE envelope the release key signed, the statement
in it, and its subjects against the files on disk and the signed SHA256SUMS.

`kiln verify DIR` runs this after the SHA256SUMS check (kiln.signing.release.check_directory),
so one run names every problem. A directory without provenance passes as before (releases made
before Kiln wrote one); a provenance without its envelope fails, since nothing vouches for it.
The statement is trusted only once the envelope's signature holds, and read with bounds even then.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kiln.core.hashing import file_sha256
from kiln.signing import dsse
from kiln.signing.listing import digests_by_name
from kiln.signing.release import (
    ENVELOPE,
    MAX_PROVENANCE,
    PROVENANCE,
    SUMS,
    Checked,
    VerificationError,
    fingerprint,
    name_problem,
    read_signed,
)

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass
class ProvenanceCheck:
    """What the provenance check found: how many subjects the signed statement names, and every problem."""

    subjects: int  # 0 when the directory has no provenance
    problems: list[str]


def check_provenance(directory: Path, key: Ed25519PublicKey, checked: Checked) -> ProvenanceCheck:
    """The directory's provenance against `key` and against `checked` (its SHA256SUMS check)."""
    present = {name for name in (PROVENANCE, ENVELOPE) if os.path.lexists(directory / name)}
    if not present:
        return ProvenanceCheck(0, [])
    if ENVELOPE not in present:
        return ProvenanceCheck(0, [f"{ENVELOPE}: missing, so nothing vouches for {PROVENANCE}"])
    try:
        payload = signed_statement(directory, key)
        subjects = parse_subjects(payload)
    except VerificationError as exc:
        return ProvenanceCheck(0, exc.problems)
    problems = []
    if PROVENANCE in present:
        try:
            if read_signed(directory, PROVENANCE, MAX_PROVENANCE) != payload:
                problems.append(f"{PROVENANCE}: differs from the statement {ENVELOPE} signs")
        except VerificationError as exc:
            problems += exc.problems
    return ProvenanceCheck(len(subjects), problems + compare_subjects(directory, subjects, checked))


def signed_statement(directory: Path, key: Ed25519PublicKey) -> bytes:
    """The statement in the directory's envelope, once `key`'s signature over it holds."""
    data = read_signed(directory, ENVELOPE, dsse.MAX_ENVELOPE)
    try:
        return dsse.open_envelope(data, key)
    except dsse.NotSigned:
        why = (
            f"not signed by the key {fingerprint(key)} (the statement changed after signing, or another key signed it)"
        )
        raise VerificationError([f"{ENVELOPE}: not signed by the key {fingerprint(key)} ({why})"]) from None
    except dsse.EnvelopeError as exc:
        raise VerificationError([f"{ENVELOPE}: {exc}"]) from None


def parse_subjects(payload: bytes) -> dict[str, str]:
    """name -> sha256 of an in-toto Statement v1 carrying SLSA provenance v1; else a VerificationError."""
    try:
        statement = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        raise VerificationError([f"{ENVELOPE}: the signed statement is not JSON"]) from None
    if not isinstance(statement, dict):
        raise VerificationError([f"{ENVELOPE}: the signed statement is not a JSON object"])
    problems = []
    if statement.get("_type") != STATEMENT_TYPE:
        problems.append(f"_type is not {STATEMENT_TYPE}")
    if statement.get("predicateType") != SLSA_PROVENANCE:
        problems.append(f"predicateType is not {SLSA_PROVENANCE}")
    entries = statement.get("subject")
    if not isinstance(entries, list) or not entries:
        problems.append("no subject")
        entries = []
    subjects, wrong = digests_by_name([_subject(entry) for entry in entries], lambda name, _: f"{name}: named twice")
    problems += [f"subject[{index}]: {problem}" for index, problem in wrong.items()]
    if problems:
        raise VerificationError([f"{ENVELOPE}: {problem}" for problem in problems])
    return subjects


def _subject(entry: Any) -> tuple[str, str, str | None]:
    """(name, sha256, None) of one subject, or what is wrong with it third."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return "", "", "not an object with a name"
    digest = entry.get("digest")
    sha256 = digest.get("sha256") if isinstance(digest, dict) else None
    if not isinstance(sha256, str) or not _DIGEST.fullmatch(sha256):
        return "", "", "no sha256 digest (64 lowercase hex digits)"
    name = entry["name"]
    return name, sha256, name_problem(name)


def compare_subjects(directory: Path, subjects: dict[str, str], checked: Checked) -> list[str]:
    """Each subject against SHA256SUMS and the file on disk, and SHA256SUMS' names against the subjects."""
    problems = [problem for name, digest in subjects.items() for problem in _listing_problems(name, digest, checked)]
    files = set(checked.files)
    for name, digest in subjects.items():
        if name not in files:
            problems.append(f"{name}: a subject of the provenance, missing from the directory")
        elif name not in checked.matching or checked.listed.get(name) != digest:
            problems += _disk_problems(directory, name, digest)
    unattested = [name for name in checked.listed if name not in subjects]
    return problems + [f"{name}: listed in {SUMS} but not a subject of the provenance" for name in unattested]


def _listing_problems(name: str, digest: str, checked: Checked) -> list[str]:
    if not checked.listed:  # SHA256SUMS failed its own check, which said why
        return []
    listed = checked.listed.get(name)
    if listed is None:
        return [f"{name}: a subject of the provenance, not listed in {SUMS}"]
    if listed != digest:
        return [f"{name}: {SUMS} and the provenance give it different sha256s"]
    return []


def _disk_problems(directory: Path, name: str, digest: str) -> list[str]:
    """Hash a subject's file (one _scan found as a regular file, so no link is on its way)."""
    try:
        actual = file_sha256(directory / name, follow_links=False)
    except OSError as exc:
        return [f"{name}: cannot read ({exc.strerror})"]
    if actual != digest:
        return [f"{name}: changed since the provenance was signed (its sha256 is not the subject's)"]
    return []
