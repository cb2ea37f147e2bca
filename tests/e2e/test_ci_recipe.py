"""End-to-end: docs/ci.md's image job, run by scripts/ci-recipe.sh in a fresh Debian 12 root.

The script clones this repository at HEAD, has this host's Kiln build what `kiln image metal`
needs into the default store (nothing when the e2e tier's `image_dir` fixture and the host's
earlier runs built it; init, fhs and machined otherwise, since they carry the release version)
and push it to the registry on 127.0.0.1:5000, debootstraps bookworm minbase, imports it into
Docker and runs the recipe's steps in a container: apt-get, make setup-image, `kiln build
--cache-from/--cache-to`, `kiln image metal`, the checks. Nothing is stubbed: it needs root,
Docker, the registry (scripts/ci-services.sh) and deb.debian.org and PyPI (their downloads are
kept under ~/.cache/kiln/ci-recipe/ between runs).

The release version is the test session's pinned $KILN_VERSION on both sides (tests/conftest.py),
so the seeding finds everything stored instead of rebuilding machined, init and fhs for the
commit's git describe; the script checks that the container's version equals the host's either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (debootstrap, docker)"),
    pytest.mark.skipif(shutil.which("docker") is None, reason="needs Docker (scripts/ci-services.sh)"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="needs debootstrap (scripts/setup-host.sh)"),
]


def test_the_ci_recipe_pulls_from_the_registry_and_uploads_checked_artifacts(tmp_path: Path, image_dir: Path) -> None:
    """The job's uploaded _out/ has metal's artifacts under their names, SHA256SUMS verifies, and
    the container pulled every package from the registry and built none (no kernel, no seed)."""
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "KILN": f"{sys.executable} -m kiln.cli", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [str(ROOT / "scripts" / "ci-recipe.sh"), str(artifacts)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    out = artifacts / "_out"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "SHA256SUMS",
        "metal/manifest.json",
        "metal/metal-amd64.raw.zst",
        "metal/provenance.intoto.json",
        "metal/sbom.cdx.json",
        "metal/sbom.spdx.json",
    ]
    listed = {}
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.lstrip("*")] = digest
    assert set(listed) == {
        f"metal/{name}" for name in ("manifest.json", "metal-amd64.raw.zst", "sbom.cdx.json", "sbom.spdx.json")
    }
    for name, digest in listed.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    assert (out / "metal" / "metal-amd64.raw.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd

    job = (artifacts / "job.log").read_text()
    pulled = re.search(r"^kiln: pulled (\d+) entr\w+ from oci://\S+: (.*)$", job, re.M)
    assert pulled, job[-4000:]
    assert "kernel" in pulled[2].split(", "), pulled[0]  # the container's store starts empty
    assert re.search(r"^done: built 0, cached \d+, failed 0", job, re.M), job[-4000:]
    assert "kernel: building" not in job and "stage0: debootstrap" not in job
    assert re.search(r"metal-amd64\.raw\.zst: OK", job), job[-4000:]
    for phase in ("checkout", "seed", "root", "job", "upload"):
        assert re.search(rf"^ci-recipe: phase {phase} took \d+ s$", output, re.M), phase
