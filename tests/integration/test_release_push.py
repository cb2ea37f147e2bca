"""`kiln release push` against a real registry (Debian's docker-registry, its own storage per test).

The layout is written by the real build_installer from small fake inputs (a disk of random bytes, so
its layer is about 2 MiB, and an ELF header standing in for machined: nothing here runs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kiln.core.registry import Client, Ref
from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import build_installer, image_tag
from tests.integration import services
from tests.unit.test_release_push import fake_static_elf

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
VERSION = "1.2.0-beta.1+g5eed"
REPO = "kiln/installer"


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return small_installer(tmp_path_factory.mktemp("release"))


def small_installer(base: Path) -> tuple[Path, Path]:
    """An installer layout and tar from fake inputs (see the module docstring)."""
    (base / "vmlinuz").write_bytes(b"fake kernel " * 1000)
    (base / "initramfs.zst").write_bytes(b"fake initramfs " * 1000)
    (base / "disk.raw").write_bytes(os.urandom(2 << 20))
    assets = BootAssets.make(base / "vmlinuz", base / "initramfs.zst", "console=ttyS0", VERSION, 1700000000)
    return build_installer(assets, base / "disk.raw", fake_static_elf(base / "machined"), base / "out", "installer")


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KILN, "release", "push", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def push_json(*args: str) -> dict[str, Any]:
    result = kiln(*args, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(result.stdout))


def blob_sizes(layout: Path) -> dict[str, int]:
    """digest -> size of the config and every layer of the layout's manifest."""
    [entry] = json.loads((layout / "index.json").read_bytes())["manifests"]
    manifest = json.loads((layout / "blobs/sha256" / entry["digest"][7:]).read_bytes())
    return {d["digest"]: d["size"] for d in [manifest["config"], *manifest["layers"]]}


def served_manifest(host: str, reference: str) -> tuple[dict[str, Any], str]:
    response = requests.get(
        f"http://{host}/v2/{REPO}/manifests/{reference}", headers={"Accept": MANIFEST_TYPE}, timeout=10
    )
    assert response.status_code == 200, response.text
    assert response.headers["Docker-Content-Digest"] == "sha256:" + hashlib.sha256(response.content).hexdigest()
    return response.json(), response.headers["Docker-Content-Digest"]


def test_push_twice_and_read_it_back(layout: tuple[Path, Path], registry: tuple[str, Path]) -> None:
    host, _ = registry
    directory, _ = layout
    sizes = blob_sizes(directory)
    tag = image_tag(VERSION)

    first = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "beta")
    assert first["tag"] == tag == "1.2.0-beta.1-g5eed"
    assert first["uploaded"] == {"blobs": len(sizes), "bytes": sum(sizes.values())}
    assert first["skipped"] == {"blobs": 0, "bytes": 0}
    assert first["uploaded"]["bytes"] > 2 << 20
    assert (first["version"], first["channel"], first["architecture"]) == (VERSION, "beta", "amd64")

    again = kiln(str(directory), "--to", f"{host}/{REPO}", "--channel", "beta")
    assert again.returncode == 0, again.stdout + again.stderr
    mib = sum(sizes.values()) / (1 << 20)
    assert again.stdout == (
        f"pushed {host}/{REPO}:{tag}@{first['digest']} (channel beta, version {VERSION}, "
        f"0 MiB uploaded, {mib:.1f} MiB already there)\n"
    )
    assert "uploading" not in again.stderr

    manifest, digest = served_manifest(host, tag)
    assert digest == first["digest"]
    assert manifest["annotations"]["org.opencontainers.image.version"] == VERSION
    assert manifest["annotations"]["dev.kiln.channel"] == "beta"
    assert manifest["annotations"]["dev.kiln.architecture"] == "amd64"
    assert "dev.kiln.upgrade-from" not in manifest["annotations"]
    assert "org.opencontainers.image.created" in manifest["annotations"]  # the layout's own are kept
    assert {d["digest"]: d["size"] for d in [manifest["config"], *manifest["layers"]]} == sizes
    for blob_digest, size in sizes.items():
        response = requests.get(f"http://{host}/v2/{REPO}/blobs/{blob_digest}", timeout=30)
        assert response.status_code == 200
        assert len(response.content) == size
        assert "sha256:" + hashlib.sha256(response.content).hexdigest() == blob_digest
    tags = requests.get(f"http://{host}/v2/{REPO}/tags/list", timeout=10).json()["tags"]
    assert tags == [tag]

    # The core client reads the same back.
    client = Client(Ref.parse(f"{host}/{REPO}"))
    assert client.tags() == [tag]
    fetched = client.get_manifest(tag)
    assert fetched is not None and fetched[1] == digest
    assert client.get_manifest(digest) == fetched
    assert client.get_manifest("0.0.1") is None
    assert client.manifest_digest(tag) == digest
    assert Client(Ref.parse(f"{host}/kiln/nothing-here")).tags() == []


def test_the_tar_gives_the_same_manifest(layout: tuple[Path, Path], registry: tuple[str, Path]) -> None:
    host, _ = registry
    directory, tar = layout
    from_tar = push_json(str(tar), "--to", f"{host}/{REPO}", "--channel", "stable")
    from_directory = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "stable")
    assert from_tar["digest"] == from_directory["digest"]
    assert from_directory["uploaded"]["bytes"] == 0


def test_another_channel_of_the_same_version(layout: tuple[Path, Path], registry: tuple[str, Path]) -> None:
    host, _ = registry
    directory, _ = layout
    beta = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "beta")
    stable = push_json(str(directory), "--to", f"{host}/{REPO}", "--channel", "stable", "--upgrade-from", "1.1.0")
    assert stable["tag"] == beta["tag"]
    assert stable["digest"] != beta["digest"]
    assert stable["uploaded"]["bytes"] == 0
    assert stable["replaced"] == beta["digest"]
    manifest, digest = served_manifest(host, stable["tag"])
    assert digest == stable["digest"]
    assert manifest["annotations"]["dev.kiln.channel"] == "stable"
    assert manifest["annotations"]["dev.kiln.upgrade-from"] == "1.1.0"
    served_manifest(host, beta["digest"])  # the beta manifest is still there by digest, untagged
    assert requests.get(f"http://{host}/v2/{REPO}/tags/list", timeout=10).json()["tags"] == [stable["tag"]]

    text = kiln(str(directory), "--to", f"{host}/{REPO}", "--channel", "beta")
    assert text.returncode == 0, text.stderr
    assert re.fullmatch(
        rf"pushed {re.escape(host)}/{REPO}:{stable['tag']}@{beta['digest']} \(channel beta, .*\)\n"
        rf"  the tag {stable['tag']} named {stable['digest']} before\n",
        text.stdout,
    )


def test_a_registry_that_does_not_answer_exits_1(layout: tuple[Path, Path]) -> None:
    directory, _ = layout
    result = kiln(str(directory), "--to", f"127.0.0.1:{services.free_port()}/{REPO}", "--channel", "alpha")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"/v2/{REPO}/blobs/sha256:" in result.stderr and "failed" in result.stderr
