"""A rebuilt output directory against the release: every artifact's sha256, and why one differs.

Three digests meet per artifact: the one the release lists (its directory's SHA256SUMS, else the
release's top-level one, else the provenance's subjects), the release's file as it is on disk,
and the rebuild's. All three equal: the artifact is what its recorded inputs make. Otherwise the
artifact is named with what disagrees, which also says which side to believe: a rebuild that
matches SHA256SUMS while the file does not means the file changed after the release was made.

Each artifact whose release file and rebuilt file differ gets a diffoscope report (as `kiln build
--check` makes them, with its time limit) in REPORTS/<directory>/<artifact>.diffoscope.txt, the
artifact's '/' and '%' written %2F and %25 so every report is one file and no two collide. The
release's file is read through no link, and copied out before diffoscope opens it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.build.check import REPORTED_FILES, diffoscope_report, first_difference
from kiln.core import nofollow
from kiln.core.errors import BuildError
from kiln.core.hashing import file_sha256
from kiln.signing.release import MAX_SUMS, SUMS, parse_sums, read_signed

REPORT_SUFFIX = ".diffoscope.txt"


@dataclass
class Difference:
    """One artifact that is not the same, what disagrees, and where its report is."""

    artifact: str
    what: list[str]
    report: str | None = None
    first_offset: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "what": self.what, "report": self.report, "first_offset": self.first_offset}


@dataclass
class Compared:
    """One directory's comparison: the artifacts that are the same, and the differences."""

    name: str
    same: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)


@dataclass(frozen=True)
class Sides:
    """The views of one directory's artifacts (name -> sha256)."""

    listed: dict[str, str]
    on_disk: dict[str, str | None]  # None: missing, or not a regular file reached without a link
    rebuilt: dict[str, str]
    subjects: dict[str, str]  # the provenance's, which must say what the list says


def report_name(artifact: str) -> str:
    """The report's file name for `artifact`: one path component, distinct for distinct artifacts."""
    return artifact.replace("%", "%25").replace("/", "%2F") + REPORT_SUFFIX


def listed_digests(directory: Path, release: Path, subjects: dict[str, str]) -> dict[str, str]:
    """What the release lists for `directory`: its own SHA256SUMS, the release's entries under its name,
    else the provenance's subjects."""
    if os.path.lexists(directory / SUMS):
        return parse_sums(read_signed(directory, SUMS, MAX_SUMS))
    if directory != release and os.path.lexists(release / SUMS):
        prefix = f"{directory.name}/"
        top = parse_sums(read_signed(release, SUMS, MAX_SUMS))
        return {name.removeprefix(prefix): digest for name, digest in top.items() if name.startswith(prefix)}
    return dict(subjects)


def rebuilt_digests(out: Path, name: str) -> dict[str, str]:
    """What the rebuild lists for directory `name`: kiln image's top-level SHA256SUMS in `out`."""
    prefix = f"{name}/"
    top = parse_sums(read_signed(out, SUMS, MAX_SUMS))
    return {rel.removeprefix(prefix): digest for rel, digest in top.items() if rel.startswith(prefix)}


def disk_digest(directory: Path, name: str) -> str | None:
    """sha256 of the release's file `name`, a regular file reached through no link; None otherwise."""
    try:
        info = nofollow.lstat_in(directory, name, what="release")
        if info is None or not stat.S_ISREG(info.st_mode):
            return None
        return file_sha256(directory / name, follow_links=False)
    except (OSError, nofollow.LinkRefused):
        return None


def differences(sides: Sides) -> tuple[list[str], list[Difference]]:
    """The artifacts that are the same everywhere, and each one that is not with what disagrees."""
    same: list[str] = []
    found: list[Difference] = []
    for name in sorted(sides.listed.keys() | sides.rebuilt.keys() | sides.subjects.keys(), key=str.encode):
        what = _disagreements(name, sides)
        if what:
            found.append(Difference(name, what))
        else:
            same.append(name)
    return same, found


def _disagreements(name: str, sides: Sides) -> list[str]:
    listed, rebuilt = sides.listed.get(name), sides.rebuilt.get(name)
    what = []
    if sides.subjects.get(name) != listed:
        what.append("the release's list and its provenance's subjects disagree")
    if listed is None:
        return [*what, "made by the rebuild, not listed in the release"] if rebuilt is not None else what
    if rebuilt is None:
        what.append("listed in the release, not made by the rebuild")
    elif rebuilt != listed:
        what.append(f"the rebuild's sha256 {rebuilt[:16]} is not the {listed[:16]} the release lists")
    disk = sides.on_disk.get(name)
    if disk is None:
        what.append("missing from the release directory (or not a regular file reached without a link)")
    elif disk != listed:
        tail = (
            ": the rebuild matches the list, so the file changed after the release was made"
            if rebuilt == listed
            else ""
        )
        what.append(f"the release's file (sha256 {disk[:16]}) is not what the release lists{tail}")
    return what


def write_reports(directory: Path, rebuilt: Path, found: list[Difference], reports: Path, scratch: Path) -> None:
    """A diffoscope report per difference whose two files both exist (at most REPORTED_FILES per directory)."""
    made = 0
    for difference in found:
        if made >= REPORTED_FILES:
            break
        copy = scratch / "release" / difference.artifact.rpartition("/")[2]  # the report shows the file's name
        if not _regular(rebuilt, difference.artifact) or not _copy_release_file(directory, difference.artifact, copy):
            continue
        try:
            other = rebuilt / difference.artifact
            difference.first_offset = first_difference(copy, other)
            if difference.first_offset is None:
                continue
            reports.mkdir(parents=True, exist_ok=True)
            difference.report = diffoscope_report(copy, other, reports / report_name(difference.artifact))
            made += 1
        finally:
            with contextlib.suppress(FileNotFoundError):
                copy.unlink()


def _copy_release_file(directory: Path, name: str, copy: Path) -> bool:
    """The release's file copied to `copy` through no link; False when it is not a regular file."""
    if not _regular(directory, name):
        return False
    copy.parent.mkdir(parents=True, exist_ok=True)
    try:
        nofollow.copy_file_in(directory, name, copy, mode=0o600, what="release")
    except (OSError, BuildError):  # a link on the way (LinkRefused), or no longer a regular file
        return False
    return True


def _regular(top: Path, name: str) -> bool:
    try:
        info = nofollow.lstat_in(top, name, what="release")
    except nofollow.LinkRefused:
        return False
    return info is not None and stat.S_ISREG(info.st_mode)


def compare_directory(directory: Path, release: Path, subjects: dict[str, str], rebuilt: Path) -> Compared:
    """`directory` of the release against `rebuilt`, the directory the rebuild made for it (digests only;
    write_reports explains the differences)."""
    listed = listed_digests(directory, release, subjects)
    on_disk = {name: disk_digest(directory, name) for name in listed}
    sides = Sides(listed, on_disk, rebuilt_digests(rebuilt.parent, rebuilt.name), subjects)
    same, found = differences(sides)
    return Compared(directory.name, same, found)
