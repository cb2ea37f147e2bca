"""Reproducibility across runners: a release made on the sandbox runner, rebuilt from its provenance by
`kiln verify --rebuild --runner docker` into a store of its own, gives the same digests.

The project is a git repository holding this tree's Kiln (src/) and the fixture graph, with two stand-ins
(test_pictures.py's tiny-kernel and tiny-init) so that every input of the image is built from source here:
the rebuild compiles greet-lib, greet-app and the others again in Docker containers, where the release
compiled them in bubblewrap sandboxes. Both stores start from the same seed (the stage0 root every runner
stands on), and from nothing else.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration import services
from tests.integration.conftest import FIXTURE, seed_into
from tests.integration.test_pictures import TINY_INIT, TINY_KERNEL
from tests.integration.test_rebuild_release import GIT_ENV, copy_tree_files
from tests.unit.test_release_signing import make_keys

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "greet-initramfs"
ARTIFACT = "initramfs-amd64.zst"
BUILT = {"greet-lib", "greet-conf-src", "greet-conf", "greet-app", "tiny-kernel", "tiny-init"}


def make_project(project: Path) -> None:
    """The project committed: this tree's Kiln, the fixture graph with the stand-ins, and the profile."""
    copy_tree_files(project, "src")
    shutil.copytree(FIXTURE / "pkgs", project / "pkgs")
    shutil.copytree(FIXTURE / "src", project / "src" / "fixture")  # beside Kiln's own src/kiln
    for name, text in (("tiny-kernel", TINY_KERNEL), ("tiny-init", TINY_INIT)):
        (project / "pkgs" / name).mkdir()
        (project / "pkgs" / name / "pkg.yaml").write_text(text)
    # greet-app and greet-lib read their sources from src/greet; here that is src/fixture/greet
    for pkg in ("greet-app", "greet-lib"):
        path = project / "pkgs" / pkg / "pkg.yaml"
        path.write_text(path.read_text().replace("path: src/greet", "path: src/fixture/greet"))
    profile = {
        "name": PROFILE,
        "platform": "metal",
        "version": "0.1.0",
        "input": {"kernel": {"package": "tiny-kernel"}, "init": "tiny-init", "rootfs": ["greet-app", "greet-conf"]},
        "output": {"kind": "initramfs"},
    }
    (project / "profiles").mkdir()
    (project / "profiles" / f"{PROFILE}.yaml").write_text(json.dumps(profile))
    env = {**os.environ, **GIT_ENV}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the release"]):
        subprocess.run(["git", "-C", str(project), *argv], check=True, env=env)


def kiln(*args: str, project: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_CACHE": str(cache), "PYTHONPATH": str(project / "src"), "KILN_PROGRESS": "plain"}
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", *args], cwd=project, env=env, text=True, capture_output=True, timeout=1800
    )


def built_by(cache: Path) -> dict[str, str]:
    """Each package entry of the store (stage0 aside), and the runner that built it (its meta.json)."""
    found: dict[str, str] = {}
    for meta_file in (cache / "store").glob("*/meta.json"):
        meta = json.loads(meta_file.read_text())
        if meta["name"] != "stage0":
            found[meta["name"]] = meta["meta"]["runner"]
    return found


def test_a_sandbox_release_rebuilds_on_docker_to_the_same_digests(tmp_path: Path, seed_store: Path) -> None:
    if not services.engine_answers():
        services.unavailable("a Docker engine", "start `dockerd &` as root (scripts/ci-services.sh does)")
    project = tmp_path / "project"
    make_project(project)
    keys = make_keys(tmp_path / "keys")
    release_cache, rebuild_cache = tmp_path / "release-cache", tmp_path / "rebuild-cache"
    for cache in (release_cache, rebuild_cache):
        seed_into(seed_store, cache, project / "pkgs")

    made = kiln("image", PROFILE, "--runner", "sandbox", "--keys", str(keys.root), "--out", str(tmp_path / "rel"),
                project=project, cache=release_cache)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    envelope = json.loads((tmp_path / "rel" / PROFILE / "provenance.intoto.jsonl").read_text().splitlines()[0])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicate"]["runDetails"]["builder"]["id"].endswith("/sandbox")

    result = kiln("verify", "--rebuild", str(tmp_path / "rel"), "--key", str(keys.release_public), "--runner",
                  "docker", "--store", str(rebuild_cache), "--json", project=project, cache=release_cache)  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    report: Any = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"] is True, result.stdout + result.stderr
    (directory,) = report["directories"]
    assert ARTIFACT in directory["same"] and not directory.get("differences")
    assert any("built with the docker runner, recorded sandbox" in note for note in report["notes"])
    # every package of the image was compiled anew, in containers, where the release's were sandboxed
    assert built_by(release_cache) == dict.fromkeys(BUILT, "sandbox")
    assert built_by(rebuild_cache) == dict.fromkeys(BUILT, "docker")
    print("phases:", {f"{p['phase']} {p['subject']}".strip(): p["seconds"] for p in report["phases"]})
