"""A release directory's provenance read as a build to replay: someone else's input, checked field by field.

The statement comes from whoever made the release. It is read to at most MAX_PROVENANCE bytes
through no link (or taken from the DSSE envelope once the release key's signature holds), and
every field the rebuild uses is checked for its type and shape before anything runs: the commit
is a git object name, the profile's name a plain name (profile.schema.json's pattern: one path
component, never '.' or '..'), variables are identifiers with strings, platforms are
linux/amd64 or linux/arm64, the runner one Kiln has, extensions printable. Nothing read here
reaches a shell; what reaches a command line is an argument of its own (`--set=NAME=VALUE`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kiln.core.errors import InputError, InputErrors, KilnError, printable
from kiln.core.hashing import json_sha256
from kiln.core.project import RUNNERS
from kiln.core.secrets import REDACTED
from kiln.signing.attestation import check_provenance, parse_subjects, signed_statement
from kiln.signing.release import (
    ENVELOPE,
    MAX_PROVENANCE,
    PROVENANCE,
    VerificationError,
    check_directory,
    read_signed,
)

BUILD_TYPE = "https://kiln.invalid/buildtypes/image/v1"  # kiln.image.provenance's (a test keeps them one)
BUILDERS = "https://kiln.invalid/builders/"  # builder.id is this and the runner's name
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")  # profile.schema.json's name, bounded
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a SHA-1 or SHA-256 repository's object name
PLATFORM = re.compile(r"linux/(?:amd64|arm64)")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # --set's names (identifiers)
MAX_DIRECTORIES = 256  # output directories under one release
MAX_ITEMS = 4096  # entries of any list or mapping the rebuild reads (packages, sources, variables)
MAX_TEXT = 64 << 10  # characters of one variable's value or extension reference
MAX_DEPTH = 32  # how deep a schematic's fields are searched for what was redacted


@dataclass(frozen=True)
class Schematic:
    """The schematic a directory was customised with: its ID and its fields as the provenance shows them."""

    id: str
    fields: dict[str, Any]

    @property
    def replayable(self) -> bool:
        """Whether the fields are the schematic itself: redaction changes them, and so their ID."""
        return json_sha256(self.fields) == self.id

    def redacted(self) -> list[str]:
        """Dotted paths of the fields the provenance shows as redacted."""
        return list(_redacted_paths(self.fields, ()))


@dataclass(frozen=True)
class Recorded:
    """What one output directory's provenance says made it, checked."""

    directory: Path
    name: str  # the profile's name: the directory's, a plain name
    commit: str | None  # None: built outside a git checkout
    dirty: bool
    profile_sha256: str
    schematic: Schematic | None
    platforms: tuple[str, ...]
    variables: tuple[tuple[str, str], ...]
    given_extensions: tuple[str, ...]  # what `kiln image --extension` must add to the profile's own
    runner: str
    kiln_version: str
    subjects: dict[str, str] = field(default_factory=dict)  # name -> sha256, as the statement lists them
    dependencies: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> digest set
    seed_tarball: bool = False  # the seed was a tarball (kiln --from-tar or stage0.yaml's tarball:)


def output_directories(release: Path) -> list[Path]:
    """RELEASE_DIR itself when it holds a provenance, else each directory in it that does (no link followed)."""
    if not release.is_dir() or release.is_symlink():
        raise InputError(f"{release}: not a directory")
    if _has_provenance(release):
        return [release]
    found = []
    for entry in sorted(os.scandir(release), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and _has_provenance(Path(entry.path)):
            found.append(Path(entry.path))
        if len(found) > MAX_DIRECTORIES:
            raise InputError(f"{release}: more than {MAX_DIRECTORIES} output directories")
    if not found:
        raise InputError(
            f"{release}: no {PROVENANCE} in it or in its directories: nothing records how it was made "
            "(kiln image writes one into every output directory)"
        )
    return found


def _has_provenance(directory: Path) -> bool:
    return any(os.path.lexists(directory / name) for name in (PROVENANCE, ENVELOPE))


def read_statement(directory: Path, key: Ed25519PublicKey | None) -> tuple[bytes, list[str]]:
    """The statement to replay, and what plain `kiln verify` finds wrong with the directory's files.

    With a key, the statement is the one the envelope signs, and only once SHA256SUMS' signature and
    the envelope's hold (else a VerificationError: nothing in the directory can be trusted). Files
    that no longer match are returned as problems: the rebuild still runs and tells which side is right.
    """
    if key is None:
        try:
            return read_signed(directory, PROVENANCE, MAX_PROVENANCE), []
        except VerificationError as exc:
            raise InputError(f"{directory}/{exc.problems[0]}") from None
    checked = check_directory(directory, key)
    if not checked.listed:
        raise VerificationError(checked.problems)
    if not os.path.lexists(directory / ENVELOPE):
        raise VerificationError(
            [f"{ENVELOPE}: missing, so nothing the release key signed says how {directory} was made"]
        )
    payload = signed_statement(directory, key)
    return payload, checked.problems + check_provenance(directory, key, checked).problems


def parse(directory: Path, data: bytes) -> Recorded:
    """The build `data` (a statement's bytes) records for `directory`; every problem at once, as InputErrors."""
    where = f"{directory}/{PROVENANCE}"
    try:
        statement = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{where}: not JSON (or nested too deeply)") from None
    reader = _Reader(where)
    definition = reader.mapping(statement, ("predicate", "buildDefinition"))
    if reader.text(definition, ("buildType",)) != BUILD_TYPE:
        reader.problem("buildType", f"is not {BUILD_TYPE} (what kiln image writes)")
    given = reader.mapping(definition, ("externalParameters",))
    dependencies = reader.dependencies(definition)
    recorded = _recorded(reader, directory, given, dependencies, reader.mapping(statement, ("predicate", "runDetails")))
    subjects = reader.subjects(data)
    reader.raise_problems()
    return replace(recorded, subjects=subjects)


def _recorded(
    reader: _Reader, directory: Path, given: dict[str, Any], dependencies: dict[str, Any], run: dict[str, Any]
) -> Recorded:
    """The Recorded of parse's pieces; problems go to `reader`."""
    profile = reader.mapping(given, ("profile",))
    name = profile.get("name", directory.name)
    if not isinstance(name, str) or not PROFILE_NAME.fullmatch(name):
        reader.problem("profile.name", f"{str(name)[:80]!r} is not a plain profile name ({PROFILE_NAME.pattern})")
        name = "?"
    project = dependencies.get("project", {})
    schematic = reader.schematic(given, dependencies)
    extensions = reader.strings(given, ("extensions",))
    own = reader.strings(profile, ("input", "extensions"))
    builder = reader.text(run, ("builder", "id"))
    runner = builder.removeprefix(BUILDERS)
    if not builder.startswith(BUILDERS) or runner not in RUNNERS:
        reader.problem("builder.id", f"{builder[:80]!r} names no runner Kiln has ({', '.join(RUNNERS)})")
    return Recorded(
        directory=directory,
        name=name,
        commit=reader.commit(project),
        dirty=_object(project.get("annotations")).get("dirty") is True,
        profile_sha256=reader.sha256(dependencies, "profile"),
        schematic=schematic,
        platforms=reader.platforms(given),
        variables=reader.variables(given),
        given_extensions=reader.given_extensions(own, extensions),
        runner=runner,
        kiln_version=printable(reader.text(run, ("builder", "version", "kiln"), required=False)[:80]) or "unknown",
        dependencies={k: v.get("digest", {}) for k, v in dependencies.items()},
        seed_tarball="tarball" in _object(dependencies.get("stage0", {}).get("annotations")),
    )


def _redacted_paths(value: Any, path: tuple[str, ...]) -> list[str]:
    if len(path) > MAX_DEPTH:
        return []
    if value == REDACTED:
        return [".".join(path) or "(the whole value)"]
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    return [found for key, item in items[:MAX_ITEMS] for found in _redacted_paths(item, (*path, key))]


class _Reader:
    """Typed look-ups in the statement; each problem is kept with its field, all raised at the end."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []

    def problem(self, field_name: str, what: str) -> None:
        self.problems.append(f"{field_name}: {what}")

    def raise_problems(self) -> None:
        if self.problems:
            errors: list[KilnError] = [InputError(f"{self.where}: {p}") for p in self.problems]
            raise errors[0] if len(errors) == 1 else InputErrors(errors)

    def _at(self, document: Any, path: tuple[str, ...]) -> Any:
        for key in path:
            document = document.get(key) if isinstance(document, dict) else None
        return document

    def mapping(self, document: Any, path: tuple[str, ...]) -> dict[str, Any]:
        value = self._at(document, path)
        if not isinstance(value, dict):
            self.problem(".".join(path), "missing, or not an object")
            return {}
        return value

    def text(self, document: Any, path: tuple[str, ...], *, required: bool = True) -> str:
        value = self._at(document, path)
        if isinstance(value, str):
            return value
        if required or value is not None:
            self.problem(".".join(path), "missing, or not a string")
        return ""

    def strings(self, document: Any, path: tuple[str, ...]) -> tuple[str, ...]:
        """A list of printable strings (absent: empty)."""
        value = self._at(document, path)
        if value is None:
            return ()
        if not isinstance(value, list) or len(value) > MAX_ITEMS or not all(_plain_text(v) for v in value):
            self.problem(".".join(path), "not a list of printable strings")
            return ()
        return tuple(value)

    def subjects(self, data: bytes) -> dict[str, str]:
        """The statement's subjects as `kiln verify` reads them (names that stay in the directory)."""
        try:
            return parse_subjects(data)
        except VerificationError as exc:
            self.problems += [problem.removeprefix(f"{ENVELOPE}: ") for problem in exc.problems]
            return {}

    def dependencies(self, definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """resolvedDependencies by name (each an object with a digest of strings)."""
        entries = definition.get("resolvedDependencies")
        if not isinstance(entries, list) or len(entries) > MAX_ITEMS:
            self.problem("resolvedDependencies", f"missing, or not a list of at most {MAX_ITEMS}")
            return {}
        found: dict[str, dict[str, Any]] = {}
        for index, entry in enumerate(entries):
            digest = entry.get("digest") if isinstance(entry, dict) else None
            if not isinstance(entry.get("name") if isinstance(entry, dict) else None, str) or not (
                isinstance(digest, dict) and all(isinstance(v, str) for v in digest.values())
            ):
                self.problem(f"resolvedDependencies[{index}]", "not an object with a name and a digest of strings")
                continue
            found[entry["name"]] = entry
        return found

    def sha256(self, dependencies: dict[str, Any], name: str) -> str:
        value = dependencies.get(name, {}).get("digest", {}).get("sha256")
        if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
            self.problem(f"resolvedDependencies {name}", "no sha256 digest")
            return ""
        return value

    def commit(self, project: dict[str, Any]) -> str | None:
        """The project's git commit; None when the release was made outside git (no entry)."""
        if not project:
            return None
        value = project.get("digest", {}).get("gitCommit")
        if not isinstance(value, str) or not COMMIT.fullmatch(value):
            self.problem("resolvedDependencies project", "gitCommit is not a git object name (40 or 64 hex digits)")
            return None
        if not isinstance(_object(project.get("annotations")).get("dirty"), bool):
            self.problem("resolvedDependencies project", "annotations.dirty is not true or false")
        return value

    def schematic(self, given: dict[str, Any], dependencies: dict[str, Any]) -> Schematic | None:
        value = given.get("schematic")
        if value is None:
            return None
        fields = value.get("fields") if isinstance(value, dict) else None
        ident = value.get("id") if isinstance(value, dict) else None
        if not isinstance(fields, dict) or not isinstance(ident, str) or not re.fullmatch(r"[0-9a-f]{64}", ident):
            self.problem("externalParameters.schematic", "not an object with fields and a sha256 id")
            return None
        if ident != self.sha256(dependencies, "schematic"):
            self.problem("externalParameters.schematic", "its id is not resolvedDependencies' schematic digest")
        return Schematic(ident, fields)

    def platforms(self, given: dict[str, Any]) -> tuple[str, ...]:
        value = given.get("platforms")
        if (
            not isinstance(value, list)
            or not value
            or len(set(map(str, value))) != len(value)
            or not all(isinstance(p, str) and PLATFORM.fullmatch(p) for p in value)
        ):
            self.problem("externalParameters.platforms", f"not a list of distinct {PLATFORM.pattern}")
            return ()
        return tuple(value)

    def variables(self, given: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        value = given.get("variables", {})
        if not isinstance(value, dict) or len(value) > MAX_ITEMS:
            self.problem("externalParameters.variables", "not an object")
            return ()
        bad = [str(k)[:40] for k, v in value.items() if not VARIABLE.fullmatch(k) or not _plain_text(v, newline=True)]
        if bad:
            self.problem("externalParameters.variables", f"not identifier = text: {', '.join(map(repr, bad[:5]))}")
            return ()
        return tuple(sorted(value.items()))

    def given_extensions(self, own: tuple[str, ...], recorded: tuple[str, ...]) -> tuple[str, ...]:
        """The layers `kiln image --extension` (and the schematic) added after the profile's own.

        The recorded list is the profile's own, then --extension's, then the schematic's, without
        repeats when a schematic was applied: passing all that follows the profile's own list as
        --extension gives the same list again, whether or not a schematic repeats some of it.
        """
        for prefix in (own, tuple(dict.fromkeys(own))):
            if recorded[: len(prefix)] == prefix:
                return recorded[len(prefix) :]
        self.problem("externalParameters.extensions", "does not start with the profile's own input.extensions")
        return ()


def _object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (a field of the wrong type reads as absent)."""
    return value if isinstance(value, dict) else {}


def _plain_text(value: Any, *, newline: bool = False) -> bool:
    """A string of at most MAX_TEXT characters with no control character (a newline where allowed)."""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        return False
    allowed = "\n\t" if newline else ""
    return not any((ord(c) < 0x20 and c not in allowed) or ord(c) == 0x7F for c in value)


def refusals(recorded: Recorded, *, allow_dirty: bool, schematic_given: bool) -> list[str]:
    """Why `recorded` cannot be rebuilt to the same bytes, one line each; empty when it can be tried."""
    shown = printable(str(recorded.directory))
    if recorded.commit is None:
        return [f"{shown}: made outside a git checkout: its provenance records no commit to check out"]
    found = []
    if recorded.dirty and not allow_dirty:
        found.append(
            f"{shown}: made from a dirty tree at {recorded.commit[:12]} (changes no commit holds), so its inputs "
            "cannot be checked out; --allow-dirty rebuilds the commit anyway (the result may differ)"
        )
    schematic = recorded.schematic
    if schematic is not None and not schematic.replayable and not schematic_given:
        where = ", ".join(schematic.redacted()[:5]) or "part of it"
        found.append(
            f"{shown}: its schematic {schematic.id[:12]} cannot be replayed: the provenance redacted {where} "
            "(a secret never enters it); whoever holds the original can rebuild with --schematic FILE"
        )
    hidden = [name for name, value in recorded.variables if value == REDACTED]
    if hidden:
        found.append(
            f"{shown}: --set {', '.join(hidden)} cannot be replayed: the provenance redacted their values (secrets)"
        )
    return found
