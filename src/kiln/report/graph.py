"""The package graph as a picture: `kiln graph --format svg|png`, drawn by Graphviz's `dot`.

The dot text is made from the same data as `kiln graph --format dot` (kiln.pkg.show), with
colours for the variants and a legend; `dot` reads it on stdin, so no package string ever
reaches a shell or a command line. Graphviz lays graphs out far better than anything Kiln would
write itself, and is one apt package (scripts/setup-host.sh installs it).
"""

from __future__ import annotations

import shutil
from typing import Any

from kiln.core import tools
from kiln.core.errors import InputError
from kiln.pkg.graph import Graph
from kiln.pkg.show import graph_data

PICTURE_FORMATS = ("svg", "png")
DOT = "dot"
# Fill colour per variant (the build root's base): the seed, everything built with the toolchain, scratch.
VARIANT_FILL = {"stage0": ("#F8B878", "orange"), "toolchain": ("#A0C4E8", "blue"), "scratch": ("#9FD4CF", "teal")}
OTHER_FILL = ("#DDDDDD", "grey")


def _quote(text: str) -> str:
    """A dot string literal (package names are already plain, this keeps it so whatever they hold)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def picture_dot(graph: Graph, names: list[str], keys: dict[str, str] | None = None) -> str:
    """dot text for the picture: nodes filled by variant, runtime needs dashed, a legend below."""
    data: dict[str, Any] = graph_data(graph, names, keys)
    lines = [
        "digraph kiln {",
        "  rankdir=LR; ranksep=0.5; nodesep=0.25; bgcolor=white;",
        '  graph [fontname="DejaVu Sans", fontsize=11, labelloc=b];',
        '  node [shape=box, style="rounded,filled", fontname="DejaVu Sans", fontsize=10, color="#555555"];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]
    variants: set[str] = set()
    for node in data["nodes"]:
        variants.add(node["variant"])
        label = node["name"] + (f"\n{node['key'][:12]}" if keys else "")
        fill = VARIANT_FILL.get(node["variant"], OTHER_FILL)[0]
        lines.append(f"  {_quote(node['name'])} [label={_quote(label)}, fillcolor={_quote(fill)}];")
    runtime = False
    for node in data["nodes"]:
        for need in node["needs"]:
            style = " [style=dashed]" if need["runtime"] else ""
            runtime = runtime or need["runtime"]
            lines.append(f"  {_quote(node['name'])} -> {_quote(need['name'])}{style};")
    legend = ", ".join(f"{VARIANT_FILL.get(v, OTHER_FILL)[1]} {v}" for v in sorted(variants))
    title = f"Kiln package graph, {data['platform']}: {len(names)} packages; arrows point to what a package needs"
    title += f"; fill is the variant ({legend})" if legend else ""
    title += "; dashed: needed at run time too" if runtime else ""
    lines.append(f"  label={_quote(title)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_picture(dot_text: str, fmt: str) -> bytes:
    """dot text drawn as SVG or PNG by Graphviz's `dot` (read from stdin, no shell)."""
    if fmt not in PICTURE_FORMATS:
        raise InputError(f"unknown picture format {fmt!r}: choose one of {', '.join(PICTURE_FORMATS)}")
    if shutil.which(DOT) is None:
        raise InputError(
            "drawing the graph needs Graphviz's dot, which is not installed: "
            "apt-get install graphviz (scripts/setup-host.sh installs it)"
        )
    return tools.run([DOT, f"-T{fmt}"], stdin=dot_text, what="Graphviz dot").stdout


def draw_graph(graph: Graph, names: list[str], fmt: str, keys: dict[str, str] | None = None) -> bytes:
    """`kiln graph --format svg|png`: the closure `names` drawn."""
    return render_picture(picture_dot(graph, names, keys), fmt)
