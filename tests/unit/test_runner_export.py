"""The Dockerfile export, BuildKit log splitting, cache references and the shared runner pieces (no engine)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from kiln.build.cache_keys import compute_keys, stage0_key
from kiln.build.dockerfile import Exporter, stage_id
from kiln.build.remote import Ref
from kiln.build.rootplan import Layer, RootPlan
from kiln.build.runners.buildkit import BuildLog
from kiln.build.sources.place import place_local
from kiln.core.errors import BuildError, InputError
from kiln.core.treecopy import finalize_tree
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.model import Package
from kiln.pkg.variables import Platform

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/buildgraph"


def exporter(network_flags: bool = True) -> tuple[Exporter, Graph]:
    graph = Graph(load_tree(FIXTURE / "pkgs", Platform.parse("linux/amd64")))

    def place(package: Package, build_dir: Path) -> None:
        for step in package.steps:
            for source in step.sources:
                place_local(graph.tree.project_root, source, build_dir)

    keys = compute_keys(graph)
    return Exporter(graph, keys, stage0_key(graph.tree), place, 1704067200, 2, network_flags=network_flags), graph


def test_dockerfile_has_one_stage_set_per_package_in_build_order(tmp_path: Path) -> None:
    exp, graph = exporter()
    names = graph.closure(["greet-test"])
    export = exp.write(names, {"greet-test": "greet-test"}, tmp_path / "ctx")
    text = export.dockerfile.read_text()
    positions = [text.index(f"AS out-{n}\n") for n in names]
    assert positions == sorted(positions)
    # greet-app's root, bottom first: greet-conf at / (declared second), then greet-lib at /deps.
    app = text[text.index("AS build-greet-app") : text.index("AS out-greet-app")]
    assert app.index("COPY --from=out-greet-conf / /") < app.index("COPY --from=out-greet-lib / /deps/")
    assert "FROM scratch AS build-greet-conf" in text  # variant scratch
    assert "COPY --from=build-greet-conf /etc /etc" in text
    assert 'RUN --network=none ["/bin/sh", "-c"' in text
    assert text.rstrip().endswith("COPY --from=out-greet-test / /greet-test/")
    assert export.networked == []


def test_sources_are_checked_against_sums_pinned_in_the_dockerfile(tmp_path: Path) -> None:
    exp, graph = exporter(network_flags=False)
    export = exp.write(graph.closure(["greet-lib"]), {"greet-lib": "greet-lib"}, tmp_path / "ctx")
    text = export.dockerfile.read_text()
    assert "--network=" not in text
    sums = tmp_path / "ctx/sources/greet-lib/SHA256SUMS"
    assert hashlib.sha256(sums.read_bytes()).hexdigest() in text
    check = subprocess.run(["sha256sum", "-c", "--quiet", "../SHA256SUMS"], cwd=sums.parent / "tree")
    assert check.returncode == 0
    assert "./src/greet.c" in sums.read_text()
    skel = tmp_path / "ctx/skel/tmp"
    assert skel.stat().st_mode & 0o7777 == 0o1777


def test_stage_names_and_paths_the_dockerfile_cannot_hold() -> None:
    assert stage_id("libstdc++") == "libstdc__"
    from kiln.build.dockerfile import _q

    with pytest.raises(InputError):
        _q("/with space")


def test_buildkit_log_is_split_by_package_and_finds_the_failure() -> None:
    lines: list[tuple[str, str]] = []
    log = BuildLog(
        {"build-greet-lib": "greet-lib", "src-greet-lib": "greet-lib", "out-x": "x"},
        lambda pkg, line: lines.append((pkg, line)),
    )
    for line in [
        "#5 [internal] load metadata",
        "#7 [build-greet-lib 3/5] RUN gcc -c greet.c",
        "#7 0.5 compiling",
        "#7 DONE 1.5s",
        "#9 [out-x 1/1] COPY --from=build-x /out /",
        "#9 ERROR: failed to compute cache key",
        "#5 DONE 0.1s",
    ]:
        log.feed(line)
    assert [pkg for pkg, _ in lines] == ["greet-lib", "greet-lib", "greet-lib", "x", "x"]
    assert log.failed == ["x"]
    assert log.seconds == {"greet-lib": 1.5}


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        ("oci://localhost:5000/kiln/cache", "http"),
        ("oci://127.0.0.1:5000/kiln", "http"),
        ("oci://registry.example.com/kiln/store", "https"),
    ],
)
def test_cache_references(text: str, scheme: str) -> None:
    ref = Ref.parse(text)
    assert str(ref) == text
    assert ref.scheme == scheme


@pytest.mark.parametrize("text", ["localhost:5000/kiln", "oci://host", "oci://host/Upper", "https://h/r"])
def test_bad_cache_references(text: str) -> None:
    with pytest.raises(InputError, match="oci://HOST"):
        Ref.parse(text)


def test_insecure_registries_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_INSECURE_REGISTRIES", "cache.lan:5000, other")
    assert Ref.parse("oci://cache.lan:5000/kiln").scheme == "http"
    assert Ref.parse("oci://other/kiln").scheme == "http"
    assert Ref.parse("oci://third/kiln").scheme == "https"


def test_root_plan_orders_layers_top_first() -> None:
    dep, tool, seed = Layer(Path("/d"), "/deps", "k1"), Layer(Path("/t"), "/", "k2"), Layer(Path("/s"), "/", "k3")
    plan = RootPlan("p", "key", "toolchain", (dep,), tool, seed)
    assert plan.layers == [dep, tool, seed]
    assert plan.base == [seed, tool]


def test_finalize_copies_directory_contents_files_and_links(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "out/sub").mkdir(parents=True)
    (root / "out/sub/f").write_text("x")
    (root / "etc").mkdir()
    (root / "etc/conf").write_text("c")
    (root / "link").symlink_to("etc/conf")
    out.mkdir()
    finalize_tree(root, [("/out", "/"), ("/etc/conf", "/etc/renamed"), ("/link", "/l")], out)
    assert (out / "sub/f").read_text() == "x"
    assert (out / "etc/renamed").read_text() == "c"
    assert (out / "l").is_symlink()
    with pytest.raises(BuildError, match="finalize: /nope does not exist in the build root"):
        finalize_tree(root, [("/nope", "/")], out)
