"""The graph (order, closures, runtime deps, platforms) and the inspection verbs' output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.cli import build_parser
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import Result, write_tree

FILES = {
    "toolchain/pkg.yaml": "name: toolchain\nvariant: stage0\nfinalize: [{from: /toolchain, to: /toolchain}]\n",
    "zlib/pkg.yaml": "name: zlib\nfinalize: [{from: /, to: /}]\n",
    "ssl/pkg.yaml": (
        "name: ssl\ndependencies:\n  - {stage: zlib, runtime: true, to: /deps}\nfinalize: [{from: /, to: /}]\n"
    ),
    "curl/pkg.yaml": "name: curl\ndependencies:\n  - {stage: ssl, runtime: true}\nfinalize: [{from: /, to: /}]\n",
    "app/pkg.yaml": "name: app\ndependencies:\n  - {stage: curl}\nfinalize: [{from: /, to: /}]\n",
    "lonely/pkg.yaml": "name: lonely\nvariant: scratch\nversion: '{{ carch }}-{{ target }}'\n",
}


@pytest.fixture
def graph(tmp_path: Path) -> Graph:
    return Graph(load_tree(write_tree(tmp_path, FILES), Platform.parse("linux/amd64")))


def test_order_puts_needs_first_and_toolchain_edge_is_implicit(graph: Graph) -> None:
    order = graph.order
    assert order.index("toolchain") < order.index("zlib") < order.index("ssl") < order.index("curl")
    assert graph.edges["zlib"] == ["toolchain"]
    assert graph.edges["lonely"] == []
    assert graph.closure(["curl"]) == ["toolchain", "zlib", "ssl", "curl"]


def test_runtime_deps_are_transitive_and_handed_to_dependents(graph: Graph) -> None:
    assert [d.stage for d in graph.runtime_deps("curl")] == ["ssl", "zlib"]
    inputs = graph.build_inputs("app")
    assert [(d.stage, d.to) for d in inputs] == [("curl", "/"), ("ssl", "/"), ("zlib", "/deps")]
    assert [d.stage for d in graph.build_inputs("ssl")] == ["zlib"]


def test_dependents(graph: Graph) -> None:
    assert graph.dependents("zlib") == ["ssl", "curl", "app"]


def test_platform_variables(tmp_path: Path) -> None:
    pkgs = write_tree(tmp_path, FILES)
    arm = load_tree(pkgs, Platform.parse("linux/arm64"))
    assert arm.packages["lonely"].version == "aarch64-aarch64-kiln-linux-musl"


def test_variable_precedence(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(
        tmp_path,
        {
            "vars.yaml": "a: tree\nb: tree\nc: tree\narch: overridden\n",
            "p/vars.yaml": "b: package\nc: package\n",
            "p/pkg.yaml": "name: p\nvariant: scratch\n",
        },
    )
    result = kiln("eval", "p", "{{ a }} {{ b }} {{ c }} {{ arch }} {{ source_date_epoch }}", "--set", "c=cli")
    assert (result.code, result.out) == (0, "tree package cli overridden 1704067200\n")


def test_graph_formats(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(tmp_path, FILES)
    dot = kiln("graph", "curl")
    assert dot.code == 0
    assert dot.out.splitlines()[0] == "digraph kiln {"
    assert '  "curl" -> "ssl" [style=dashed];' in dot.out
    assert '"app"' not in dot.out
    mermaid = kiln("graph", "--format", "mermaid")
    assert mermaid.out.startswith("graph LR\n")
    data = json.loads(kiln("graph", "--format", "json", "--keys", "app").out)
    assert data["order"] == ["toolchain", "zlib", "ssl", "curl", "app"]
    assert all(len(node["key"]) == 64 for node in data["nodes"])
    assert data["nodes"][-1]["runtime_closure"] == []
    assert data["nodes"][3]["runtime_closure"] == ["ssl", "zlib"]


def test_ls_dump_validate(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(tmp_path, FILES)
    assert kiln("validate").out == "ok: 6 packages valid for linux/amd64\n"
    listing = kiln("ls").out.splitlines()
    assert listing[0] == "name\tvariant\tversion\tneeds\tkey"
    assert listing[1].startswith("app\ttoolchain\t-\tcurl,toolchain\t")
    data = json.loads(kiln("ls", "--json").out)
    assert data["ssl"]["needs"] == ["zlib", "toolchain"]
    dump = json.loads(kiln("dump", "--json", "ssl").out)
    assert list(dump) == ["toolchain", "zlib", "ssl"]
    assert dump["ssl"]["dependencies"] == [{"stage": "zlib", "from": "/", "to": "/deps", "runtime": True}]
    assert "name: ssl" in kiln("dump", "ssl").out


def test_unknown_target(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(tmp_path, FILES)
    result = kiln("graph", "crul")
    assert (result.code, result.err.strip()) == (2, "unknown package 'crul' (did you mean 'curl'?)")


def test_every_verb_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    verbs = ["validate", "ls", "graph", "eval", "dump"]
    for verb in verbs:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([verb, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "--pkgs DIR" in out and "--platform" in out and "--set KEY=VALUE" in out


def test_version(kiln: Callable[..., Result], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.startswith("kiln 0.1.0")
