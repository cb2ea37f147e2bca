"""`kiln image` with several profiles, run many times in a row and in parallel processes that
share one store and one output directory: every run succeeds and gives the same bytes.

Each run is a fresh process, so the first imports the image workers need happen again every
time: before those were made in the main thread, concurrent first imports of spdx-tools from
worker threads failed about one run in six (`KeyError: 'spdx_tools.spdx.model'`). The profiles
take a prebuilt kernel and initramfs (real files, fake content), so no package is built and the
test measures the imager itself: grub-mkrescue, sfdisk, mkfs.vfat, qemu-img.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]
PROFILES: dict[str, dict[str, Any]] = {
    "s-iso": {"output": {"kind": "iso"}},
    "s-disk": {"output": {"kind": "image", "image": {"disk_size": "256MiB", "format": "qcow2"}}},
    "s-pxe": {"output": {"kind": "pxe"}},
    "s-initramfs": {"output": {"kind": "initramfs"}},
}


def write_inputs(directory: Path) -> list[Path]:
    """A fake kernel and initramfs, and one profile per output kind that uses them."""
    directory.mkdir()
    (directory / "vmlinuz").write_bytes(b"stress kernel\n" + hashlib.sha512(b"k").digest() * 2000)
    (directory / "initramfs.zst").write_bytes(b"stress initramfs\n" + hashlib.sha512(b"i").digest() * 1000)
    paths = []
    for name, body in PROFILES.items():
        profile = {
            "name": name,
            "version": "0.1.0",
            "platform": "metal",
            "input": {"kernel": {"path": "./vmlinuz"}, "initramfs": {"path": "./initramfs.zst"}},
            **body,
        }
        path = directory / f"{name}.yaml"
        path.write_text(json.dumps(profile))  # JSON is YAML
        paths.append(path)
    return paths


def start(profiles: list[Path], out: Path, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "KILN_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
    command = [*KILN, "image", *map(str, profiles), "--out", str(out), "--jobs", "4", "--json"]
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen[str]) -> dict[str, list[tuple[str, str]]]:
    """The run's artifacts per profile, as (path, sha256); fails the test on any error."""
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, f"kiln image failed ({process.returncode}):\n{stderr}"
    assert "Traceback" not in stderr, stderr
    report = json.loads(stdout)
    return {name: sorted((a["path"], a["sha256"]) for a in info["artifacts"]) for name, info in report.items()}


def on_disk(out: Path) -> dict[str, list[tuple[str, str]]]:
    """What a shared output directory holds once every run has ended, read back from its manifests."""
    found = {}
    for name in PROFILES:
        manifest = json.loads((out / name / "manifest.json").read_text())
        found[name] = sorted((a["path"], a["sha256"]) for a in manifest["artifacts"])
    return found


def test_multi_profile_image_in_a_row_and_in_parallel(tmp_path: Path) -> None:
    profiles = write_inputs(tmp_path / "inputs")
    cache = tmp_path / "cache"
    first = finish(start(profiles, tmp_path / "out-0", cache))
    assert set(first) == set(PROFILES)
    for run in range(1, 4):  # in a row: each a fresh process, so the worker imports race anew
        assert finish(start(profiles, tmp_path / f"out-{run}", cache)) == first
    shared = tmp_path / "out-shared"
    parallel = [start(profiles, tmp_path / f"out-p{i}", cache) for i in range(2)]
    parallel += [start(profiles, shared, cache) for _ in range(2)]
    for process in parallel:
        assert finish(process) == first
    assert on_disk(shared) == first
    assert not [p.name for p in shared.iterdir() if p.name.startswith(".")], "a run left its work directory"
