"""The extension author's loop for real: `kiln init --extension`, then `kiln extension build` on the stock tree.

The builds run in the sandbox against the default store, where the end-to-end tier has built the
seed, toolchain-seed, the kernel and kernel-build (tests/e2e/test_extensions.py); here only the
scaffolded packages compile (seconds each)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln import __version__

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def kiln(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run kiln; within the test's own 90 minutes: on a cold store `extension build` waits on the build
    lock of the kernel the boots lane is compiling (on 2 shared cores, past 30 minutes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KILN_VERSION": __version__}
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=5400
    )


def described(project: Path, name: str) -> dict[str, Any]:
    (layer,) = (project / "_out/extensions").glob(f"{name}-0.1.0-amd64.sqsh")
    info: dict[str, Any] = json.loads(layer.with_suffix(".json").read_text())
    assert info["sha256"] == hashlib.sha256(layer.read_bytes()).hexdigest() and info["size"] == layer.stat().st_size
    return info


@pytest.mark.parametrize("kind", ["service", "module"])
def test_a_new_extension_project_builds_on_the_stock_tree(tmp_path: Path, kind: str) -> None:
    project = tmp_path / "ext"
    made = kiln("init", "--extension", "hello-ext", "--kind", kind, "--author", "tests", str(project))
    assert made.returncode == 0, made.stderr
    assert (
        (project / "kiln-project.yaml")
        .read_text()
        .endswith("pkgs: [" + os.path.relpath(ROOT / "pkgs", project) + ", pkgs]\n")
    )
    checked = kiln("validate", "--json", cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    built = kiln("extension", "build", "hello-ext", cwd=project)
    assert built.returncode == 0, built.stdout + built.stderr
    info = described(project, "hello-ext")
    assert info["manifest"]["author"] == "tests"
    modules = info["modules"]
    if kind == "module":
        carried = f"usr/lib/modules/{info['kernel']}/extra/hello_ext.ko"
        assert modules == {"carried": [carried], "loaded_at_boot": ["hello_ext"], "signed": 0}
        assert_signed_with_keys(project, carried)
    else:
        assert modules == {"carried": [], "loaded_at_boot": [], "signed": 0}


def assert_signed_with_keys(project: Path, carried: str) -> None:
    """--keys signs the layer's module with the key directory's module key (the kernel's signature format)."""
    assert kiln("keys", "generate", str(project / "keys"), "--name", "ext tests").returncode == 0
    built = kiln("extension", "build", "hello-ext", "--keys", str(project / "keys"), cwd=project)
    assert built.returncode == 0, built.stdout + built.stderr
    assert described(project, "hello-ext")["modules"]["signed"] == 1
    (layer,) = (project / "_out/extensions").glob("hello-ext-*.sqsh")
    unpacked = project / "unpacked"
    subprocess.run(["unsquashfs", "-q", "-d", str(unpacked), str(layer)], check=True, capture_output=True)
    assert (unpacked / carried).read_bytes().endswith(b"~Module signature appended~\n")


def test_init_refuses_a_used_directory_and_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used/file").write_text("x")
    refused = kiln("init", "--extension", "ok", str(tmp_path / "used"))
    assert refused.returncode == 2 and "is not an empty directory" in refused.stderr
    bad = kiln("init", "--extension", "Bad_Name", str(tmp_path / "new"))
    assert bad.returncode == 2 and "extension name 'Bad_Name'" in bad.stderr and not (tmp_path / "new").exists()


def test_extension_build_refuses_a_package_that_is_not_one(tmp_path: Path) -> None:
    result = kiln("extension", "build", "fhs", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "pkgs/fhs/pkg.yaml:1: package 'fhs' is not a system extension" in result.stderr


def test_a_package_that_fails_to_build_stops_each_verb_with_its_error(tmp_path: Path) -> None:
    """`kiln extension build`, `kiln image --output kernel,initramfs` and `kiln image PROFILE` share one
    build-and-report step (Session.build_all): the package's own error, then what could not be made."""
    project = tmp_path / "ext"
    assert kiln("init", "--extension", "hello-ext", str(project)).returncode == 0
    (project / "pkgs/hello-ext/hello-ext.c").write_text("int main(void) { return nope; }\n")
    profile = tmp_path / "with-ext.yaml"
    profile.write_text("platform: metal\ninput:\n  extensions: [hello-ext]\noutput: {kind: iso}\n")
    for args, purpose in (
        (["extension", "build", "hello-ext"], "extension 'hello-ext' was not built"),
        (["image", "--output", "kernel,initramfs", "--extension", "hello-ext"], "cannot assemble the image"),
        (["image", str(profile), "--out", str(tmp_path / "out")], "cannot make the images"),
    ):
        failed = kiln(*args, cwd=project)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "package 'hello-ext' failed in step 1 (build)" in failed.stderr, failed.stderr
        assert "nope’ undeclared" in failed.stderr  # the compiler's own words, from the build's log
        assert f"{purpose}: 1 package(s) failed" in failed.stderr, failed.stderr
    assert not (tmp_path / "out").exists() and not (project / "_out/extensions").exists()
