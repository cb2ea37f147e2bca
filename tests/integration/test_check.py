"""`kiln build --check` for real: the fixture graph rebuilt in bubblewrap and compared with the store."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import Project

pytestmark = pytest.mark.integration

NOISY = """\
name: noisy
variant: stage0
version: "1.0"
description: one stable file, one that records when it was built (not reproducible on purpose)
steps:
  - install:
      - mkdir -p /out/share
      - echo stable > /out/share/stable.txt
      - printf 'built at %s\\n' "$(date +%s%N)" > /out/share/stamp.txt
finalize:
  - from: /out
    to: /
"""


def test_reproducible_packages_pass_and_deep_checks_the_closure(project: Project) -> None:
    shallow = project.kiln("build", "greet-app", "--check", "--json")
    assert shallow.code == 0, shallow.err
    report = json.loads(shallow.out)["packages"]
    assert list(report) == ["greet-app"] and report["greet-app"]["reproducible"] is True
    assert report["greet-app"]["files"] > 0 and report["greet-app"]["differences"] == []
    logs = sorted(p.name for p in (project.cache / "logs").rglob("*.log"))
    deep = project.kiln("build", "greet-app", "--check", "--deep")
    assert deep.code == 0, deep.err
    assert [line.split(":")[0] for line in deep.out.splitlines()] == [
        "greet-lib",
        "greet-conf-src",
        "greet-conf",
        "greet-app",
    ]
    assert all(": reproducible (" in line for line in deep.out.splitlines())
    # nothing was stored or logged over: the rebuilds' logs go under check/
    assert sorted(p.name for p in (project.cache / "logs").rglob("*.log")) == logs
    assert project.kiln("cache", "verify", check=True).out.strip().endswith("0 damaged")


def test_a_difference_exits_1_names_the_file_and_keeps_the_evidence(project: Project) -> None:
    (project.pkgs / "noisy").mkdir()
    (project.pkgs / "noisy/pkg.yaml").write_text(textwrap.dedent(NOISY))
    project.kiln("build", "noisy", check=True)
    stored = list((project.cache / "store").glob("*/manifest.json"))
    result = project.kiln("build", "noisy", "--check", "--json")
    assert result.code == 1, result.err
    checked = json.loads(result.out)["packages"]["noisy"]
    assert checked["reproducible"] is False
    [difference] = checked["differences"]
    assert difference["path"] == "share/stamp.txt" and difference["what"][0].startswith("sha256 ")
    assert difference["first_offset"] >= len("built at ")  # the digits, not the words, differ
    kept = project.cache / "check" / "noisy" / checked["key"]
    assert checked["kept"] == str(kept)
    assert (kept / "stored/share/stamp.txt").read_text() != (kept / "rebuilt/share/stamp.txt").read_text()
    assert difference["report"] and "built at" in Path(difference["report"]).read_text()  # diffoscope's report
    text = project.kiln("build", "noisy", "--check")
    assert text.code == 1 and "noisy: NOT reproducible: 1 of 2 files differ" in text.out
    assert "share/stamp.txt: sha256 " in text.out and "first at byte" in text.out
    assert sorted((project.cache / "store").glob("*/manifest.json")) == sorted(stored)  # nothing new stored


def test_a_changed_stored_file_fails_the_check_and_names_the_damage(project: Project) -> None:
    """The rebuild is compared with the stored files, not only with their record: one byte changed in
    the store (the manifest left as it was) fails the check, which says the entry is damaged."""
    project.kiln("build", "greet-lib", check=True)
    [entry] = [
        meta.parent
        for meta in (project.cache / "store").glob("*/meta.json")
        if json.loads(meta.read_text())["name"] == "greet-lib"
    ]
    stored = next(p for p in sorted((entry / "tree").rglob("*")) if p.is_file() and not p.is_symlink())
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.chmod(0o644)
    stored.write_bytes(bytes(data))
    rel = str(stored.relative_to(entry / "tree"))
    result = project.kiln("build", "greet-lib", "--check", "--json")
    assert result.code == 1, result.out + result.err
    checked = json.loads(result.out)["packages"]["greet-lib"]
    assert checked["reproducible"] is False and checked["damaged"] == [rel]
    [difference] = checked["differences"]
    assert difference["path"] == rel and difference["first_offset"] == len(data) // 2
    text = project.kiln("build", "greet-lib", "--check")
    assert text.code == 1 and "greet-lib: NOT reproducible: 1 of " in text.out
    assert f"no longer matches its own manifest ({rel})" in text.out and "kiln cache rm " in text.out
