"""The inner loop for real: edit machined in a copy of the project, `kiln dev boot`, reach ready in QEMU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import KILN, ROOT

pytestmark = pytest.mark.e2e


def test_an_edit_to_machined_rebuilds_it_alone_and_boots_to_ready(image_dir: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    for part in ("pkgs", "runtime"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
    main = project / "runtime/machined/main.go"
    # unique per run: an edit some earlier run on this store already built would rebuild nothing
    main.write_text(main.read_text() + f"\n// edited by {__name__}, run {uuid.uuid4()}\n")
    result = subprocess.run(
        [*KILN, "dev", "boot", "--json"],
        cwd=project,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["rebuilt"] == ["machined"]  # the kernel, init and the userland came from the store
    assert set(report["seconds"]) == {"build", "image", "boot", "total"}
    assert sorted(p.name for p in (project / "_out/dev").iterdir()) == ["console.log", "initramfs.zst", "vmlinuz"]
    console = (project / "_out/dev/console.log").read_text(errors="replace")
    assert "machined ready:" in console
    assert "machined: boot: ready " in console and "(modules " in console  # machined's account of its boot
