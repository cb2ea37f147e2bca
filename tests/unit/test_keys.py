"""Cache keys: stable across processes, directories and environments; sensitive to every input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.build.cache_keys import compute_keys
from kiln.build.sources.place import place_local
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import SHA, write_tree

AMD64 = Platform.parse("linux/amd64")

TREE = {
    "vars.yaml": "lib_version: '1.0'\nother_version: '2.0'\n",
    "stage0.yaml": "suite: bookworm\n",
    "toolchain/pkg.yaml": "name: toolchain\nvariant: stage0\nfinalize: [{from: /toolchain, to: /toolchain}]\n",
    "lib/pkg.yaml": f"""
        name: lib
        version: '{{{{ lib_version }}}}'
        steps:
          - sources:
              - url: https://example.org/lib-{{{{ lib_version }}}}.tar.gz
                destination: lib.tar.gz
                sha256: {SHA}
            env: {{CFLAGS: -O2, LDFLAGS: -static}}
            build: [make]
        finalize: [{{from: /out, to: /}}]
        """,
    "lib/patches/fix.patch": "--- a\n+++ b\n",
    "app/pkg.yaml": """
        name: app
        dependencies:
          - stage: lib
        steps:
          - build: [make app]
        finalize: [{from: /out, to: /}]
        """,
    "other/pkg.yaml": """
        name: other
        version: '{{ other_version }}'
        steps:
          - build: ['true']
        finalize: [{from: /out, to: /}]
        """,
}


def keys_of(pkgs: Path, platform: Platform = AMD64, overrides: dict[str, str] | None = None) -> dict[str, str]:
    return compute_keys(Graph(load_tree(pkgs, platform, overrides)))


@pytest.fixture
def pkgs(tmp_path: Path) -> Path:
    return write_tree(tmp_path, TREE)


def test_same_keys_from_another_process_directory_and_environment(pkgs: Path, tmp_path: Path) -> None:
    here = keys_of(pkgs)
    copy = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(pkgs.parent, copy)
    script = (
        "import json, sys; from pathlib import Path; from kiln.build.cache_keys import compute_keys;"
        "from kiln.pkg.graph import Graph; from kiln.pkg.loader import load_tree;"
        "from kiln.pkg.variables import Platform;"
        "print(json.dumps(compute_keys(Graph(load_tree(Path(sys.argv[1]), Platform.parse('linux/amd64'))))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123", "LANG": "C", "HOME": str(tmp_path), "KILN_JOBS": "64"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(copy / "pkgs")],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == here


def test_keys_ignore_mapping_order_and_comments(pkgs: Path) -> None:
    before = keys_of(pkgs)
    (pkgs / "app/pkg.yaml").write_text(
        "# the application\nfinalize: [{to: /, from: /out}]\nsteps:\n  - build: [make app]\n"
        "dependencies:\n  - {stage: lib}\nname: app\n"
    )
    assert keys_of(pkgs) == before


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if before[name] != after[name]}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("spec", {"lib", "app"}),
        ("package file", {"lib", "app"}),
        ("source sha256", {"lib", "app"}),
        ("tree variable", {"lib", "app"}),
        ("package vars.yaml", {"lib", "app"}),
        ("set override", {"other"}),
        ("dependency", {"app"}),
        ("stage0 definition", {"toolchain", "lib", "app", "other"}),
        ("toolchain", {"toolchain", "lib", "app", "other"}),
        ("exec bit", {"lib", "app"}),
    ],
)
def test_each_input_changes_its_package_and_dependents_only(pkgs: Path, edit: str, expected: set[str]) -> None:
    before = keys_of(pkgs)
    overrides = None
    lib = pkgs / "lib/pkg.yaml"
    if edit == "spec":
        lib.write_text(lib.read_text().replace("build: [make]", "build: [make V=1]"))
    elif edit == "package file":
        (pkgs / "lib/patches/fix.patch").write_text("--- a\n+++ c\n")
    elif edit == "source sha256":
        lib.write_text(lib.read_text().replace(SHA, "ab" * 32))
    elif edit == "tree variable":
        (pkgs / "vars.yaml").write_text("lib_version: '1.1'\nother_version: '2.0'\n")
    elif edit == "package vars.yaml":
        (pkgs / "lib/vars.yaml").write_text("lib_version: '1.2'\n")
    elif edit == "set override":
        overrides = {"other_version": "3.0"}
    elif edit == "dependency":
        app = pkgs / "app/pkg.yaml"
        app.write_text(app.read_text().replace("- stage: lib", "- stage: lib\n    to: /sysroot"))
    elif edit == "stage0 definition":
        (pkgs / "stage0.yaml").write_text("suite: trixie\n")
    elif edit == "toolchain":
        tc = pkgs / "toolchain/pkg.yaml"
        tc.write_text(tc.read_text().replace("/toolchain, to", "/opt/toolchain, to"))
    elif edit == "exec bit":
        (pkgs / "lib/patches/fix.patch").chmod(0o755)
    after = keys_of(pkgs, overrides=overrides)
    assert changed(before, after) == expected


def test_platform_changes_every_key(pkgs: Path) -> None:
    amd = keys_of(pkgs)
    arm = keys_of(pkgs, Platform.parse("linux/arm64"))
    assert changed(amd, arm) == set(amd)


def test_nested_package_directory_belongs_to_its_own_package(pkgs: Path) -> None:
    write_tree(pkgs.parent, {"lib/sub/pkg.yaml": "name: sub\nvariant: stage0\n"})
    before = keys_of(pkgs)
    (pkgs / "lib/sub/notes.txt").write_text("only sub's business\n")
    assert changed(before, keys_of(pkgs)) == {"sub"}


def test_local_source_files_are_hashed(tmp_path: Path) -> None:
    pkgs = write_tree(
        tmp_path,
        {
            "init/pkg.yaml": """
                name: init
                variant: stage0
                steps:
                  - sources: [{path: runtime/init, destination: src}]
                    build: [make]
                finalize: [{from: /out, to: /}]
                """,
        },
    )
    (tmp_path / "runtime/init").mkdir(parents=True)
    (tmp_path / "runtime/init/init.c").write_text("int main(void) { return 0; }\n")
    before = keys_of(pkgs)
    (tmp_path / "runtime/init/init.c").write_text("int main(void) { return 1; }\n")
    assert changed(before, keys_of(pkgs)) == {"init"}


def test_excluded_paths_reach_neither_the_key_nor_the_copy(tmp_path: Path) -> None:
    """A local source's `exclude` patterns (a developer's own `go build` output beside the code) leave the
    key as it was and stay out of the build's copy; a source without the field keeps its old canonical form."""
    tree = {
        "init/pkg.yaml": """
            name: init
            variant: stage0
            steps:
              - sources: [{path: runtime/init, destination: src, exclude: [init, "*.test"]}]
                build: [make]
            finalize: [{from: /out, to: /}]
            """,
    }
    pkgs = write_tree(tmp_path, tree)
    code = tmp_path / "runtime/init"
    (code / "sub").mkdir(parents=True)
    (code / "init.c").write_text("int main(void) { return 0; }\n")
    before = keys_of(pkgs)
    (code / "init").write_bytes(b"\x7fELF built here")
    (code / "sub" / "sub.test").write_bytes(b"\x7fELF go test -c")
    assert keys_of(pkgs) == before
    (code / "init.c").write_text("int main(void) { return 1; }\n")
    assert changed(before, keys_of(pkgs)) == {"init"}

    source = load_tree(pkgs, AMD64).packages["init"].steps[0].sources[0]
    placed = place_local(tmp_path, source, tmp_path / "build")
    assert sorted(p.relative_to(placed).as_posix() for p in placed.rglob("*")) == ["init.c", "sub"]

    (pkgs / "init/pkg.yaml").write_text((pkgs / "init/pkg.yaml").read_text().replace(', exclude: [init, "*.test"]', ""))
    canonical = load_tree(pkgs, AMD64).packages["init"].canonical()
    assert canonical["steps"][0]["sources"] == [{"destination": "src", "path": "runtime/init"}]


def test_jobs_does_not_reach_keys(pkgs: Path) -> None:
    lib = pkgs / "lib/pkg.yaml"
    lib.write_text(lib.read_text().replace("build: [make]", "build: ['make -j{{ jobs }}']"))
    spec = load_tree(pkgs, AMD64).packages["lib"].canonical()
    assert spec["steps"][0]["build"] == ["make -j${KILN_JOBS}"]
