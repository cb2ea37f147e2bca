"""The CycloneDX 1.5 SBOM beside the SPDX one: the same packages, purls, CPEs, licenses and sources.

Made with cyclonedx-python-lib and checked against the 1.5 JSON schema before it is written, so a
malformed document fails the image build. Reproducible: the serial number derives from the
outputs' seed and the timestamp is SOURCE_DATE_EPOCH. Imported only where images are made (the
imager loads it in the main thread before its workers start, as it does spdx-tools).
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.model.tool import Tool
from cyclonedx.output.json import JsonV1Dot5
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from kiln.core.errors import BuildError
from kiln.image.assets import derived_uuid
from kiln.image.manifest import CYCLONEDX, SbomSubject


def write_cyclonedx(directory: Path, subject: SbomSubject) -> Path:
    """Write directory/sbom.cdx.json describing the image and its packages (and its schematic's ID, as the
    image component's kiln:schematic property)."""
    name, version, seed, epoch = subject.name, subject.version, subject.seed, subject.epoch
    packages, schematic = subject.packages, subject.schematic
    bom = Bom(serial_number=derived_uuid(seed, "cyclonedx"))
    bom.metadata.timestamp = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    bom.metadata.tools.tools.add(Tool(vendor="Kiln", name="kiln", version=version))
    image = Component(
        name=f"kiln-{name}", version=version, type=ComponentType.OPERATING_SYSTEM, bom_ref=f"image:{name}"
    )
    if schematic:
        image.properties.add(Property(name="kiln:schematic", value=schematic))
    bom.metadata.component = image
    for item in sorted(packages, key=lambda p: p.name):
        sources = item.sources
        origin = ("kiln:oci-reference", item.reference) if item.reference else ("kiln:store-key", item.key)
        component = Component(
            name=item.name,
            version=item.version or None,
            type=ComponentType.OPERATING_SYSTEM if item.role == "kernel" else ComponentType.APPLICATION,
            bom_ref=f"package:{item.name}",
            description=item.description or None,
            purl=PackageURL.from_string(item.purl) if item.purl else None,
            cpe=item.cpe or None,
            licenses=[LicenseExpression(item.license)] if item.license else [],
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=item.sha256)] if item.reference and item.sha256 else [],
            properties=[Property(name="kiln:role", value=item.role), Property(name=origin[0], value=origin[1])],
            external_references=[
                ExternalReference(
                    type=ExternalReferenceType.DISTRIBUTION,
                    url=XsUri(source.url),
                    comment=f"source {source.destination} ({source.purl})",
                    hashes=[HashType(alg=HashAlgorithm.SHA_256, content=source.sha256)],
                )
                for source in sources
            ],
        )
        bom.components.add(component)
        bom.register_dependency(image, [component])
    text = JsonV1Dot5(bom).output_as_string(indent=2)
    problem = JsonStrictValidator(SchemaVersion.V1_5).validate_str(text)
    if problem is not None:
        raise BuildError(f"the CycloneDX SBOM does not validate: {problem}")
    path = directory / CYCLONEDX
    path.write_text(text + "\n")
    return path
