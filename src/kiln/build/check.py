"""`kiln build --check TARGET...`: is a stored package what its inputs make? (as Nix's --check)

Each package is built again in a fresh root, from the same stored inputs, and never stored; its
tree is normalized as the store normalizes one and compared with the stored entry's files as they
are on disk now, file by file (type, mode, size, sha256, symlink target): the question is whether
what the store holds is what the inputs make. When the stored files no longer match the entry's own
manifest (a damaged store, as `kiln cache verify` finds), the check says so too. A file that
differs is kept beside a copy of the stored one under $KILN_CACHE/check/<name>/<key>/, with
Debian's diffoscope report when diffoscope is installed, else the offset of the first differing
byte. `--deep` checks the target's whole closure,
in build order (every package's rebuild still mounts the stored inputs, so one difference does not
cascade).
"""

from __future__ import annotations

import contextlib
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.build.builder import Builder
from kiln.build.store import Store
from kiln.build.store.manifest import MANIFEST, FileRecord, TreeScan, differences, read_manifest
from kiln.core import nofollow
from kiln.core.errors import BuildError
from kiln.core.paths import cache_dir

DIFFOSCOPE_SECONDS = 120  # per file: a report on a huge binary must not hold the check forever
REPORTED_FILES = 10  # diffoscope reports kept per package; the rest are listed only


@dataclass(frozen=True)
class FileDifference:
    path: str
    what: list[str]  # "only in the stored output", "mode 0755, expected 0644", ...
    first_offset: int | None = None  # of two regular files whose bytes differ
    report: str | None = None  # diffoscope's text report, beside the kept files


@dataclass
class Checked:
    """One package's check: the same tree (`same`), or what differs, and where the evidence is kept."""

    name: str
    key: str
    seconds: float
    files: int
    differences: list[FileDifference] = field(default_factory=list)
    kept: Path | None = None
    damaged: list[str] = field(default_factory=list)  # paths where the stored files differ from the entry's manifest

    @property
    def same(self) -> bool:
        return not self.differences and not self.damaged

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "reproducible": self.same,
            "seconds": round(self.seconds, 2),
            "files": self.files,
            "differences": [
                {"path": d.path, "what": d.what, "first_offset": d.first_offset, "report": d.report}
                for d in self.differences
            ],
            "kept": str(self.kept) if self.kept else None,
            "damaged": self.damaged,
        }


def compare(stored: list[FileRecord], rebuilt: list[FileRecord]) -> list[FileDifference]:
    """What differs between two manifests, path by path, sorted by path."""
    want = {r.path: r for r in stored}
    got = {r.path: r for r in rebuilt}
    found: list[FileDifference] = []
    for path in sorted(want.keys() | got.keys()):
        if path not in got:
            found.append(FileDifference(path, ["only in the stored output"]))
        elif path not in want:
            found.append(FileDifference(path, ["only in the rebuild"]))
        elif want[path].type != got[path].type:
            found.append(FileDifference(path, [f"a {got[path].type}, stored as a {want[path].type}"]))
        else:
            what = differences(want[path], got[path])
            if what:
                found.append(FileDifference(path, what))
    return found


def first_difference(a: Path, b: Path, chunk: int = 1 << 16) -> int | None:
    """The offset of the first byte where two files differ (the shorter one's end counts), or None."""
    offset = 0
    with a.open("rb") as left, b.open("rb") as right:
        while True:
            x, y = left.read(chunk), right.read(chunk)
            if x != y:
                common = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
                return offset + common
            if not x:
                return None
            offset += len(x)


def diffoscope_report(stored: Path, rebuilt: Path, report: Path) -> str | None:
    """diffoscope's text report of two files into `report`, or None when diffoscope is not installed."""
    program = shutil.which("diffoscope")
    if program is None:
        return None
    try:
        subprocess.run(
            [program, "--no-progress", "--text", str(report), str(stored), str(rebuilt)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=DIFFOSCOPE_SECONDS,
            check=False,  # exit 1 means "they differ": the report is what we want
        )
    except subprocess.TimeoutExpired:
        report.write_text(f"diffoscope did not finish in {DIFFOSCOPE_SECONDS} s\n")
    return str(report) if report.exists() else None


def keep_evidence(name: str, key: str, stored: Path, rebuilt: Path, found: list[FileDifference]) -> Path:
    """Copy the differing files (stored and rebuilt) under $KILN_CACHE/check/<name>/<key>/ with reports.

    Offsets and diffoscope reports are made from the copies: only _kept_copies touches the two trees."""
    where = cache_dir() / "check" / name / key
    if where.exists():
        shutil.rmtree(where)
    reported = 0
    for index, difference in enumerate(found):
        copies = _kept_copies(where, difference.path, stored, rebuilt)
        if copies is None:
            continue
        report = None
        if reported < REPORTED_FILES:
            report = diffoscope_report(*copies, where / f"{difference.path.replace('/', '_')}.diffoscope.txt")
            reported += 1
        found[index] = FileDifference(difference.path, difference.what, first_difference(*copies), report)
    where.mkdir(parents=True, exist_ok=True)
    return where


def _kept_copies(where: Path, rel: str, stored: Path, rebuilt: Path) -> tuple[Path, Path] | None:
    """Both sides of `rel` copied to where/stored/ and where/rebuilt/, or None unless both are regular files.

    A build wrote both trees, so either may hold a link on the way to `rel` (the other side's directory
    there made the manifests name it): reached through kiln.core.nofollow, such a file is left out."""
    sides = (("stored", stored), ("rebuilt", rebuilt))
    try:
        infos = [nofollow.lstat_in(top, rel, what="check") for _, top in sides]
    except nofollow.LinkRefused:
        return None
    if not all(info is not None and stat.S_ISREG(info.st_mode) for info in infos):
        return None
    copies = []
    for side, top in sides:
        target = where / side / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            nofollow.copy_file_in(top, rel, target, mode=0o644, what="check")
        except (nofollow.LinkRefused, BuildError):  # swapped for a link or another type since the lstat
            return None
        copies.append(target)
    return copies[0], copies[1]


def check_package(
    builder: Builder, store: Store, name: str, source_date_epoch: int, on_phase: Callable[[str], None]
) -> Checked:
    """Build `name` again and compare it with its stored entry (which must exist)."""
    key = builder.keys[name]
    package = builder.graph.tree.packages[name]
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        for input_key in builder.input_keys(package):
            stack.enter_context(store.use(input_key))
        entry = stack.enter_context(store.use(key))  # what the rebuild is compared with stays put
        staging = stack.enter_context(store.fresh_staging(key))
        log = cache_dir() / "check" / name / f"{key}.log"
        tree = builder.rebuild(name, staging, log, on_phase)
        rebuilt = TreeScan(tree, normalize=True, source_date_epoch=source_date_epoch).run()
        held = TreeScan(entry.tree, normalize=False).run()  # the stored bytes, not only their record
        found = compare(held, rebuilt)
        damaged = [d.path for d in compare(read_manifest(entry.path / MANIFEST), held)]
        kept = keep_evidence(name, key, entry.tree, tree, found) if found else None
    files = sum(1 for r in rebuilt if r.type != "dir")
    return Checked(name, key, time.monotonic() - began, files, found, kept, damaged)


def summary_line(checked: Checked) -> str:
    damaged = []
    if checked.damaged:
        paths = ", ".join(checked.damaged[:5]) + (", ..." if len(checked.damaged) > 5 else "")
        damaged = [
            f"  the stored entry {checked.key[:12]} no longer matches its own manifest ({paths}): the store is damaged "
            f"(`kiln cache verify` lists it; `kiln cache rm {checked.key[:12]}`, and the next build makes it again)"
        ]
    if checked.same:
        files = f"{checked.files} file{'' if checked.files == 1 else 's'}"
        return f"{checked.name}: reproducible ({files}, rebuilt in {checked.seconds:.1f} s)"
    shown = []
    for difference in checked.differences[:5]:
        at = f" (first at byte {difference.first_offset:#x})" if difference.first_offset is not None else ""
        shown.append(f"  {difference.path}: {'; '.join(difference.what)}{at}")
    more = len(checked.differences) - len(shown)
    tail = [f"  ... and {more} more"] if more > 0 else []
    where = [f"  kept in {checked.kept}" + (" with diffoscope reports" if shutil.which("diffoscope") else "")]
    if not checked.differences:
        return "\n".join([f"{checked.name}: the rebuild matches its record but not the stored files", *damaged])
    return "\n".join(
        [
            f"{checked.name}: NOT reproducible: {len(checked.differences)} of {checked.files} files differ",
            *shown,
            *tail,
            *where,
            *damaged,
        ]
    )
