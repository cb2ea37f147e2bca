"""`kiln release push` of a multi-arch installer (one OCI image index over an amd64 and an arm64 image)
against a real registry (Debian's docker-registry, its own storage per test), read back through the
distribution API and, where the Docker engine answers, pulled per platform by `docker pull --platform`.

The two single-arch layouts are written by the real build_installer from small stand-ins (a disk of
random bytes, an ELF header standing in for machined: nothing here runs them) and combined by the
real build_installer_index, as `kiln image installer --platform linux/amd64,linux/arm64` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import build_installer, build_installer_index, image_tag
from tests.integration import services
from tests.unit.test_release_push import fake_static_elf

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
VERSION = "2.1.0-rc.1"
REPO = "kiln/installer"
EPOCH = 1700000000


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """installer-oci/ and installer-index.tar over two layouts that share their disk image layer."""
    base = tmp_path_factory.mktemp("index")
    (base / "disk.raw").write_bytes(os.urandom(2 << 20))
    layouts = []
    for arch in ("amd64", "arm64"):
        inputs = base / arch
        inputs.mkdir()
        (inputs / "vmlinuz").write_bytes(f"{arch} kernel ".encode() * 1000)
        (inputs / "initramfs.zst").write_bytes(f"{arch} initramfs ".encode() * 1000)
        assets = BootAssets.make(inputs / "vmlinuz", inputs / "initramfs.zst", f"console {arch}", VERSION, EPOCH)
        machined = fake_static_elf(inputs / "machined", arch)
        layout, _ = build_installer(assets, base / "disk.raw", machined, inputs / "out", "installer")
        layouts.append(layout)
    return build_installer_index(layouts, base / "out", "installer", EPOCH)


def push_json(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [*KILN, "release", "push", *args, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(result.stdout))


def get(host: str, reference: str, accept: str) -> tuple[dict[str, Any], requests.Response]:
    response = requests.get(f"http://{host}/v2/{REPO}/manifests/{reference}", headers={"Accept": accept}, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Docker-Content-Digest"] == "sha256:" + hashlib.sha256(response.content).hexdigest()
    return response.json(), response


def test_push_an_index_and_read_it_back(index: tuple[Path, Path], registry: tuple[str, Path]) -> None:
    host, _ = registry
    directory, tar = index
    tag = image_tag(VERSION)
    layout_index = json.loads((directory / "index.json").read_bytes())
    blobs = {p.name: p.stat().st_size for p in (directory / "blobs/sha256").iterdir()}
    manifests = {m["digest"][7:] for m in layout_index["manifests"]}
    sent = sum(size for name, size in blobs.items() if name not in manifests)  # configs and layers, each once

    pushed = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "beta", "--upgrade-from", "2.0.0")
    assert (pushed["tag"], pushed["media_type"], pushed["architecture"]) == (tag, INDEX_TYPE, None)
    assert sorted(pushed["manifests"]) == ["amd64", "arm64"]
    assert pushed["uploaded"] == {"blobs": len(blobs) - len(manifests), "bytes": sent}
    assert pushed["uploaded"]["bytes"] < 2 * (2 << 20)  # the random disk layer went once, not per arch

    served, response = get(host, tag, INDEX_TYPE)
    assert response.headers["Content-Type"] == INDEX_TYPE
    assert response.headers["Docker-Content-Digest"] == pushed["digest"]
    assert served["mediaType"] == INDEX_TYPE
    assert served["annotations"] == {
        "org.opencontainers.image.version": VERSION,
        "dev.kiln.channel": "beta",
        "dev.kiln.upgrade-from": "2.0.0",
    }
    assert [(m["platform"]["os"], m["platform"]["architecture"]) for m in served["manifests"]] == [
        ("linux", "amd64"),
        ("linux", "arm64"),
    ]
    for entry, layout_entry in zip(served["manifests"], layout_index["manifests"], strict=True):
        arch = entry["platform"]["architecture"]
        assert entry["digest"] == pushed["manifests"][arch]
        manifest, _ = get(host, entry["digest"], MANIFEST_TYPE)
        assert manifest["annotations"]["dev.kiln.architecture"] == arch
        assert manifest["annotations"]["dev.kiln.channel"] == "beta"
        assert manifest["annotations"]["org.opencontainers.image.version"] == VERSION
        layout_manifest = json.loads((directory / "blobs/sha256" / layout_entry["digest"][7:]).read_bytes())
        assert manifest["layers"] == layout_manifest["layers"] and manifest["config"] == layout_manifest["config"]
        config = requests.get(f"http://{host}/v2/{REPO}/blobs/{manifest['config']['digest']}", timeout=10).json()
        assert config["architecture"] == arch
    assert requests.get(f"http://{host}/v2/{REPO}/tags/list", timeout=10).json()["tags"] == [tag]

    # The tarball is the same release: the same index digest, nothing left to upload.
    again = push_json(str(tar), "--to", f"{host}/{REPO}", "--channel", "beta", "--upgrade-from", "2.0.0")
    assert again["digest"] == pushed["digest"] and again["uploaded"]["bytes"] == 0 and again["replaced"] is None
    stable = push_json(str(tar), "--to", f"{host}/{REPO}", "--channel", "stable")
    assert stable["replaced"] == pushed["digest"] and stable["uploaded"]["bytes"] == 0


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300, check=False)


def test_docker_pulls_the_image_of_the_platform_asked_for(index: tuple[Path, Path], registry: tuple[str, Path]) -> None:
    if shutil.which("docker") is None or not services.engine_answers():
        services.unavailable("a Docker engine", "scripts/ci-services.sh starts one")
    host, _ = registry
    directory, _ = index
    pushed = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "alpha")
    reference = f"{host}/{REPO}:{pushed['tag']}"
    try:
        inspected = docker("manifest", "inspect", "--insecure", reference)
        if inspected.returncode == 0:  # the client's manifest command reads the registry itself
            listed = json.loads(inspected.stdout)
            assert [m["platform"]["architecture"] for m in listed["manifests"]] == ["amd64", "arm64"]
        for arch in ("arm64", "amd64"):
            pulled = docker("pull", "--platform", f"linux/{arch}", reference)
            assert pulled.returncode == 0, pulled.stdout + pulled.stderr
            shown = docker("image", "inspect", "--format", "{{.Architecture}} {{.Os}} {{json .RepoDigests}}", reference)
            assert shown.returncode == 0, shown.stderr
            architecture, os_name, digests = shown.stdout.split(" ", 2)
            assert (architecture, os_name) == (arch, "linux")
            assert f"{host}/{REPO}@{pushed['digest']}" in json.loads(digests)
            assert docker("image", "rm", reference).returncode == 0
    finally:
        docker("image", "rm", "--force", reference)
