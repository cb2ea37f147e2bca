"""The seed definition (pkgs/stage0.yaml): what debootstrap makes, or a user's tarball."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, Location
from kiln.core.hashing import file_sha256
from kiln.core.yamlfile import read_yaml_file

DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Stage0:
    """A Debian root by debootstrap, or a root filesystem tarball / OCI archive."""

    suite: str = "bookworm"
    mirror: str = DEFAULT_MIRROR
    variant: str = "minbase"
    include: tuple[str, ...] = ()
    cross: tuple[tuple[str, tuple[str, ...]], ...] = ()  # target arch -> packages a cross seed adds
    tarball: Path | None = None
    tarball_sha256: str | None = None
    file: Path | None = None

    def cross_include(self, target_arch: str) -> tuple[str, ...]:
        """The packages a seed that cross-compiles for `target_arch` adds to `include`."""
        return dict(self.cross).get(target_arch, ())

    def packages(self, cross_to: str | None = None) -> tuple[str, ...]:
        """What debootstrap includes: `include`, plus the cross compilers when the seed builds for another arch."""
        return self.include + (self.cross_include(cross_to) if cross_to else ())

    def identity(self, cross_to: str | None = None) -> dict[str, Any]:
        """What the seed's key is made of: the tarball's hash, or the definition.

        A native seed's identity leaves the cross lists out, so adding one changes no native key.
        """
        if self.tarball is not None:
            return {"tarball": self.tarball_sha256}
        return {
            "suite": self.suite,
            "mirror": self.mirror,
            "variant": self.variant,
            "include": list(self.packages(cross_to)),
        }


def load_stage0(file: Path, from_tar: Path | None = None) -> Stage0:
    """Read stage0.yaml (if present); `from_tar` (--from-tar) replaces it with a tarball."""
    present = os.path.lexists(file)
    definition = Stage0(file=file if present else None)
    if present:  # a dangling link or a FIFO is reported by the reader, not skipped
        definition = _parse(file)
    if from_tar is not None:
        if not from_tar.is_file():
            raise InputError(f"--from-tar: {str(from_tar)!r} is not a file")
        return Stage0(tarball=from_tar.resolve(), tarball_sha256=file_sha256(from_tar), file=definition.file)
    if definition.tarball is not None:
        actual = file_sha256(definition.tarball) if definition.tarball.is_file() else None
        if actual is None:
            raise InputError(f"stage0 tarball {str(definition.tarball)!r} does not exist", Location(str(file)))
        if actual != definition.tarball_sha256:
            raise InputError(
                f"stage0 tarball {definition.tarball} has sha256 {actual}, expected {definition.tarball_sha256}",
                Location(str(file)),
            )
    return definition


def _parse(file: Path) -> Stage0:
    where = str(file)
    positioned = read_yaml_file(file, what="stage0.yaml", within=file.parent)
    data = positioned.value or {}
    if not isinstance(data, dict):
        raise InputError("stage0.yaml must be a mapping", Location(where, 1))
    problems = schema.validate(data, "stage0.schema.json")
    if problems:
        raise InputErrors([InputError(msg, Location(where, positioned.line(path))) for path, msg in problems])
    tarball = (file.parent / data["tarball"]) if "tarball" in data else None
    return Stage0(
        suite=data.get("suite", "bookworm"),
        mirror=data.get("mirror", DEFAULT_MIRROR),
        variant=data.get("variant", "minbase"),
        include=tuple(data.get("include", [])),
        cross=tuple((arch, tuple(names)) for arch, names in sorted(data.get("cross", {}).items())),
        tarball=tarball,
        tarball_sha256=data.get("sha256"),
        file=file,
    )
