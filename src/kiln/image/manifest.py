"""What an output directory holds: manifest.json (artifacts and the inputs that made them) and the SBOMs
(SPDX 2.3 here; CycloneDX 1.5 in kiln.image.sbom_cyclonedx).

The SBOM lists the packages in the rootfs with their versions, store keys and pinned sources;
spdx-tools builds and validates it, so a malformed document fails the image build rather than
a consumer later. Both files are derived from inputs only (created at SOURCE_DATE_EPOCH).
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core.errors import BuildError
from kiln.core.hashing import file_sha256
from kiln.image import sbom_refs
from kiln.image.assets import derived_uuid
from kiln.pkg.model import Package
from kiln.signing.release import ENVELOPE, PROVENANCE

if TYPE_CHECKING:  # spdx-tools is imported only when an SBOM is written (see _SPDX_MODULES)
    from spdx_tools.spdx.model.document import CreationInfo
    from spdx_tools.spdx.model.package import ExternalPackageRef
    from spdx_tools.spdx.model.package import Package as SpdxPackage
    from spdx_tools.spdx.model.relationship import Relationship

MANIFEST = "manifest.json"
RELEASE_SUMS = "SHA256SUMS"  # at the top of `kiln image --out`: write_release_sums
SBOM = "sbom.spdx.json"
CYCLONEDX = "sbom.cdx.json"  # kiln.image.sbom_cyclonedx
SBOMS = (SBOM, CYCLONEDX)

# What write_spdx imports. spdx-tools costs about 0.5 s to import, so only image making pays for
# it; and concurrent first imports of one package from worker threads race inside importlib
# (KeyError: 'spdx_tools.spdx.model', seen about one run in six), so load_spdx() runs first.
_SPDX_MODULES = (
    "spdx_tools.common.spdx_licensing",
    "spdx_tools.spdx.model.actor",
    "spdx_tools.spdx.model.checksum",
    "spdx_tools.spdx.model.document",
    "spdx_tools.spdx.model.package",
    "spdx_tools.spdx.model.relationship",
    "spdx_tools.spdx.model.spdx_no_assertion",
    "spdx_tools.spdx.validation.document_validator",
    "spdx_tools.spdx.writer.json.json_writer",
)


def load_spdx() -> None:
    """Import spdx-tools in the calling thread, before worker threads call write_spdx."""
    for name in _SPDX_MODULES:
        importlib.import_module(name)


@dataclass(frozen=True)
class SbomPackage:
    """One package of the image, as both SBOMs show it: built from the tree (its store key and pinned
    sources) or an extension pulled from a registry (the digest-pinned reference it came from)."""

    name: str
    version: str
    role: str  # rootfs, kernel, init, extension, bootloader
    description: str = ""
    license: str = ""
    cpe: str = ""
    key: str = ""  # the store key of a package built from the tree
    sources: tuple[sbom_refs.SourceRef, ...] = ()
    reference: str = ""  # a registry extension: oci://HOST/REPO[:TAG]@sha256:DIGEST
    digest: str = ""  # ... and its manifest's digest
    purl: str | None = None

    @classmethod
    def built(cls, package: Package, key: str, role: str) -> SbomPackage:
        sources = tuple(sbom_refs.sources(package))
        return cls(
            name=package.name,
            version=package.version,
            role=role,
            description=package.description,
            license=package.license,
            cpe=package.cpe,
            key=key,
            sources=sources,
            purl=sources[0].purl if sources else None,
        )

    @property
    def sha256(self) -> str | None:
        """What identifies the package's bytes: its first source's sha256, or a registry manifest's digest."""
        if self.sources:
            return self.sources[0].sha256
        return self.digest.removeprefix("sha256:") or None

    @property
    def origin(self) -> str:
        """Where the package came from, in a sentence."""
        if self.reference:
            return f"pulled by Kiln ({self.role}) from {self.reference}"
        return f"built by Kiln ({self.role}); store key {self.key}"


@dataclass(frozen=True)
class SbomSubject:
    """What an image's two SBOMs describe: the image (name, version, and the schematic it was customised
    with), the seed it was built from, when (the epoch), and its packages."""

    name: str
    version: str
    seed: str
    epoch: int
    packages: list[SbomPackage]
    schematic: str | None = None


def artifacts(directory: Path, under: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Every file under directory (but the manifest, SBOMs and provenance), sorted, with sha256 and
    size; with `under`, only those files and the files in those directories (names relative to directory)."""
    found = []
    roots = [directory / name for name in under] if under is not None else [directory]
    files = {p for root in roots for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()}
    for path in sorted(files):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST or rel in SBOMS or rel in (PROVENANCE, ENVELOPE):
            continue
        found.append({"path": rel, "sha256": file_sha256(path), "size": path.stat().st_size})
    return found


def write_manifest(directory: Path, profile: dict[str, Any], inputs: dict[str, Any]) -> Path:
    """manifest.json: the profile's identity, each artifact, and the keys/hashes of the inputs."""
    data = {"profile": profile, "artifacts": artifacts(directory), "inputs": inputs}
    path = directory / MANIFEST
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def write_release_sums(out: Path) -> Path:
    """out/SHA256SUMS: every artifact of every profile directory in `out`, with each directory's
    manifest and SBOMs, as `<sha256>  <profile>/<path>` lines sorted by path (coreutils' format, so
    `sha256sum -c SHA256SUMS` in `out` checks the whole release).

    The provenance is not listed: it records when it ran, and the list must be the same for the
    same inputs (docs/reproducibility.md).
    """
    sums: dict[str, str] = {}
    for manifest in sorted(out.glob(f"*/{MANIFEST}")):
        directory = manifest.parent
        if directory.name.startswith("."):  # another run's staging directory
            continue
        sums.update((f"{directory.name}/{name}", digest) for name, digest in listed_files(directory).items())
    text = "".join(f"{sums[path]}  {path}\n" for path in sorted(sums, key=lambda p: p.encode()))
    target = out / RELEASE_SUMS
    partial = out / f".{RELEASE_SUMS}.{os.getpid()}"
    partial.write_text(text)
    partial.replace(target)  # a reader sees the old list or the new one
    return target


def listed_files(directory: Path) -> dict[str, str]:
    """What SHA256SUMS lists for one output directory, name -> sha256: the manifest's artifacts and the
    JSON documents at its top (the manifest and the SBOMs, per arch too), never the provenance.

    Artifacts' hashes come from the manifest, which was written from the files a moment ago, so a
    1 GiB disk is not read again; the documents are hashed here.
    """
    listed = {
        artifact["path"]: artifact["sha256"] for artifact in json.loads((directory / MANIFEST).read_text())["artifacts"]
    }
    for document in sorted(directory.glob("*.json")):
        if document.name != PROVENANCE:
            listed[document.name] = file_sha256(document)
    return listed


def write_platforms_manifest(
    directory: Path, profile: dict[str, Any], listed: list[dict[str, Any]], inputs: dict[str, dict[str, Any]]
) -> Path:
    """manifest.json of a profile built for several platforms (`kiln image --platform a,b`).

    The single-platform shape where it still holds: `profile` (its identity, with `arches` for
    the one `arch`), `artifacts` (each with the `arch` it boots on; none for what serves every
    platform, such as an installer's image index) and `inputs` (only what every platform shares:
    the profile file's sha256, SOURCE_DATE_EPOCH, ...); `platforms` maps each platform to its own
    inputs, in the single-platform `inputs` shape.
    """
    shared = dict(next(iter(inputs.values()))) if inputs else {}
    for each in inputs.values():
        shared = {key: value for key, value in shared.items() if each.get(key) == value}
    data = {
        "profile": profile,
        "artifacts": sorted(listed, key=lambda a: str(a["path"])),
        "inputs": shared,
        "platforms": inputs,
    }
    path = directory / MANIFEST
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def write_spdx(directory: Path, subject: SbomSubject) -> Path:
    """An SPDX 2.3 JSON document describing the image and the packages it contains (and the schematic
    it was customised with, as an external reference of the image package).

    From worker threads, call load_spdx() in the main thread first (see _SPDX_MODULES).
    """
    from spdx_tools.spdx.model.document import Document
    from spdx_tools.spdx.model.relationship import Relationship, RelationshipType
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document
    from spdx_tools.spdx.writer.json.json_writer import write_document_to_file

    name, version, seed, epoch = subject.name, subject.version, subject.seed, subject.epoch
    packages, schematic = subject.packages, subject.schematic
    spdx_packages = [_spdx_image(name, version, schematic)]
    relationships = [Relationship("SPDXRef-DOCUMENT", RelationshipType.DESCRIBES, "SPDXRef-image")]
    for item in sorted(packages, key=lambda p: p.name):
        described, related = _spdx_package(item)
        spdx_packages += described
        relationships += related
    info = _spdx_creation(name, version, seed, epoch)
    document = Document(info, packages=spdx_packages, relationships=relationships)
    problems = validate_full_spdx_document(document)
    if problems:
        raise BuildError("the SBOM does not validate: " + "; ".join(p.validation_message for p in problems[:5]))
    path = directory / SBOM
    write_document_to_file(document, str(path), validate=False)
    return path


def _spdx_creation(name: str, version: str, seed: str, epoch: int) -> CreationInfo:
    """Who made the document and when (SOURCE_DATE_EPOCH), in a namespace derived from the image's seed."""
    from spdx_tools.spdx.model.actor import Actor, ActorType
    from spdx_tools.spdx.model.document import CreationInfo

    created = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).replace(tzinfo=None)
    return CreationInfo(
        spdx_version="SPDX-2.3",
        spdx_id="SPDXRef-DOCUMENT",
        name=f"kiln-{name}-{version}",
        document_namespace=f"https://kiln.invalid/spdx/{name}/{derived_uuid(seed, 'sbom')}",
        creators=[Actor(ActorType.TOOL, f"kiln-{version}")],
        created=created,
    )


def _spdx_image(name: str, version: str, schematic: str | None) -> SpdxPackage:
    """The image itself, the document's one described package (with its schematic's ID, if any)."""
    from spdx_tools.spdx.model.package import ExternalPackageRef, ExternalPackageRefCategory, PackagePurpose
    from spdx_tools.spdx.model.package import Package as SpdxPackage
    from spdx_tools.spdx.model.spdx_no_assertion import SpdxNoAssertion

    image = SpdxPackage(
        "SPDXRef-image",
        f"kiln-{name}",
        SpdxNoAssertion(),
        version=version,
        files_analyzed=False,
        primary_package_purpose=PackagePurpose.OPERATING_SYSTEM,
        license_concluded=SpdxNoAssertion(),
        license_declared=SpdxNoAssertion(),
        copyright_text=SpdxNoAssertion(),
    )
    if schematic:
        image.external_references = [ExternalPackageRef(ExternalPackageRefCategory.OTHER, "kiln-schematic", schematic)]
    return image


def _spdx_package(item: SbomPackage) -> tuple[list[SpdxPackage], list[Relationship]]:
    """One package of the image and each of its sources (its own purl and sha256): the SPDX packages and
    the relationships (the image contains the package, the package is generated from its sources)."""
    from spdx_tools.common.spdx_licensing import spdx_licensing
    from spdx_tools.spdx.model.checksum import Checksum, ChecksumAlgorithm
    from spdx_tools.spdx.model.package import Package as SpdxPackage
    from spdx_tools.spdx.model.relationship import Relationship, RelationshipType
    from spdx_tools.spdx.model.spdx_no_assertion import SpdxNoAssertion

    sources = item.sources
    spdx_id = "SPDXRef-Package-" + "".join(c if c.isalnum() or c in ".-" else "-" for c in item.name)
    location: str | SpdxNoAssertion = sources[0].url if sources else SpdxNoAssertion()
    declared = spdx_licensing.parse(item.license) if item.license else SpdxNoAssertion()
    package = SpdxPackage(
        spdx_id,
        item.name,
        location,
        version=item.version or None,
        files_analyzed=False,
        checksums=[Checksum(ChecksumAlgorithm.SHA256, item.sha256)] if item.sha256 else [],
        source_info=item.origin,
        license_concluded=SpdxNoAssertion(),
        license_declared=declared,
        copyright_text=SpdxNoAssertion(),
        description=item.description or None,
        external_references=_spdx_references(item),
    )
    described = [package]
    related = [Relationship("SPDXRef-image", RelationshipType.CONTAINS, spdx_id)]
    for index, source in enumerate(sources):
        source_id = f"{spdx_id}-source-{index}"
        described.append(_spdx_source(source_id, item.name, source, declared))
        related.append(Relationship(spdx_id, RelationshipType.GENERATED_FROM, source_id))
    return described, related


def _spdx_references(item: SbomPackage) -> list[ExternalPackageRef]:
    """The package's store key, registry reference, purl and CPE, those it has."""
    from spdx_tools.spdx.model.package import ExternalPackageRef, ExternalPackageRefCategory

    refs = []
    if item.key:
        refs.append(ExternalPackageRef(ExternalPackageRefCategory.OTHER, "kiln-store-key", item.key))
    if item.reference:
        refs.append(ExternalPackageRef(ExternalPackageRefCategory.OTHER, "kiln-oci-reference", item.reference))
    if item.purl:
        refs.append(ExternalPackageRef(ExternalPackageRefCategory.PACKAGE_MANAGER, "purl", item.purl))
    if item.cpe:
        refs.append(ExternalPackageRef(ExternalPackageRefCategory.SECURITY, "cpe23Type", item.cpe))
    return refs


def _spdx_source(source_id: str, name: str, source: sbom_refs.SourceRef, declared: Any) -> SpdxPackage:
    """One source of a package, under the package's declared license."""
    from spdx_tools.spdx.model.checksum import Checksum, ChecksumAlgorithm
    from spdx_tools.spdx.model.package import ExternalPackageRef, ExternalPackageRefCategory, PackagePurpose
    from spdx_tools.spdx.model.package import Package as SpdxPackage
    from spdx_tools.spdx.model.spdx_no_assertion import SpdxNoAssertion

    return SpdxPackage(
        source_id,
        f"{name} source {source.destination}",
        source.url,
        files_analyzed=False,
        checksums=[Checksum(ChecksumAlgorithm.SHA256, source.sha256)],
        primary_package_purpose=PackagePurpose.SOURCE,
        license_concluded=SpdxNoAssertion(),
        license_declared=declared,
        copyright_text=SpdxNoAssertion(),
        external_references=[ExternalPackageRef(ExternalPackageRefCategory.PACKAGE_MANAGER, "purl", source.purl)],
    )
