"""Graph-level checks of Kiln's own pkgs/ tree: it validates, its sources are pinned, --all reaches it all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln.build import rootplan
from kiln.build.cache_keys import compute_keys
from kiln.pkg.graph import Graph
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"
PLATFORMS = ["linux/amd64", "linux/arm64"]

# The rootfs userland and runtime packages: they must stay in the tree.
USERLAND = {"fhs", "ca-certificates", "util-linux", "e2fsprogs", "dosfstools", "kmod", "xfsprogs"}
RUNTIME = {"init", "machined", "go"}

DEBIAN_HINT = re.compile(r"^[a-z0-9][a-z0-9.+-]+=[0-9][A-Za-z0-9.+~:-]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
DEBIAN_POOL = "http://deb.debian.org/debian/pool/"


@pytest.fixture(scope="module", params=PLATFORMS)
def tree(request: pytest.FixtureRequest) -> Tree:
    return load_tree(PKGS, Platform.parse(request.param))


def test_every_pkg_yaml_validates_on_every_platform(tree: Tree) -> None:
    files = sorted(PKGS.rglob("pkg.yaml"))
    assert len(tree.packages) == len(files)
    assert USERLAND | RUNTIME | {"toolchain-seed"} <= set(tree.packages)


def test_every_package_is_reachable_from_all(tree: Tree) -> None:
    graph = Graph(tree)
    everything = set(tree.packages)
    # `kiln build --all` builds graph.order; nothing is left out and the closure adds nothing new
    assert set(graph.order) == everything
    assert set(graph.closure(graph.order)) == everything
    keys = compute_keys(graph)
    assert everything <= set(keys)


def test_toolchain_variant_builds_with_the_selected_toolchain(tree: Tree) -> None:
    graph = Graph(tree)
    assert tree.toolchain in tree.packages
    for name in USERLAND | RUNTIME:
        package = tree.packages[name]
        assert package.variant == "toolchain", name
        assert tree.toolchain in graph.edges[name], name
    assert "go" in graph.closure(["machined"])


def test_every_remote_source_is_pinned_with_a_debian_hint(tree: Tree) -> None:
    remote = 0
    for package in tree.packages.values():
        for step in package.steps:
            for source in step.sources:
                if source.is_local:
                    continue
                remote += 1
                where = f"{package.name}: {source.url}"
                assert source.sha256 and SHA256.match(source.sha256), where
                if source.debian is None:
                    # a Debian binary package (go-bootstrap-1.25 unpacks Debian's Go) has no source
                    # package for `apt-get source`; its URL is the pool's
                    assert source.url and source.url.startswith(DEBIAN_POOL) and source.url.endswith(".deb"), where
                    continue
                assert DEBIAN_HINT.match(source.debian), where
    assert remote >= len(USERLAND - {"fhs"}) + 2  # + musl and go


def test_runtime_packages_build_this_repositorys_sources(tree: Tree) -> None:
    for name, path in (("init", "runtime/init"), ("machined", "runtime/machined")):
        sources = [s for step in tree.packages[name].steps for s in step.sources]
        assert [s.path for s in sources] == [path], name
        assert (ROOT / path).is_dir()


def test_userland_packages_test_what_they_build(tree: Tree) -> None:
    for name in USERLAND | RUNTIME:
        package = tree.packages[name]
        assert any(step.test for step in package.steps), f"{name} has no test step"
        assert package.finalize, name


def test_go_is_bootstrapped_by_stage0s_go() -> None:
    stage0 = (PKGS / "stage0.yaml").read_text()
    assert re.search(r"^\s*-\s*golang-go\s*$", stage0, re.M)
    fixture = ROOT / "tests/fixtures/buildgraph/pkgs/stage0.yaml"
    assert fixture.read_text() == stage0, "tests share one seed: keep the fixture's stage0.yaml a copy"


def test_the_kernel_compiles_through_a_kept_ccache_and_applies_its_patches(tree: Tree) -> None:
    """kernel and kernel-build: the same patches, ccache in front of every compiler, its cache kept;
    the kernel keeps its object tree too, between incremental.sh's begin and end around make, and
    unpacks its source into a scratch directory."""
    vars_text = (PKGS / "vars.yaml").read_text()
    assert f'ccache_path: "/tmp/ccache-bin:{rootplan.PATH}"' in vars_text  # the step's PATH, ccache first
    for name in ("kernel", "kernel-build"):
        step = tree.packages[name].steps[0]
        env = dict(step.env)
        assert step.cache == (("/tmp/ccache", "/tmp/build/obj") if name == "kernel" else ("/tmp/ccache",)), name
        assert env["CCACHE_DIR"] == "/tmp/ccache" and env["PATH"].startswith("/tmp/ccache-bin:"), name
        assert any(source.destination == "kiln/patches" for source in step.sources), name
        prepare = "\n".join(step.prepare)
        assert (
            prepare.index("-xf linux.tar.xz") < prepare.index("kiln/patches/*.patch") < prepare.index("compiler_check")
        )
        assert "xz -T0" in prepare, name  # the tarball's blocks decompressed on every core
    kernel = tree.packages["kernel"].steps[0]
    assert kernel.scratch == ("/tmp/build/linux",)  # the source tree in memory: O= builds leave it untouched
    build = kernel.build
    assert build[0].startswith("sh kiln/incremental.sh begin /tmp/build/linux /tmp/build/obj")
    assert "kconfig.sh" in build[1]
    make = next(snippet for snippet in build if " modules" in snippet)
    assert make.index("make -C linux O=/tmp/build/obj") < make.index(
        "incremental.sh end /tmp/build/linux /tmp/build/obj"
    )


def test_extension_modules_compile_through_ccache_too(tree: Tree) -> None:
    """acpi-call, built against kernel-build, keeps a compiler cache of its own the same way."""
    step = tree.packages["acpi-call"].steps[0]
    env = dict(step.env)
    assert step.cache == ("/tmp/ccache",)
    assert env["CCACHE_CONFIGPATH"] == "/tmp/ccache.conf" and env["PATH"].startswith("/tmp/ccache-bin:")
    assert "compiler_check" in "\n".join(step.prepare) and "ccache --print-stats" in "\n".join(step.build)
