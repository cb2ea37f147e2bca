"""An output directory's SLSA v1 provenance: `provenance.intoto.json`, an in-toto Statement v1.

Its subjects are the files SHA256SUMS lists for the directory, with the same sha256s
(manifest.listed_files: the artifacts, the manifest and the SBOMs); the statement itself is
not one. Its predicate (https://slsa.dev/provenance/v1) says how they were made:

- buildDefinition: buildType BUILD_TYPE; externalParameters, what the user chose: the profile
  as written, the schematic's fields and ID when one was applied, the platform(s), the `--set`
  variables and the extension layers; internalParameters, what Kiln chose per platform
  (SOURCE_DATE_EPOCH, toolchain, build platform); resolvedDependencies: the project's git commit
  (annotated dirty or not), each package tree's digest, every package built for the output (name,
  version, store key), each package's remote sources (URL and sha256), the seed, registry
  extensions by digest.
- runDetails: builder.id names the runner that built the packages, builder.version Kiln's
  version, metadata the run's start and this directory's finish.

User documents may hold secrets (a machine config's API key, a token in a variable): the whole
predicate goes through kiln.core.secrets.redact, the rule the image factory refuses schematics
by, so only `[redacted]` stands where one was. The statement records times, so it is not part of
the reproducible output: SHA256SUMS never lists it (docs/reproducibility.md).
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln import __version__
from kiln.build.cache_keys import stage0_key, tree_digest
from kiln.core import secrets
from kiln.core.gitstate import Head, head
from kiln.core.hashing import file_sha256, json_sha256
from kiln.image import sbom_refs
from kiln.image.manifest import listed_files
from kiln.image.outputs.kinds import KINDS
from kiln.image.profile import Profile
from kiln.signing.release import PROVENANCE

if TYPE_CHECKING:
    from kiln.image.imager import Built

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
KILN_URI = "https://kiln.invalid"  # Kiln's namespace, as the SBOMs' (no public host is claimed)
BUILD_TYPE = f"{KILN_URI}/buildtypes/image/v1"  # docs/provenance.md describes it
STORE_KEY = "kilnStoreKey"  # a DigestSet entry: a store key names a package's inputs, immutably


@dataclass(frozen=True)
class Part:
    """One platform's share of an output directory: its profile as resolved, and what the graph built."""

    profile: Profile
    built: Built


@dataclass(frozen=True)
class Origin:
    """What every directory of one run shares: the checkout and package trees, read once per run."""

    project: Head | None
    trees: tuple[tuple[str, str], ...]  # (tree directory's name, digest) in --pkgs order


def origin(built: Built) -> Origin:
    """The checkout holding the package trees, and each tree's digest (kiln.build.cache_keys.tree_digest's
    path -> content map, as canonical JSON, hashed)."""
    tree = built.graph.tree
    digests = tuple((root.name, json_sha256(tree_digest(root))) for root in tree.roots)
    return Origin(head(tree.project_root), digests)


def write_provenance(directory: Path, parts: list[Part], run: Origin) -> Path:
    """`directory`/provenance.intoto.json for the files now in it (the manifest and SBOMs written)."""
    path = directory / PROVENANCE
    document = statement(listed_files(directory), parts, run, time.time())
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n")
    return path


def statement(files: dict[str, str], parts: list[Part], run: Origin, finished: float) -> dict[str, Any]:
    """The in-toto statement over `files` (name -> sha256), its predicate redacted."""
    first = parts[0].built
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": external_parameters(parts),
            "internalParameters": {
                "sourceDateEpoch": first.epoch,
                "platforms": {str(p.built.graph.tree.platform): internal(p.built) for p in parts},
            },
            "resolvedDependencies": resolved(parts, run),
        },
        "runDetails": {
            "builder": {"id": f"{KILN_URI}/builders/{first.runner}", "version": {"kiln": __version__}},
            "metadata": {"startedOn": timestamp(first.started or finished), "finishedOn": timestamp(finished)},
        },
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": files[name]}} for name in sorted(files, key=str.encode)],
        "predicateType": SLSA_PROVENANCE,
        "predicate": secrets.redact(predicate),
    }


def external_parameters(parts: list[Part]) -> dict[str, Any]:
    """What the user gave: the profile as written, the schematic, platforms, variables, extensions."""
    profile = parts[0].profile
    given: dict[str, Any] = {"profile": profile.positions.value or {"name": profile.name}}
    if profile.schematic is not None:
        given["schematic"] = {"id": profile.schematic.id, "fields": profile.schematic.fields}
    given["platforms"] = [str(part.built.graph.tree.platform) for part in parts]
    given["variables"] = dict(sorted(parts[0].built.graph.tree.overrides.items()))
    given["extensions"] = list(profile.extensions)
    return given


def internal(built: Built) -> dict[str, Any]:
    """What Kiln chose for one platform."""
    tree = built.graph.tree
    return {"toolchain": tree.toolchain, "buildPlatform": str(tree.builder_platform)}


def resolved(parts: list[Part], run: Origin) -> list[dict[str, Any]]:
    """The checkout, the package trees, then each platform's packages, sources, seed and pulled extensions."""
    found: list[dict[str, Any]] = []
    if run.project is not None:
        found.append(
            {
                "name": "project",
                "digest": {"gitCommit": run.project.commit},
                "annotations": {"dirty": run.project.dirty},
            }
        )
    found += [
        {"name": f"package-tree:{name}", "digest": {"sha256": digest}, "annotations": {"kind": "package-tree"}}
        for name, digest in run.trees
    ]
    for part in parts:
        found += packages(part)
    if parts[0].profile.schematic is not None:
        found.append({"name": "schematic", "digest": {"sha256": parts[0].profile.schematic.id}})
    found.append({"name": "profile", "digest": {"sha256": file_sha256(parts[0].profile.file)}})
    return found


def packages(part: Part) -> list[dict[str, Any]]:
    """Every package built for this platform's output (the closure of what the profile needs), each
    followed by its remote sources; the seed when one was used; registry extensions by digest."""
    profile, built = part.profile, part.built
    tree = built.graph.tree
    platform = str(tree.platform)
    targets = [*profile.packages_to_build(), *KINDS[profile.kind].packages]
    closure = [name for name in built.graph.closure(n for n in targets if n in built.keys) if name in built.keys]
    found: list[dict[str, Any]] = []
    for name in closure:
        package = tree.packages[name]
        notes = {"kind": "package", "platform": platform, "version": package.version}
        if name == tree.toolchain:
            notes["role"] = "toolchain"
        found.append({"name": name, "digest": {STORE_KEY: built.keys[name]}, "annotations": notes})
        found += [
            {"name": f"{name}:{source.destination}", "uri": source.url, "digest": {"sha256": source.sha256}}
            for source in sbom_refs.sources(package)
        ]
    if any(tree.packages[name].variant in ("stage0", "toolchain") for name in closure):
        seed = {
            "kind": "seed",
            "platform": platform,
            **tree.stage0.identity(tree.platform.arch if tree.cross else None),
        }
        found.append({"name": "stage0", "digest": {STORE_KEY: stage0_key(tree)}, "annotations": seed})
    return found + pulled(part)


def pulled(part: Part) -> list[dict[str, Any]]:
    """The registry extensions by the reference given and the digest they resolved to."""
    found = []
    for name in part.profile.oci_extensions:
        reference = part.built.pulled[name].reference
        digest = reference.rpartition("@sha256:")[2]
        found.append({"name": name, "uri": reference, "digest": {"sha256": digest}})
    return found


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC with a Z, to the second, as in-toto's Timestamp asks."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
