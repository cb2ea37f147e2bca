"""Text forms of a graph for people and machines: dot, mermaid, JSON, dumps."""

from __future__ import annotations

import json
from typing import Any

import yaml

from kiln.pkg.graph import Graph

GRAPH_FORMATS = ("dot", "mermaid", "json")


def graph_data(graph: Graph, names: list[str], keys: dict[str, str] | None) -> dict[str, Any]:
    """Nodes in build order with their edges; runtime edges are marked."""
    nodes = []
    for name in names:
        package = graph.tree.packages[name]
        runtime = {d.stage for d in package.dependencies if d.runtime}
        node: dict[str, Any] = {
            "name": name,
            "variant": package.variant,
            "needs": [{"name": n, "runtime": n in runtime} for n in graph.edges[name]],
            "runtime_closure": [d.stage for d in graph.runtime_deps(name)],
        }
        if keys:
            node["key"] = keys[name]
        nodes.append(node)
    return {"platform": str(graph.tree.platform), "order": names, "nodes": nodes}


def render_graph(graph: Graph, names: list[str], fmt: str, keys: dict[str, str] | None = None) -> str:
    data = graph_data(graph, names, keys)
    if fmt == "json":
        return json.dumps(data, indent=2)

    def label(node: dict[str, Any]) -> str:
        return f"{node['name']}\\n{node['key'][:12]}" if keys else str(node["name"])

    if fmt == "dot":
        lines = ["digraph kiln {", "  rankdir=LR;", "  node [shape=box];"]
        for node in data["nodes"]:
            lines.append(f'  "{node["name"]}" [label="{label(node)}"];')
        for node in data["nodes"]:
            for need in node["needs"]:
                style = " [style=dashed]" if need["runtime"] else ""
                lines.append(f'  "{node["name"]}" -> "{need["name"]}"{style};')
        lines.append("}")
        return "\n".join(lines)
    ids = {name: f"n{i}" for i, name in enumerate(names)}
    lines = ["graph LR"]
    for node in data["nodes"]:
        text = label(node).replace("\\n", "<br/>")
        lines.append(f'  {ids[node["name"]]}["{text}"]')
    for node in data["nodes"]:
        for need in node["needs"]:
            arrow = "-.->" if need["runtime"] else "-->"
            lines.append(f"  {ids[node['name']]} {arrow} {ids[need['name']]}")
    return "\n".join(lines)


class _BlockDumper(yaml.SafeDumper):
    """Shell snippets read best as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=1000)
