"""kiln.report: the timeline's critical path, the charts' content (read back from the SVG's XML),
reproducible bytes, PNG output, and where pictures may be written. Charts are drawn for real with
matplotlib from documents written here; tests/integration/test_pictures.py draws real builds."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kiln.cli import build_parser
from kiln.core.errors import InputError
from kiln.report import output, sizes, timeline

SVG = "{http://www.w3.org/2000/svg}"


def build_doc() -> dict[str, Any]:
    """A -j2 build: seed cached; lib -> app -> test is the long chain, conf waits for a free job."""
    return {
        "packages": {
            "seed": {"status": "cached", "started": 0.0, "finished": 0.0, "needs": []},
            "lib": {"status": "built", "started": 0.1, "finished": 5.0, "needs": ["seed"]},
            "conf": {"status": "built", "started": 5.0, "finished": 6.0, "needs": ["seed"]},
            "app": {"status": "built", "started": 5.0, "finished": 12.0, "needs": ["lib", "seed"]},
            "docs": {"status": "built", "started": 6.0, "finished": 7.0, "needs": ["conf"]},
            "test": {"status": "built", "started": 12.0, "finished": 14.5, "needs": ["app", "conf"]},
            "never": {"status": "skipped", "started": None, "finished": None, "needs": ["test"]},
        }
    }


def ids(svg: bytes) -> set[str]:
    return {e.attrib["id"] for e in ET.fromstring(svg).iter() if "id" in e.attrib}


def texts(svg: bytes) -> list[str]:
    return ["".join(e.itertext()) for e in ET.fromstring(svg).iter(f"{SVG}text")]


def test_critical_path_follows_the_need_that_finished_last() -> None:
    line = timeline.timeline(build_doc()["packages"])
    assert line.critical == ["lib", "app", "test"]
    assert [b.name for b in line.bars] == ["lib", "conf", "app", "docs", "test"]  # by start, then finish
    assert line.cached == ["seed"] and line.end == 14.5
    conf = next(b for b in line.bars if b.name == "conf")
    assert conf.ready == 0.0  # its one need was cached: it could have started at once
    assert "critical path: lib (4.9 s) -> app (7.0 s) -> test (2.5 s)" in timeline.summary(line)


def test_a_failed_package_is_drawn_but_never_on_the_critical_path() -> None:
    doc = build_doc()
    doc["packages"]["test"]["status"] = "failed"
    line = timeline.timeline(doc["packages"])
    assert line.critical == ["lib", "app"]
    assert "1 failed" in timeline.summary(line)


def test_timeline_svg_has_one_bar_and_label_per_built_package() -> None:
    line = timeline.timeline(build_doc()["packages"])
    svg = timeline.draw(line, "svg", "fixture build")
    found = ids(svg)
    assert {"critical-lib", "critical-app", "critical-test", "bar-conf", "bar-docs"} <= found
    assert not {i for i in found if i.endswith(("-seed", "-never"))}  # cached and skipped are not drawn
    assert not {"bar-lib", "critical-conf"} & found
    labels = texts(svg)
    for name in ("lib", "conf", "app", "docs", "test"):
        assert name in labels
    assert any(t.startswith("fixture build: 5 package(s) built in 14.5 s, 1 cached") for t in labels)
    assert any("critical path: lib → app → test" in t for t in labels)
    assert "ready, waiting for a free job" in labels  # conf waited 5 s with its needs done


def test_charts_are_reproducible_and_png_is_png() -> None:
    line = timeline.timeline(build_doc()["packages"])
    first, second = timeline.draw(line, "svg"), timeline.draw(line, "svg")
    assert first == second
    assert b"<dc:date>" not in first
    assert timeline.draw(line, "png").startswith(output.PNG_SIGNATURE)


def test_timeline_documents_without_times_are_refused(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"packages": {"a": {"key": "k", "status": "built", "seconds": 1.0}}}))
    with pytest.raises(InputError, match="no start and finish times"):
        timeline.load(old)
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a kiln build --json document"):
        timeline.load(tmp_path / "other.json")
    with pytest.raises(InputError, match="no such file"):
        timeline.load(tmp_path / "missing.json")
    cached = {"packages": {"a": {"status": "cached", "started": 0, "finished": 0, "needs": []}}}
    with pytest.raises(InputError, match="nothing was built"):
        timeline.draw(timeline.timeline(cached["packages"]), "svg")


def sample_sizes() -> sizes.Sizes:
    return sizes.Sizes(
        "tiny",
        "amd64",
        [
            sizes.PackageSize("kernel modules", "modules", 3, 3 << 20),
            sizes.PackageSize("greet-app", "rootfs", 1, 800_000),
            sizes.PackageSize("kernel", "kernel", 1, 2 << 20),
            sizes.PackageSize("init", "init", 1, 40_000),
        ],
        [
            sizes.FileSize("/usr/lib/modules/6.1/kernel/fs/big.ko", "kernel modules", 2 << 20),
            sizes.FileSize("/usr/bin/greet", "greet-app", 800_000),
        ],
        rootfs_bytes=(3 << 20) + 800_000,
        squashfs_bytes=1 << 20,
        artifacts={"initramfs.zst": 1 << 20},
    )


def test_sizes_chart_and_tables_show_every_package_and_the_largest_files() -> None:
    measured = sample_sizes()
    svg = sizes.draw(measured, "svg")
    found = ids(svg)
    assert {"package-kernel modules", "package-greet-app", "package-kernel", "package-init"} <= found
    assert {"file-0", "file-1"} <= found
    labels = texts(svg)
    assert "greet-app" in labels and "kernel (vmlinuz)" in labels and "init (/init)" in labels
    assert ".../kernel/fs/big.ko" in labels and "/usr/bin/greet" in labels
    assert any(t.startswith("tiny (amd64): rootfs 3.8 MiB uncompressed, 1.0 MiB as squashfs") for t in labels)
    packages, files = sizes.table_rows(measured)
    assert packages[0] == ["kernel modules", "modules", "3", "3.0 MiB", "79.7%"]
    assert packages[2][4] == "-"  # vmlinuz is not part of the rootfs
    assert files[1] == ["781.2 KiB", "/usr/bin/greet", "greet-app"]
    assert sizes.draw(measured, "png").startswith(output.PNG_SIGNATURE)
    assert json.loads(json.dumps(measured.to_json()))["packages"][1]["name"] == "greet-app"


def test_sizes_refuses_a_directory_without_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"has no manifest\.json"):
        sizes.measure(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"inputs": {"packages": {}}}))
    with pytest.raises(InputError, match=r"no inputs\.packages"):
        sizes.measure(tmp_path)


class Terminal(io.StringIO):
    """A stdout that says it is a terminal (a stub: no real terminal in tests)."""

    def isatty(self) -> bool:
        return True


def test_a_png_is_never_written_to_a_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Stubs stdout with one that claims to be a terminal."""
    monkeypatch.setattr("sys.stdout", Terminal())
    with pytest.raises(InputError, match="refusing to write a PNG to the terminal"):
        output.write(output.PNG_SIGNATURE, None, "png")
    output.write(b"png", tmp_path / "x.png", "png")
    assert (tmp_path / "x.png").read_bytes() == b"png"


def test_picture_format_comes_from_the_name_or_the_option() -> None:
    assert output.format_for(Path("a.svg")) == "svg"
    assert output.format_for(Path("a.PNG")) == "png"
    assert output.format_for(Path("a.out"), "png") == "png"
    with pytest.raises(InputError, match="cannot tell the picture format"):
        output.format_for(Path("a.pdf"))


def test_report_and_graph_arguments_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["report", "timeline", "b.json", "-o", "t.svg", "--title", "T"])
    assert (args.report_kind, args.build_json, args.out, args.title) == ("timeline", Path("b.json"), Path("t.svg"), "T")
    args = parser.parse_args(["report", "sizes", "_out/metal", "--json"])
    assert (args.report_kind, args.directory, args.json, args.out) == ("sizes", Path("_out/metal"), True, None)
    args = parser.parse_args(["graph", "--format", "png", "-o", "g.png", "kmod"])
    assert (args.format, args.out, args.targets) == ("png", "g.png", ["kmod"])
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "timeline", "b.json"])  # -o is required: a chart is a file


def test_a_multi_platform_output_needs_an_arch(tmp_path: Path) -> None:
    manifest = {
        "profile": {"name": "metal", "arches": ["amd64", "arm64"]},
        "inputs": {"source_date_epoch": 7},
        "platforms": {
            "linux/amd64": {"packages": {"kernel": "k1"}},
            "linux/arm64": {"packages": {"kernel": "k2", "grub-efi-arm64": "g"}},
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"choose one with --arch \(amd64, arm64\)"):
        sizes.read_output(tmp_path)
    _, inputs = sizes.read_output(tmp_path, "arm64")
    assert inputs == {"source_date_epoch": 7, "packages": {"kernel": "k2", "grub-efi-arm64": "g"}}
