"""pkgs/toolchain: the full bootstrapped toolchain renders and validates for every platform, pinned."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest

from kiln.core import schema
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.model import Package
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"
TRIPLES = {"linux/amd64": "x86_64-kiln-linux-musl", "linux/arm64": "aarch64-kiln-linux-musl"}


def toolchain(platform: str, overrides: dict[str, str] | None = None) -> Package:
    return load_tree(PKGS, Platform.parse(platform), overrides).packages["toolchain"]


def script(package: Package) -> str:
    return "\n".join(text for step in package.steps for _, text in step.snippets())


@pytest.mark.parametrize("platform", sorted(TRIPLES))
def test_toolchain_renders_and_validates(platform: str) -> None:
    package = toolchain(platform)
    jsonschema.Draft202012Validator(schema.load_schema()).validate(package.spec)
    assert package.variant == "stage0"  # it is what every other package builds on
    assert [(f.source, f.to) for f in package.finalize] == [("/toolchain", "/toolchain")]
    triple = TRIPLES[platform]
    text = script(package)
    assert f"--target={triple} --prefix=/toolchain" in text
    assert f"--with-sysroot=/toolchain/{triple}" in text  # the sysroot toolchain-seed also uses
    assert "{{" not in text and "}}" not in text
    other = next(t for p, t in TRIPLES.items() if p != platform)
    assert other not in text


def test_arm64_uses_the_arm64_kernel_headers_and_musl_arch() -> None:
    text = script(toolchain("linux/arm64"))
    assert "ARCH=arm64 HOSTCC=gcc INSTALL_HDR_PATH=/toolchain/aarch64-kiln-linux-musl headers_install" in text
    assert "make -C src/musl ARCH=aarch64 " in text
    amd64 = script(toolchain("linux/amd64"))
    assert "ARCH=x86 HOSTCC=gcc" in amd64 and "ARCH=x86_64 " in amd64


@pytest.mark.parametrize("platform", sorted(TRIPLES))
def test_every_source_is_pinned_and_debian_can_serve_it(platform: str) -> None:
    sources = [s for step in toolchain(platform).steps for s in step.sources]
    names = {(s.debian or "").partition("=")[0] for s in sources}
    assert names == {"binutils", "linux", "musl", "gcc-12", "gmp", "mpfr4", "mpclib3"}
    for source in sources:
        assert not source.is_local
        assert source.sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", source.sha256), source
        assert source.debian and re.fullmatch(r"[a-z0-9][a-z0-9.+-]*=[A-Za-z0-9.+~:-]+", source.debian), source
        # Debian's own (repacked) files carry a Debian pool URL; the rest are upstream's bytes.
        if source.url and "deb.debian.org" in source.url:
            package, _, _ = source.debian.partition("=")
            assert f"/pool/main/{package[0]}/{package}/" in source.url
    assert len({s.destination for s in sources}) == len(sources)


def test_linux_source_is_the_kernel_packages_tarball() -> None:
    tree = load_tree(PKGS, Platform.parse("linux/amd64"))
    linux = [s for step in tree.packages["toolchain"].steps for s in step.sources if "linux" in (s.debian or "")]
    assert [s.sha256 for s in linux] == [tree.variables["kernel_sha256"]]
    if "kernel" in tree.packages:
        kernel = {s.sha256 for step in tree.packages["kernel"].steps for s in step.sources}
        assert linux[0].sha256 in kernel


def test_test_step_builds_and_runs_c_and_cxx_statically() -> None:
    text = script(toolchain("linux/amd64"))
    assert "x86_64-kiln-linux-musl-gcc -static" in text
    assert "x86_64-kiln-linux-musl-g++ -static" in text
    assert "./hello-c" in text and "./hello-cc" in text
    assert toolchain("linux/amd64").steps[-1].test


def test_ci_default_is_the_seed_and_toolchain_is_selectable() -> None:
    platform = Platform.parse("linux/amd64")
    default = load_tree(PKGS, platform)
    assert default.toolchain == "toolchain-seed"  # quick default: CI and make image build every package with it
    full = Graph(load_tree(PKGS, platform, {"toolchain": "toolchain"}))
    users = [n for n, p in full.tree.packages.items() if p.variant == "toolchain"]
    assert users, "no package builds with the toolchain"
    for name in users:
        assert "toolchain" in full.edges[name]
        assert "toolchain-seed" not in full.closure([name])
