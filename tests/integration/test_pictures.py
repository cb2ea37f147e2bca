"""The pictures of real runs: `kiln graph --format svg|png` through Graphviz, the timeline of a real
`kiln build --json` of the fixture tree, and the sizes of a real (small) image made by `kiln image`.

The image is a real one made by the real imager, from packages built here: two stand-ins
(`tiny-kernel`: a vmlinuz and two module files of zeros; `tiny-init`: a static C program) and the
fixture tree's greet-app and greet-conf as its rootfs. Every picture is read back: the SVG's XML
for its nodes, bars and labels, the PNG's signature.
"""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.conftest import Project

pytestmark = pytest.mark.integration

SVG = "{http://www.w3.org/2000/svg}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY_KERNEL = """\
name: tiny-kernel
variant: stage0
version: "1.0"
description: stands in for a kernel, a vmlinuz and two modules of zeros
steps:
  - install:
      - mkdir -p /out/boot /out/usr/lib/modules/6.0.0-tiny/kernel/drivers
      - head -c 300000 /dev/zero > /out/boot/vmlinuz
      - head -c 200000 /dev/zero > /out/usr/lib/modules/6.0.0-tiny/kernel/drivers/big.ko
      - head -c 1000 /dev/zero > /out/usr/lib/modules/6.0.0-tiny/kernel/drivers/small.ko
finalize:
  - from: /out
    to: /
"""
TINY_INIT = """\
name: tiny-init
variant: stage0
version: "1.0"
description: stands in for init, a static program that exits
steps:
  - build:
      - printf 'int main(void) { return 0; }\\n' > init.c
      - gcc -O2 -static init.c -o init
    install:
      - mkdir -p /out
      - install -m 755 init /out/init
finalize:
  - from: /out
    to: /
"""
PROFILE = {
    "platform": "metal",
    "version": "0.1.0",
    "input": {"kernel": {"package": "tiny-kernel"}, "init": "tiny-init", "rootfs": ["greet-app", "greet-conf"]},
    "output": {"kind": "initramfs"},
}


def add_stand_ins(project: Project) -> None:
    for name, text in (("tiny-kernel", TINY_KERNEL), ("tiny-init", TINY_INIT)):
        (project.pkgs / name).mkdir()
        (project.pkgs / name / "pkg.yaml").write_text(text)


def svg_root(path: Path) -> ET.Element:
    return ET.fromstring(path.read_bytes())


def texts(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in root.iter(f"{SVG}text")]


def ids(root: ET.Element) -> set[str]:
    return {e.attrib["id"] for e in root.iter() if "id" in e.attrib}


def test_graph_pictures_hold_every_package(project: Project) -> None:
    names = json.loads(project.kiln("graph", "--json", check=True).out)["order"]
    project.kiln("graph", "--format", "svg", "-o", "graph.svg", check=True)
    root = svg_root(project.root / "graph.svg")
    nodes = [g for g in root.iter(f"{SVG}g") if g.attrib.get("class") == "node"]
    assert sorted("".join(g.find(f"{SVG}title").itertext()) for g in nodes) == sorted(names)  # type: ignore[union-attr]
    for name in names:
        assert name in texts(root)
    edges = {"".join(g.find(f"{SVG}title").itertext()) for g in root.iter(f"{SVG}g") if g.attrib.get("class") == "edge"}  # type: ignore[union-attr]
    assert "greet-app->greet-lib" in edges
    project.kiln("graph", "--format", "png", "-o", "graph.png", "greet-app", check=True)
    assert (project.root / "graph.png").read_bytes().startswith(PNG_SIGNATURE)
    piped = project.kiln("graph", "--format", "svg", "greet-app", check=True)  # not a terminal: stdout is fine
    shown = texts(ET.fromstring(piped.out))
    assert "greet-lib" in shown and "greet-test" not in shown


def test_timeline_and_sizes_of_a_real_build_and_image(project: Project) -> None:
    add_stand_ins(project)
    run = project.kiln("build", "--json", "-j", "2", "greet-test", "tiny-kernel", "tiny-init", check=True)
    (project.root / "build.json").write_text(run.out)
    packages = json.loads(run.out)["packages"]
    built = {name for name, info in packages.items() if info["status"] == "built"}
    assert built == {"greet-lib", "greet-conf-src", "greet-conf", "greet-app", "greet-test", "tiny-kernel", "tiny-init"}
    for name in built:
        info = packages[name]
        assert 0 <= info["started"] <= info["finished"]
        assert all(packages[need]["finished"] <= info["started"] for need in info["needs"])

    summary = project.kiln("report", "timeline", "build.json", "-o", "timeline.svg", check=True).out
    root = svg_root(project.root / "timeline.svg")
    bars = {i.split("-", 1)[1]: i.split("-", 1)[0] for i in ids(root) if i.startswith(("bar-", "critical-"))}
    assert set(bars) == built  # one bar per package built, nothing else
    labels = texts(root)
    assert built <= set(labels)
    critical = [name for name in summary.split("critical path: ")[1].split(" -> ")]
    critical = [step.split(" (")[0] for step in critical]
    assert {name for name, kind in bars.items() if kind == "critical"} == set(critical)
    last = max(built, key=lambda n: packages[n]["finished"])
    assert critical[-1] == last
    for need, dependent in itertools.pairwise(critical):
        assert need in packages[dependent]["needs"]
    assert any(t.startswith("critical path: " + " → ".join(critical)) for t in labels)
    project.kiln("report", "timeline", "build.json", "-o", "timeline.png", check=True)
    assert (project.root / "timeline.png").read_bytes().startswith(PNG_SIGNATURE)

    (project.root / "tiny.yaml").write_text(json.dumps(PROFILE))
    project.kiln("image", "./tiny.yaml", "--out", "out", check=True)
    result = project.kiln("report", "sizes", "out/tiny", "--json", "-o", "sizes.svg", check=True)
    measured = json.loads(result.out)
    by_name = {p["name"]: p for p in measured["packages"]}
    assert by_name["kernel modules"] == {"name": "kernel modules", "role": "modules", "files": 2, "bytes": 201000}
    assert by_name["tiny-kernel"]["role"] == "kernel" and by_name["tiny-kernel"]["bytes"] == 300000
    assert by_name["tiny-init"]["role"] == "init" and by_name["tiny-init"]["bytes"] > 0
    assert by_name["greet-app"]["role"] == "rootfs" and by_name["greet-app"]["files"] == 1
    assert by_name["greet-conf"]["role"] == "rootfs"
    assert measured["rootfs_bytes"] == sum(
        p["bytes"] for p in measured["packages"] if p["role"] != "kernel" and p["role"] != "init"
    )
    largest = {f["path"]: f["package"] for f in measured["largest"]}
    assert largest["/usr/lib/modules/6.0.0-tiny/kernel/drivers/big.ko"] == "kernel modules"
    assert largest["/usr/bin/greet"] == "greet-app"
    assert 0 < measured["squashfs_bytes"] < measured["rootfs_bytes"]
    assert "initramfs-amd64.zst" in measured["artifacts"]  # the profile's output, named for its arch
    root = svg_root(project.root / "sizes.svg")
    assert {f"package-{name}" for name in by_name} <= ids(root)
    assert {"greet-app", "kernel modules", "tiny-kernel (vmlinuz)", "tiny-init (/init)", "/usr/bin/greet"} <= set(
        texts(root)
    )
    table = project.kiln("report", "sizes", "out/tiny", check=True).out
    assert "greet-app\trootfs\t1\t" in table and "/usr/bin/greet\tgreet-app" in table
