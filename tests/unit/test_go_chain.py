"""The Go machined builds with is a supported release, bootstrapped in the graph step by step.

Each Go release builds only with a Go at least so new (src/cmd/dist/notgo*.go, make.bash's check);
this walks pkgs/go's chain of GOROOT_BOOTSTRAPs back to the Go Debian ships (a package that
unpacks Debian's binaries, or stage0's Go) and checks every link, so a bump of one step cannot
silently break the next.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln.pkg.graph import Graph
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.model import Package, Source
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"
POOL = "http://deb.debian.org/debian/pool/main/g/golang-1."

# Supported Go releases (the two newest minors) as of 2026-11; raise this when Go 1.28 ships.
OLDEST_SUPPORTED = (1, 26)

# The oldest Go each release's cmd/dist accepts as GOROOT_BOOTSTRAP.
MINIMUM_BOOTSTRAP: dict[tuple[int, int], tuple[int, ...]] = {
    (1, 21): (1, 17, 13),
    (1, 22): (1, 20),
    (1, 23): (1, 20, 6),
    (1, 24): (1, 22, 6),
    (1, 25): (1, 22, 6),
    (1, 26): (1, 24, 6),
    (1, 27): (1, 24, 6),
}

# stage0's Go: Debian bookworm's golang-go, the golang-1.19 packages (pkgs/stage0.yaml).
STAGE0_GO = {"/usr/lib/go-1.19": (1, 19, 8)}


def version_of(text: str) -> tuple[int, ...]:
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", text), text
    return tuple(int(part) for part in text.split("."))


@pytest.fixture(scope="module", params=["linux/amd64", "linux/arm64"])
def tree(request: pytest.FixtureRequest) -> Tree:
    return load_tree(PKGS, Platform.parse(request.param))


def goroot_bootstrap(package: Package) -> str | None:
    values = {value for step in package.steps for key, value in step.env if key == "GOROOT_BOOTSTRAP"}
    assert len(values) <= 1, f"{package.name}: one GOROOT_BOOTSTRAP, got {sorted(values)}"
    return values.pop() if values else None


def sources(package: Package) -> list[Source]:
    return [s for step in package.steps for s in step.sources]


def provider(tree: Tree, package: Package, path: str) -> Package | None:
    """The dependency whose output lands at `path` in `package`'s build root (None: the base's)."""
    for dep in package.dependencies:
        other = tree.packages[dep.stage]
        for fin in other.finalize:
            landed = dep.to.rstrip("/") + fin.to if dep.source == "/" else None
            if landed == path:
                return other
    return None


def chain(tree: Tree) -> tuple[list[tuple[Package, tuple[int, ...]]], Package | None]:
    """(package, the version of the Go it bootstraps with) from pkgs/go back, and the start.

    The start is the package that unpacks Debian's Go binaries (it builds nothing, so it has no
    GOROOT_BOOTSTRAP), or None when the last link bootstraps with stage0's Go itself.
    """
    links: list[tuple[Package, tuple[int, ...]]] = []
    package = tree.packages["go"]
    while True:
        assert len(links) < 10, "a cycle in the Go chain"
        path = goroot_bootstrap(package)
        if path is None:
            return links, package
        previous = provider(tree, package, path)
        if previous is None:
            assert path in STAGE0_GO, f"{package.name}: GOROOT_BOOTSTRAP {path} is no package's output nor stage0's Go"
            links.append((package, STAGE0_GO[path]))
            return links, None
        links.append((package, version_of(previous.version)))
        package = previous


def test_the_graphs_go_is_a_supported_release(tree: Tree) -> None:
    assert version_of(tree.packages["go"].version)[:2] >= OLDEST_SUPPORTED
    assert "go" in Graph(tree).closure(["machined"])


def test_every_step_bootstraps_with_a_go_new_enough(tree: Tree) -> None:
    links, _ = chain(tree)
    assert links, "pkgs/go builds Go from source"
    for package, bootstrap in links:
        minor = version_of(package.version)[:2]
        assert minor in MINIMUM_BOOTSTRAP, f"{package.name}: add Go {minor}'s bootstrap rule to this test"
        need = MINIMUM_BOOTSTRAP[minor]
        assert bootstrap >= need, f"{package.name} ({package.version}) needs Go >= {need}, has {bootstrap}"


def test_every_built_step_is_the_version_it_names_from_a_pinned_debian_orig(tree: Tree) -> None:
    links, _ = chain(tree)
    for package, _ in links:
        (source,) = sources(package)
        assert source.url and source.url.startswith(POOL), package.name
        assert source.url.endswith(f"_{package.version}.orig.tar.gz"), package.name
        assert source.sha256 and re.fullmatch(r"[0-9a-f]{64}", source.sha256), package.name


@pytest.mark.parametrize("build", ["amd64", "arm64"])
def test_the_chain_starts_at_debians_go_binaries_for_the_build_machine(tree: Tree, build: str) -> None:
    """Go runs where it builds: an arm64 target built on amd64 uses amd64 Go (GOARCH does the rest)."""
    built_on = load_tree(PKGS, tree.platform, build=Platform("linux", build))
    _, start = chain(built_on)
    assert start is not None, "the chain starts at a package unpacking Debian's Go"
    urls = [s.url or "" for s in sources(start)]
    assert any(re.search(rf"/golang-1\.\d+-go_{re.escape(start.version)}-[^_]+_{build}\.deb$", u) for u in urls), urls
    assert any(re.search(rf"/golang-1\.\d+-src_{re.escape(start.version)}-[^_]+_all\.deb$", u) for u in urls), urls
    assert all(u.startswith(POOL) for u in urls)
    assert all(s.sha256 and re.fullmatch(r"[0-9a-f]{64}", s.sha256) for s in sources(start))
    go_debs = {s.sha256 for s in sources(start) if "-go_" in (s.url or "")}
    other_build = Platform("linux", "arm64" if build == "amd64" else "amd64")
    other = load_tree(PKGS, tree.platform, build=other_build)
    assert go_debs.isdisjoint(s.sha256 for s in sources(other.packages[start.name]) if "-go_" in (s.url or ""))


def test_the_bootstraps_stay_out_of_what_machined_gets(tree: Tree) -> None:
    go = tree.packages["go"]
    assert [(f.source, f.to) for f in go.finalize] == [("/toolchain/go", "/toolchain/go")]
    assert not any(dep.runtime for dep in go.dependencies)
    env = dict(env for step in go.steps for env in step.env)
    assert env["CGO_ENABLED"] == "0" and env["GOTOOLCHAIN"] == "local"
    assert "GOROOT_FINAL" not in env  # gone since Go 1.23: cmd/go finds GOROOT from its executable
