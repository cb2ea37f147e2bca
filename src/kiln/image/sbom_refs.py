"""What lets a vulnerability scanner match an SBOM's packages: package URLs and CPEs.

A source taken from Debian's archive (its `debian:` hint names `package=version`) gets a Debian
purl, `pkg:deb/debian/NAME@VERSION?arch=source`, which scanners match against Debian's security
tracker; any other remote source a generic purl with its download URL and sha256. A package's own
purl is its first source's. A package's CPE comes from its pkg.yaml (`cpe:`), where NVD names the
project (the kernel, gcc, musl, util-linux...); Kiln does not guess one.
"""

from __future__ import annotations

from dataclasses import dataclass

from packageurl import PackageURL

from kiln.pkg.model import Package, Source


@dataclass(frozen=True)
class SourceRef:
    """One remote source of a package, as both SBOM formats list it."""

    destination: str
    url: str
    sha256: str
    purl: str


def source_purl(package: Package, source: Source) -> str:
    """The source's package URL: Debian's when its `debian:` hint names one, else a generic one."""
    if source.debian and "=" in source.debian:
        name, version = source.debian.split("=", 1)
        return PackageURL("deb", "debian", name, version, {"arch": "source"}).to_string()
    qualifiers = {"download_url": source.url or "", "checksum": f"sha256:{source.sha256}"}
    return PackageURL("generic", None, package.name, package.version or None, qualifiers).to_string()


def sources(package: Package) -> list[SourceRef]:
    """Every remote source of every step, in order (local `path:` sources are the tree's own files)."""
    return [
        SourceRef(s.destination, s.url, s.sha256, source_purl(package, s))
        for step in package.steps
        for s in step.sources
        if s.url and s.sha256
    ]


def package_purl(package: Package) -> str | None:
    """The package's purl: its first remote source's; None for a package made of the tree's files only."""
    found = sources(package)
    return found[0].purl if found else None
