"""`kiln image PROFILE... --platform linux/amd64,linux/arm64`: each profile for every platform, in one DIR/<profile>/.

Each platform's part runs as a single-platform `kiln image` would (its graph, its packages, its
images; imager.make_images), into a staging directory under DIR. Then each profile's outputs are
merged into one directory and renamed into place (imager.replace_dir), so a reader sees the
previous DIR/<profile>/ or the complete new one:

- a top-level artifact gets `-<arch>` before its extension unless its name already names the arch
  (arch_name: disk.raw -> disk-amd64.raw, kiln-arm64.iso stays, sbom.spdx.json ->
  sbom-arm64.spdx.json; a directory such as an installer's OCI layout is renamed the same way);
- the files of an output that name each other (PXE: the loader loads grub.cfg, which loads vmlinuz
  and initramfs.zst beside it) stay together, unchanged, in `<kind>-<arch>/` (a kind's `grouped`
  in outputs.kinds);
- an installer also gets one OCI image index over its arches: `<name>-oci/` and
  `<name>-index.tar` (outputs.installer.build_installer_index);
- one manifest.json (manifest.write_platforms_manifest) lists every artifact with its arch;
- one provenance (kiln.image.provenance) covers the merged directory, with every platform's packages.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core.errors import BuildError, InputError, InputErrors, KilnError
from kiln.image.checks import check_packages, with_release_version
from kiln.image.imager import Built, Result, build_packages, make_images, replace_dir
from kiln.image.manifest import MANIFEST, SBOMS, artifacts, write_platforms_manifest
from kiln.image.outputs.kinds import KINDS
from kiln.image.profile import Profile, raise_all, resolve_platform
from kiln.image.provenance import Part, origin, write_provenance
from kiln.image.signing_keys import resolve_keys
from kiln.pkg.graph import Graph
from kiln.pkg.variables import Platform
from kiln.signing.release import SIGNATURE, SUMS, sign_release

Say = Callable[[str], None]
# What counts as an extension when the arch goes into a name (disk.raw.xz -> disk-amd64.raw.xz;
# kiln-1.0.raw -> kiln-1.0-amd64.raw: "0" is no extension).
EXTENSIONS = frozenset(
    {"raw", "qcow2", "vhd", "vmdk", "ova", "iso", "img", "xz", "zst", "gz", "tar", "json", "spdx", "cdx"}
    | {"efi", "cfg", "ipxe"}
)


def arch_name(name: str, arch: str) -> str:
    """`name` with `-<arch>` before its extensions, unless it already names `arch` as a word of its own."""
    if re.search(rf"(?<![A-Za-z0-9]){re.escape(arch)}(?![A-Za-z0-9])", name, re.IGNORECASE):
        return name
    parts = name.split(".")
    stem = len(parts)
    while stem > 1 and parts[stem - 1].lower() in EXTENSIONS:
        stem -= 1
    return ".".join(parts[:stem]) + f"-{arch}" + "".join(f".{part}" for part in parts[stem:])


def grouped_dir(kind: str, arch: str) -> str:
    return f"{kind}-{arch}"


@dataclass
class PlatformBuild:
    """One platform's part before its images: its profiles (resolved for it) and the packages built."""

    platform: str
    profiles: list[Profile]
    built: Built
    package_seconds: float = 0.0

    @property
    def arch(self) -> str:
        return Platform.parse(self.platform).arch


@dataclass
class PlatformsResult:
    """A profile built for several platforms: its one directory and every platform's artifacts."""

    name: str
    directory: Path
    artifacts: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)  # per platform: this profile's images


@dataclass
class PlatformTime:
    platform: str
    package_seconds: float
    image_seconds: float

    def line(self) -> str:
        total = self.package_seconds + self.image_seconds
        return (
            f"{self.platform}: {total:.1f} s (packages {self.package_seconds:.1f} s, images {self.image_seconds:.1f} s)"
        )


def resolve_platforms(profiles: list[Profile], platforms: list[str]) -> dict[str, list[Profile]]:
    """The profiles for each of several platforms (`--platform linux/amd64,linux/arm64`).

    A profile that pins `arch:` is built for that arch only, so a list asking for another one is
    refused at its arch line; the rest is resolve_platform's, per platform. All errors at once.
    """
    listed = ",".join(platforms)
    errors: list[InputError] = []
    for profile in profiles:
        others = [p for p in platforms if Platform.parse(p).arch != profile.arch]
        if profile.arch_given and others:
            errors.append(
                InputError(
                    f"arch {profile.arch} pins the profile to linux/{profile.arch}, but --platform {listed} also "
                    f"asks for {', '.join(others)}: a profile with arch: is built for that arch only (leave arch "
                    "out of the profile to build it for every platform listed, or build it with --platform "
                    f"linux/{profile.arch})",
                    profile.location("arch"),
                )
            )
    raise_all(errors)
    resolved: dict[str, list[Profile]] = {}
    for platform in platforms:
        try:
            resolved[platform] = resolve_platform(profiles, platform)
        except InputErrors as many:
            errors += [e for e in many.errors if isinstance(e, InputError)]
        except InputError as one:
            errors.append(one)
    raise_all(errors)
    return resolved


def check_versions(resolved: dict[str, list[Profile]]) -> None:
    """Every platform gives a profile the same version (`resolved`: platform -> the same profiles, in
    the same order): its outputs are one release."""
    errors: list[InputError] = []
    columns = list(resolved.items())
    for index, profile in enumerate(columns[0][1]):
        versions = {platform: profiles[index].version for platform, profiles in columns}
        if len(set(versions.values())) > 1:
            given = ", ".join(f"{platform} {version}" for platform, version in versions.items())
            errors.append(
                InputError(
                    f"profile {profile.name} gets a different version per platform ({given}): "
                    "its outputs are one release; set version: in the profile",
                    profile.location(),
                )
            )
    raise_all(errors)


def build_platforms(
    load: Callable[[str], Graph],
    profiles: list[Profile],
    platforms: list[str],
    jobs: int,
    *,
    json_output: bool,
    say: Say,
    runner: str = "sandbox",
) -> list[PlatformBuild]:
    """Resolve and check the profiles for every platform (each its own graph; every error before any
    build), then build each platform's packages in turn (sources are fetched once, shared)."""
    resolved = resolve_platforms(profiles, platforms)
    graphs: dict[str, Graph] = {}
    errors: dict[str, KilnError] = {}  # by message: a profile's error on every platform shows once
    for platform in platforms:
        graphs[platform] = load(platform)
        try:
            check_packages(resolved[platform], graphs[platform])
        except InputErrors as many:
            errors.update((str(e), e) for e in many.errors)
        except InputError as one:
            errors.setdefault(str(one), one)
    if errors:
        found = list(errors.values())
        raise found[0] if len(found) == 1 else InputErrors(found)
    resolved = {p: with_release_version(resolved[p], graphs[p]) for p in platforms}
    check_versions(resolved)
    parts = []
    for platform in platforms:
        began = time.monotonic()
        say(f"{platform}: building packages")
        built = build_packages(resolved[platform], graphs[platform], jobs, json_output=json_output, runner=runner)
        parts.append(PlatformBuild(platform, resolved[platform], built, time.monotonic() - began))
        say(f"{platform}: packages ready in {parts[-1].package_seconds:.1f} s")
    return parts


def make_platform_images(
    parts: list[PlatformBuild], out: Path, jobs: int, say: Say
) -> tuple[list[PlatformsResult], list[PlatformTime]]:
    """Every platform's images into a staging directory under `out`, then each profile merged into
    out/<name>/ (renamed into place). The parts list the same profiles in the same order."""
    out.mkdir(parents=True, exist_ok=True)
    check_versions({part.platform: part.profiles for part in parts})
    times: list[PlatformTime] = []
    results: list[PlatformsResult] = []
    with tempfile.TemporaryDirectory(prefix=".kiln-platforms-", dir=out) as tmp:
        staging = Path(tmp)
        made: dict[str, dict[str, Path]] = {}  # profile name -> platform -> its single-platform directory
        seconds: dict[str, dict[str, float]] = {}
        # One platform after another: each already writes `jobs` profiles at once, and running the
        # platforms side by side measured no faster on 2 cores (12.6 s either way for four profiles).
        for part in parts:
            part_results, took = _platform_images(part, staging, jobs, say)
            for result in part_results:
                made.setdefault(result.profile.name, {})[part.platform] = result.directory
                seconds.setdefault(result.profile.name, {})[part.platform] = result.seconds
            times.append(took)
        run = origin(parts[0].built)
        for index, profile in enumerate(parts[0].profiles):
            merged = staging / "merged" / profile.name
            listed = merge_profile(profile.name, profile.kind, made[profile.name], merged)
            write_provenance(merged, [Part(part.profiles[index], part.built) for part in parts], run)
            keys = resolve_keys(profile, None)
            if keys is not None:  # each platform's SHA256SUMS was left out of the merge: one for all
                sign_release(merged, keys)
            final = out / profile.name
            replace_dir(merged, final, staging / f"replaced-{profile.name}")
            results.append(PlatformsResult(profile.name, final, listed, seconds[profile.name]))
    return results, times


def _platform_images(part: PlatformBuild, staging: Path, jobs: int, say: Say) -> tuple[list[Result], PlatformTime]:
    began = time.monotonic()
    say(f"{part.platform}: writing images")
    prefixed = _prefixed(say, part.arch)
    results = make_images(part.profiles, part.built, staging / part.arch, jobs, prefixed, provenance=False)
    took = PlatformTime(part.platform, part.package_seconds, time.monotonic() - began)
    say(took.line())
    return results, took


def _prefixed(say: Say, arch: str) -> Say:
    """Progress lines of one platform's images, saying which arch they are for."""
    return lambda line: say(f"{arch}: {line}")


def merge_profile(name: str, kind: str, made: dict[str, Path], dest: Path) -> list[dict[str, Any]]:
    """One directory from each platform's (`made`: platform -> directory, in platform order), with
    one manifest.json; returns its artifacts. The platforms' directories are emptied (renames)."""
    dest.mkdir(parents=True)
    listed: list[dict[str, Any]] = []
    inputs: dict[str, dict[str, Any]] = {}
    identity: dict[str, Any] = {}
    layouts: list[Path] = []
    epoch = 0
    for platform, source in made.items():
        arch = Platform.parse(platform).arch
        manifest = json.loads((source / MANIFEST).read_text())
        renamed = _move_outputs(kind, arch, source, dest)
        for artifact in manifest["artifacts"]:
            top, sep, rest = artifact["path"].partition("/")
            listed.append({**artifact, "path": renamed[top] + sep + rest, "arch": arch})
        inputs[platform] = manifest["inputs"]
        identity = {k: v for k, v in manifest["profile"].items() if k != "arch"}
        epoch = epoch or int(manifest["inputs"].get("source_date_epoch", 0))
        if kind == "installer":  # the platform's OCI layout (installer-<arch>/), not its .tar
            layouts += [dest / new for new in renamed.values() if (dest / new / "oci-layout").is_file()]
    if kind == "installer":
        from kiln.image.outputs.installer import build_installer_index

        index_dir, index_tar = build_installer_index(layouts, dest, name, epoch)
        listed += artifacts(dest, (index_dir.name, index_tar.name))
    identity["arches"] = [Platform.parse(platform).arch for platform in made]
    write_platforms_manifest(dest, identity, listed, inputs)
    return sorted(listed, key=lambda a: str(a["path"]))


def _move_outputs(kind: str, arch: str, source: Path, dest: Path) -> dict[str, str]:
    """Move one platform's outputs (not its manifest or SBOMs) into dest, named for `arch`; returns
    each top-level name's new path relative to dest."""
    for signed in (SUMS, SIGNATURE):  # per platform; the merged directory is signed as a whole
        (source / signed).unlink(missing_ok=True)
    names = sorted(p.name for p in source.iterdir() if p.name != MANIFEST and p.name not in SBOMS)
    for document in (d for d in SBOMS if (source / d).exists()):
        sbom = arch_name(document, arch)
        if (dest / sbom).exists():
            raise BuildError(f"{dest.name}: the {arch} SBOM would be named {sbom}, which is taken")
        (source / document).rename(dest / sbom)
    if KINDS[kind].grouped:  # its files name each other: kept together, unchanged
        group = dest / grouped_dir(kind, arch)
        group.mkdir()
        for entry in names:
            (source / entry).rename(group / entry)
        return {entry: f"{group.name}/{entry}" for entry in names}
    renamed: dict[str, str] = {}
    for entry in names:
        target = arch_name(entry, arch)
        if (dest / target).exists() or target == MANIFEST:
            raise BuildError(f"{dest.name}: the {arch} output {entry} would be named {target}, which is taken")
        (source / entry).rename(dest / target)
        renamed[entry] = target
    return renamed
