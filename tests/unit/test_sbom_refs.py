"""What makes an SBOM's packages matchable: purls from sources, licenses checked against SPDX's list,
CPEs in the CPE 2.3 form, and bad values reported at their pkg.yaml line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from packageurl import PackageURL

from kiln.core.errors import InputErrors, KilnError
from kiln.image.sbom_refs import package_purl, source_purl, sources
from kiln.pkg.loader import load_tree
from kiln.pkg.model import license_problem
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
AMD64 = Platform.parse("linux/amd64")


def test_a_debian_sourced_package_gets_a_debian_purl() -> None:
    tree = load_tree(ROOT / "pkgs", AMD64)
    kernel = tree.packages["kernel"]
    purl = PackageURL.from_string(package_purl(kernel) or "")
    assert (purl.type, purl.namespace, purl.name) == ("deb", "debian", "linux")
    assert purl.version == tree.variables["kernel_debian_version"] and purl.qualifiers == {"arch": "source"}
    assert kernel.cpe == f"cpe:2.3:o:linux:linux_kernel:{kernel.version}:*:*:*:*:*:*:*"
    assert kernel.license == "GPL-2.0-only WITH Linux-syscall-note"


def test_every_remote_source_is_listed_and_a_source_without_a_hint_gets_a_generic_purl() -> None:
    tree = load_tree(ROOT / "pkgs", AMD64)
    toolchain = tree.packages["toolchain"]
    listed = sources(toolchain)
    remote = [s for step in toolchain.steps for s in step.sources if s.url]
    assert [s.url for s in listed] == [s.url for s in remote] and len(listed) >= 6  # binutils, gcc, musl, gmp...
    unhinted = [s for s in remote if not s.debian]
    for source in unhinted:
        purl = PackageURL.from_string(source_purl(toolchain, source))
        assert purl.type == "generic" and purl.qualifiers["download_url"] == source.url
        assert purl.qualifiers["checksum"] == f"sha256:{source.sha256}"
    assert package_purl(tree.packages["fhs"]) is None  # made of the tree's own files only


def test_every_shipped_package_declares_a_valid_license() -> None:
    for platform in ("linux/amd64", "linux/arm64"):
        tree = load_tree(ROOT / "pkgs", Platform.parse(platform))
        for name, package in tree.packages.items():
            if package.variant == "stage0":
                continue
            assert package.license, f"{name} has no license"
            assert license_problem(package.license) is None, name


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("GPL2", "Unknown license key(s): GPL2"),
        ("gpl-2.0", "write it as SPDX does: 'GPL-2.0-only'"),
        ("MIT OR", "not a well-formed SPDX license expression"),
        ("MIT WITH GPL-2.0-only", "cannot be used as an exception"),
        ("x" * 1001, "over 1000 characters"),
    ],
)
def test_bad_license_expressions_say_why(expression: str, problem: str) -> None:
    assert problem in (license_problem(expression) or "")


def test_a_bad_license_or_cpe_is_an_error_at_its_line(tmp_path: Path) -> None:
    pkgs = tmp_path / "pkgs"
    shutil.copytree(ROOT / "tests/fixtures/buildgraph/pkgs", pkgs)
    spec = pkgs / "greet-lib/pkg.yaml"
    original = spec.read_text()
    lines = original.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("name:")) + 1
    for line, message in (
        ("license: GPL2", "license 'GPL2': Unknown license key(s): GPL2"),
        ("cpe: cpe:2.3:a:foo", "cpe must be a CPE 2.3 formatted string"),
        # a Debian revision's '+' unescaped: what spdx-tools' validation would refuse at image time
        ("cpe: 'cpe:2.3:a:gnu:grub2:2.06-13+deb12u2:*:*:*:*:*:*:*'", "cpe must be a CPE 2.3 formatted string"),
    ):
        spec.write_text("\n".join([*lines[:at], line, *lines[at:]]) + "\n")
        with pytest.raises(KilnError) as info:
            load_tree(pkgs, AMD64)
        errors = info.value.errors if isinstance(info.value, InputErrors) else [info.value]
        assert [(e.location.line if e.location else 0, message in e.message) for e in errors] == [(at + 1, True)]


def test_every_shipped_cpe_is_one_spdx_tools_accepts() -> None:
    """The schema's CPE pattern is stricter than a colon count; spdx-tools' own one is the judge."""
    from spdx_tools.spdx.validation.external_package_ref_validator import CPE23TYPE_REGEX

    for platform in (AMD64, Platform.parse("linux/arm64")):
        tree = load_tree(ROOT / "pkgs", platform)
        cpes = {p.name: p.cpe for p in tree.packages.values() if p.cpe}
        assert "grub-efi-arm64" in cpes or platform == AMD64
        assert [name for name, cpe in cpes.items() if not re.match(CPE23TYPE_REGEX, cpe)] == []
