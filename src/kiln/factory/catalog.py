"""What a factory offers and how it makes it: the profiles and extensions of one project, one version.

The catalogue is read once at start from the project's own files (profiles/, the package tree),
so a request can only name what is there: a profile is looked up by name in that list, never as a
path, and a schematic's package extensions must be extensions of that tree. A build is the real
`kiln image PROFILE --schematic FILE --release-version V` in a child process (an argv list, no
shell), with the project's tree and the factory's store, its output and log in the factory's
directories.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.core.errors import BuildError
from kiln.factory.builds import Runner, Target
from kiln.image.profile import find_profile, load_profile
from kiln.image.schematic import Schematic


@dataclass(frozen=True)
class Offer:
    """One profile the factory serves: its kind and the download its name maps to."""

    name: str
    kind: str
    platform: str
    download: str  # the artifact `GET /image/<id>/<version>/<name>.<ext>` serves, by file name ("" for none)

    @property
    def extension(self) -> str:
        """`<ext>` of the download URL: the artifact's name after its stem (`iso`, `raw.zst`, `vhd`)."""
        return self.download.split(".", 1)[1] if "." in self.download else ""


@dataclass(frozen=True)
class Catalog:
    project: Path
    pkgs: tuple[Path, ...]
    profiles_dir: Path
    version: str
    offers: dict[str, Offer]
    extensions: tuple[str, ...]  # the tree's extension packages

    @classmethod
    def read(cls, project: Path, pkgs: tuple[Path, ...], profiles_dir: Path, version: str) -> Catalog:
        from kiln.pkg.loader import load_tree
        from kiln.pkg.variables import Platform

        offers = {}
        for file in sorted(profiles_dir.glob("*.yaml")):
            profile = load_profile(find_profile(file.stem, profiles_dir))
            offers[profile.name] = Offer(profile.name, profile.kind, profile.platform, profile.artifact_name)
        tree = load_tree(list(pkgs), Platform.parse("linux/amd64"))
        extensions = tuple(sorted(name for name, p in tree.packages.items() if "extension" in p.spec))
        return cls(project, pkgs, profiles_dir, version, offers, extensions)

    def unknown_extensions(self, schematic: Schematic) -> list[str]:
        """The schematic's package extensions this tree does not have (registry references are the build's)."""
        return [e for e in schematic.extensions if not e.startswith("oci://") and e not in self.extensions]


def kiln_image_runner(catalog: Catalog, schematics: Path, cache_from: str | None = None) -> Runner:
    """The real builder: `kiln image` in a child process for one target (pulling from `cache_from` first)."""

    def run(target: Target, out: Path, log: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "kiln.cli",
            "image",
            target.profile,
            "--profiles-dir",
            str(catalog.profiles_dir),
            *[arg for tree in catalog.pkgs for arg in ("--pkgs", str(tree))],
            "--schematic",
            str(schematics / f"{target.schematic}.json"),
            "--release-version",
            target.version,
            "--progress",
            "plain",
            "--out",
            str(out.parent / "image-out"),
            *(["--cache-from", cache_from] if cache_from else []),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("wb") as sink:
            done = subprocess.run(command, cwd=catalog.project, stdout=sink, stderr=subprocess.STDOUT, env=env)
        if done.returncode != 0:
            raise BuildError(f"kiln image {target.profile} failed (exit {done.returncode})")
        (out.parent / "image-out" / target.profile).rename(out)

    return run
