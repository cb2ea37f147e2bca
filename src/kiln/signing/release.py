"""Signed release checksums: SHA256SUMS over an output directory, signed with the release key.

Layout of a signed directory (what `kiln verify` and plain tools check):

    SHA256SUMS      `<sha256 hex>  <relative/path>` per regular file below the directory (GNU
                    coreutils' format, so `sha256sum -c SHA256SUMS` checks it too), sorted by path
                    as bytes; SHA256SUMS and SHA256SUMS.sig at the top are not listed
    SHA256SUMS.sig  the raw 64-byte Ed25519 signature of SHA256SUMS' bytes, which
                    `openssl pkeyutl -verify -pubin -inkey release.pub -rawin` checks
    provenance.intoto.json   the SLSA provenance of the directory (kiln.image.provenance), when
                    `kiln image` wrote one; it records when the build ran, so it is not listed
                    in SHA256SUMS (whose bytes must be the same for the same inputs)
    provenance.intoto.jsonl  the provenance in a DSSE envelope signed with the same key
                    (kiln.signing.dsse), what kiln.signing.attestation checks

Ed25519 signatures are deterministic, so the same key over the same files gives the same bytes.
Only regular files are signed: a symbolic link or special file in the tree is refused, never
followed, since what it points to is not part of the release. A verifier trusts nothing in the
directory before the signature over SHA256SUMS holds, and reads SHA256SUMS with bounds even then.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kiln.core.errors import InputError, InputErrors, KilnError, printable
from kiln.core.hashing import file_sha256
from kiln.signing import dsse
from kiln.signing.keyset import RELEASE, KeySet
from kiln.signing.listing import digests_by_name

SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.sig"
PROVENANCE = "provenance.intoto.json"
ENVELOPE = "provenance.intoto.jsonl"  # JSON Lines of DSSE envelopes, as SLSA's own generators name theirs
UNLISTED = (SUMS, SIGNATURE, PROVENANCE, ENVELOPE)  # files at the top that SHA256SUMS never lists
MAX_PROVENANCE = 16 << 20  # bytes of a provenance a verifier reads
SIGNATURE_SIZE = 64  # an Ed25519 signature
MAX_SUMS = 16 << 20  # bytes of SHA256SUMS a verifier reads: ~150,000 files, far above any release
MAX_KEY = 64 << 10  # bytes of a PEM key file
FINGERPRINT = 16  # hex digits of a key fingerprint shown to users
_DIGEST = re.compile(r"[0-9a-f]{64}")
# sha256sum escapes names holding a backslash or newline; refusing them keeps one plain format
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f\\]")


class VerificationError(KilnError):
    """A directory failed its check against the signed SHA256SUMS: one line per problem.

    Exit 1, not 2: the command was right and its input was read, the release is not what was
    signed; scripts can tell "fix your command" (2) from "do not trust these files" (1).
    """

    exit_code = 1

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [printable(problem) for problem in problems]
        super().__init__("\n".join(self.problems))


@dataclass
class _Tree:
    """What a directory holds: regular files (relative POSIX names) and what was refused, and why."""

    files: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def write_sums(directory: Path) -> Path:
    """Write `directory`/SHA256SUMS (see the module docstring); same tree, same bytes."""
    tree = _scan(_require_directory(directory))
    if tree.refused:
        raise InputErrors([InputError(f"{directory / name}: {why}") for name, why in tree.refused.items()])
    lines = [f"{_digest_or_fail(directory, name)}  {name}\n" for name in tree.files]
    path = directory / SUMS
    _write_atomic(path, "".join(lines).encode())
    return path


def sign_sums(directory: Path, private_key: Path) -> Path:
    """Write `directory`/SHA256SUMS.sig, the raw Ed25519 signature of SHA256SUMS, with `private_key`."""
    return _sign(directory, load_private_key(private_key))


def sign_release(directory: Path, keys: KeySet) -> None:
    """Checksum and sign `directory` with the key directory's release key, and sign its provenance
    (when it has one) into a DSSE envelope beside it."""
    key = load_private_key(keys.key(RELEASE))  # a bad key fails before GiB of images are hashed
    write_sums(directory)
    _sign(directory, key)
    if (directory / PROVENANCE).is_file():
        sign_provenance(directory, key)


def sign_provenance(directory: Path, key: Ed25519PrivateKey) -> Path:
    """Write `directory`/provenance.intoto.jsonl: the provenance's bytes in a DSSE envelope signed by `key`."""
    statement = _read_input(directory / PROVENANCE, MAX_PROVENANCE)
    path = directory / ENVELOPE
    _write_atomic(path, dsse.sign(statement, key, fingerprint(key.public_key())))
    return path


def _sign(directory: Path, key: Ed25519PrivateKey) -> Path:
    data = _read_input(directory / SUMS, MAX_SUMS)
    path = directory / SIGNATURE
    _write_atomic(path, key.sign(data))
    return path


@dataclass
class Checked:
    """A directory checked against its signed SHA256SUMS: what it lists, what is there, what is wrong."""

    listed: dict[str, str]  # name -> sha256 from SHA256SUMS once its signature held; else empty
    files: list[str]  # the regular files below the directory, as _scan found them (no link entered)
    matching: set[str]  # the listed files whose bytes hash to their line's digest
    problems: list[str]


def check_directory(directory: Path, key: Ed25519PublicKey) -> Checked:
    """Every difference between `directory` and the SHA256SUMS `key` signed (see verify_directory)."""
    _require_directory(directory)
    try:
        sums = read_signed(directory, SUMS, MAX_SUMS)
        _check_signature(key, sums, read_signed(directory, SIGNATURE, SIGNATURE_SIZE))
        listed = parse_sums(sums)
    except VerificationError as exc:
        return Checked({}, _scan(directory).files, set(), exc.problems)
    tree = _scan(directory)
    problems, matching = _compare(directory, listed, tree)
    return Checked(listed, tree.files, matching, problems)


def verify_directory(directory: Path, public_key: Path) -> list[str]:
    """The names SHA256SUMS lists, once its signature holds and every file matches it exactly.

    Nothing may be missing, changed or added (an added file is tampering too). Raises a
    VerificationError naming every problem; a bad key file or DIR is an InputError.
    """
    checked = check_directory(directory, load_public_key(public_key))
    if checked.problems:
        raise VerificationError(checked.problems)
    return list(checked.listed)


def fingerprint(key: Ed25519PublicKey) -> str:
    """sha256 of the key's 32 raw bytes, shortened: how messages name a release key."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:FINGERPRINT]


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in `path` (PKCS#8 PEM), after KeySet's owner-only check."""
    KeySet(path.parent).require(path, private=True)
    data = _read_input(path, MAX_KEY)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path}: not an Ed25519 key (the release key is Ed25519)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in `path` (SubjectPublicKeyInfo PEM, release.pub)."""
    data = _read_input(path, MAX_KEY)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{path}: not an Ed25519 public key (the release key is Ed25519)")
    return key


def parse_sums(data: bytes) -> dict[str, str]:
    """name -> sha256 from SHA256SUMS' bytes, in file order; any malformed line is a VerificationError."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise VerificationError([f"{SUMS}: not UTF-8"]) from None
    if text and not text.endswith("\n"):
        raise VerificationError([f"{SUMS}: does not end with a newline (truncated?)"])
    lines = [_parse_line(line) for line in text.split("\n")[:-1]]
    listed, wrong = digests_by_name(lines, lambda name, first: f"{name}: listed twice (first on line {first + 1})")
    if wrong:
        raise VerificationError([f"{SUMS}:{index + 1}: {problem}" for index, problem in wrong.items()])
    return listed


def _parse_line(line: str) -> tuple[str, str, str | None]:
    """(name, digest, None) of one `<sha256>  <path>` line, or what is wrong with it third."""
    digest, separator, name = line.partition("  ")
    if not separator:
        return "", "", "not '<sha256>  <relative path>'"
    if not _DIGEST.fullmatch(digest):
        return "", "", f"{digest[:70]!r} is not a sha256 (64 lowercase hex digits)"
    return name, digest, name_problem(name)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a listed file's name: relative, canonical, plain; None if it can."""
    if name.startswith("/"):
        return f"{name}: an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return f"{name}: a '..' component"
    if "" in parts or "." in parts:
        return f"{name}: an empty or '.' component"
    if _UNSAFE_NAME.search(name):
        return f"{name}: a control character or backslash"
    if name in (SUMS, SIGNATURE):
        return f"{name}: lists the checksum files themselves"
    if name in (PROVENANCE, ENVELOPE):
        return f"{name}: lists the provenance, which records when it ran and is signed on its own"
    return None


def _check_signature(key: Ed25519PublicKey, sums: bytes, signature: bytes) -> None:
    if len(signature) != SIGNATURE_SIZE:
        raise VerificationError(
            [f"{SIGNATURE}: {len(signature)} bytes, not a {SIGNATURE_SIZE}-byte Ed25519 signature (truncated?)"]
        )
    try:
        key.verify(signature, sums)
    except InvalidSignature:
        why = f"the signature does not match the key {fingerprint(key)} (SHA256SUMS changed, or another key signed it)"
        raise VerificationError([f"{SIGNATURE}: {why}"]) from None


def _compare(directory: Path, listed: dict[str, str], tree: _Tree) -> tuple[list[str], set[str]]:
    """Every difference between the tree and SHA256SUMS (refused, missing, changed, unlisted), and
    the listed names whose files match."""
    problems = [f"{name}: {why}" for name, why in tree.refused.items()]
    matching: set[str] = set()
    found = set(tree.files)
    for name, digest in listed.items():
        if name in tree.refused:
            continue
        if name not in found:
            problems.append(f"{name}: listed but missing")
            continue
        try:
            actual = file_sha256(directory / name, follow_links=False)
        except OSError as exc:
            problems.append(f"{name}: cannot read ({exc.strerror})")
            continue
        if actual != digest:
            problems.append(f"{name}: checksum differs")
        else:
            matching.add(name)
    problems += [f"{name}: not listed" for name in tree.files if name not in listed]
    return problems, matching


def _scan(directory: Path) -> _Tree:
    """Regular files below `directory` sorted by name as bytes, without following any link."""
    tree = _Tree()
    _scan_into(directory, "", tree)
    tree.files.sort(key=str.encode)
    return tree


def _scan_into(directory: Path, prefix: str, tree: _Tree) -> None:
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        tree.refused[prefix.rstrip("/") or "."] = f"cannot read the directory ({exc.strerror})"
        return
    for entry in entries:
        name = prefix + entry.name
        if not prefix and entry.name in UNLISTED:
            continue
        why = _entry_problem(entry, name)
        if why is not None:
            tree.refused[name] = why
        elif entry.is_dir(follow_symlinks=False):
            _scan_into(Path(entry.path), name + "/", tree)
        else:
            tree.files.append(name)


def _entry_problem(entry: os.DirEntry[str], name: str) -> str | None:
    """Why a directory entry cannot be signed (a link, a device, a name sha256sum would escape)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if _UNSAFE_NAME.search(name):
        return "a name with a control character or backslash"
    if entry.is_symlink():
        return "a symbolic link: only regular files are signed, links are not followed"
    if not entry.is_dir(follow_symlinks=False) and not entry.is_file(follow_symlinks=False):
        return "a special file (device, FIFO or socket): only regular files are signed"
    return None


def _digest_or_fail(directory: Path, name: str) -> str:
    try:
        return file_sha256(directory / name, follow_links=False)
    except OSError as exc:
        raise InputError(f"{directory / name}: cannot read ({exc.strerror})") from None


def _require_directory(directory: Path) -> Path:
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    return directory


class _Unreadable(Exception):
    """Why a file could not be read within its bounds; callers turn it into their own error."""


def read_key_file(path: Path, limit: int = MAX_KEY) -> bytes:
    """A key file the user named, at most `limit` bytes: problems are InputErrors (exit 2)."""
    return _read_input(path, limit)


def _read_input(path: Path, limit: int) -> bytes:
    """A file the user named (a key): problems are InputErrors."""
    try:
        return _read_bounded(path, limit)
    except _Unreadable as exc:
        raise InputError(f"{path}: {exc}") from None


def read_signed(directory: Path, name: str, limit: int) -> bytes:
    """A file a signature vouches for (SHA256SUMS, its signature, the provenance): problems mean the
    directory fails verification."""
    try:
        return _read_bounded(directory / name, limit)
    except _Unreadable as exc:
        raise VerificationError([f"{name}: {exc}"]) from None


def _read_bounded(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, opened without following a link or blocking on a FIFO."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise _Unreadable("missing") from None
    except OSError as exc:
        raise _Unreadable(f"cannot open ({exc.strerror}; a symbolic link is not followed)") from None
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Unreadable("not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _Unreadable(f"larger than {limit} bytes")
    return data


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsynced, renamed over it."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)  # checksums and signatures are published; mkstemp made it 0600
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    directory_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)
