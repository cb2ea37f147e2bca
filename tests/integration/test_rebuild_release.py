"""`kiln verify --rebuild` the whole way: a release made from a commit, rebuilt from its provenance by that
commit's own Kiln, and a changed byte named with a diffoscope report.

The project is a git repository of its own holding a copy of this tree's Kiln (src/, pkgs/, runtime/) and a
profile with a prebuilt kernel and initramfs (test_image_stress.py's kind: no package is built, so the
rebuild measures the checkout, the imager and the comparison, not a compiler). Its schematic carries an API
key, so the provenance redacts it: the rebuild refuses without the original schematic and passes with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_release_signing import make_keys

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "r-initramfs"
ARTIFACT = "initramfs-amd64.zst"
SCHEMATIC = """
kernel_args: [kiln.debug=1]
machine_config:
  hostname: rebuild-test
  services:
    - name: agent
      env: {API_KEY: kiln-test-api-key-8c1f0a9e3d7b5c2a4e6f}
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def copy_tree_files(project: Path, *paths: str) -> None:
    """This tree's files under `paths` as git sees them (tracked, or new and not ignored), into project."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard", *paths],
        capture_output=True,
        check=True,
    ).stdout
    for rel in sorted({name.decode() for name in listed.split(b"\0") if name}):
        if (ROOT / rel).is_file() and not (ROOT / rel).is_symlink():
            (project / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, project / rel)


def make_project(project: Path) -> str:
    """The project committed: Kiln's files as this tree has them, and the profile with its inputs."""
    copy_tree_files(project, "src", "pkgs", "runtime")
    inputs = project / "profiles" / "inputs"
    inputs.mkdir(parents=True)
    (inputs / "vmlinuz").write_bytes(b"rebuild kernel\n" + hashlib.sha512(b"k").digest() * 2000)
    (inputs / "initramfs.zst").write_bytes(b"rebuild initramfs\n" + hashlib.sha512(b"i").digest() * 1000)
    profile = {
        "name": PROFILE,
        "platform": "metal",
        "input": {"kernel": {"path": "./inputs/vmlinuz"}, "initramfs": {"path": "./inputs/initramfs.zst"}},
        "output": {"kind": "initramfs"},
    }
    (project / "profiles" / f"{PROFILE}.yaml").write_text(json.dumps(profile))
    env = {**os.environ, **GIT_ENV}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the release"]):
        subprocess.run(["git", "-C", str(project), *argv], check=True, env=env)
    return subprocess.run(
        ["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def kiln(*args: str, project: Path, src: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_CACHE": str(cache), "PYTHONPATH": str(src), "KILN_PROGRESS": "plain"}
    command = [sys.executable, "-m", "kiln.cli", *args]
    return subprocess.run(command, cwd=project, env=env, text=True, capture_output=True, timeout=900)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project, its release (signed), the schematic it was made with and the release's public key."""
    base = tmp_path_factory.mktemp("rebuild")
    project = base / "project"
    make_project(project)
    (base / "schematic.yaml").write_text(SCHEMATIC)
    keys = make_keys(base / "keys")
    args = [PROFILE, "--schematic", str(base / "schematic.yaml"), "--keys", str(keys.root), "--out", str(base / "rel")]
    made = kiln("image", *args, project=project, src=project / "src", cache=base / "cache")
    assert made.returncode == 0, made.stdout + made.stderr
    return {"project": project, "release": base / "rel", "schematic": base / "schematic.yaml",
            "key": keys.release_public, "base": base}  # fmt: skip


def rebuild(paths: dict[str, Path], release: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`kiln verify --rebuild` run by this tree's Kiln in the project, its own cache untouched by the rebuild."""
    args = ["verify", "--rebuild", str(release), "--key", str(paths["key"]), "--json", *extra]
    result = kiln(*args, project=paths["project"], src=ROOT / "src", cache=paths["base"] / "verifier-cache")
    assert "Traceback" not in result.stderr, result.stderr
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def test_a_redacted_schematic_is_refused_before_anything_is_built(release: dict[str, Path]) -> None:
    result, report = rebuild(release, release["release"])
    assert result.returncode == 2, result.stderr
    assert report["ok"] is False and "machine_config.services.0.env.API_KEY" in report["error"]
    assert "--schematic FILE" in report["error"]


def test_the_untouched_release_rebuilds_to_the_same_bytes(release: dict[str, Path]) -> None:
    result, report = rebuild(release, release["release"], "--schematic", str(release["schematic"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["ok"] is True
    (directory,) = report["directories"]
    assert directory["profile"] == PROFILE and directory["rebuilt_by"] == "the checkout's Kiln"
    assert set(directory["same"]) == {ARTIFACT, "manifest.json", "sbom.spdx.json", "sbom.cdx.json"}
    assert [p["phase"] for p in report["phases"]] == ["checkout", "build", "compare"]
    assert report["reports"] is None and report["kept"] == []
    print("phases:", {f"{p['phase']} {p['subject']}".strip(): p["seconds"] for p in report["phases"]})
    assert not [line for line in subprocess.run(
        ["git", "-C", str(release["project"]), "worktree", "list"], capture_output=True, text=True
    ).stdout.splitlines()[1:]], "the scratch worktree was left registered"  # fmt: skip


def test_a_changed_byte_is_named_with_a_diffoscope_report(release: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "rel"
    shutil.copytree(release["release"], copy, symlinks=True)
    artifact = copy / PROFILE / ARTIFACT
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x01
    artifact.write_bytes(bytes(data))
    result, report = rebuild(release, copy, "--schematic", str(release["schematic"]))
    assert result.returncode == 1, result.stdout + result.stderr
    (directory,) = report["directories"]
    (difference,) = directory["differences"]
    assert difference["artifact"] == ARTIFACT and difference["first_offset"] == len(data) // 2
    assert "the file changed after the release was made" in difference["what"][0]
    assert f"{ARTIFACT}: checksum differs" in directory["problems"]
    assert ARTIFACT not in directory["same"] and "manifest.json" in directory["same"]
    if shutil.which("diffoscope"):
        reports = Path(report["reports"])
        assert difference["report"] == str(reports / PROFILE / f"{ARTIFACT}.diffoscope.txt")
        assert Path(difference["report"]).is_file()
        assert report["kept"] == [str(reports)]
        shutil.rmtree(reports.parent)
