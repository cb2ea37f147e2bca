"""Extensions through a real registry (Debian's docker-registry): push, pull, cache, and what is refused.

The tree is a small hand-made extension output (a service definition, a script standing in for a
program: nothing runs it); tests/e2e/test_extensions.py pushes the shipped extensions built from
pkgs/ and compares an image made from the registry with one made from the tree, byte for byte.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import InputError
from kiln.core.registry import MANIFEST_TYPE, Client, Ref, RegistryError
from kiln.image.oci_extension import ARTIFACT_TYPE, CONFIG_TYPE, TREE_TYPE, pull, push
from tests.integration import services

pytestmark = pytest.mark.integration

MANIFEST = {"name": "hello", "version": "1.0", "author": "tests", "compatibility": ">=0.1"}


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


def extension_tree(base: Path) -> Path:
    tree = base / "tree"
    (tree / "usr/local/bin").mkdir(parents=True)
    (tree / "usr/local/lib/kiln/services").mkdir(parents=True)
    (tree / "usr/local/bin/hello").write_text("#!/bin/true\n")
    (tree / "usr/local/bin/hello").chmod(0o755)
    (tree / "usr/local/lib/kiln/services/hello.json").write_text('{"command": "/usr/local/bin/hello"}\n')
    os.symlink("hello", tree / "usr/local/bin/hi")
    return tree


def description(arch: str = "amd64") -> dict[str, Any]:
    return {"name": "hello", "version": "1.0", "arch": arch, "manifest": MANIFEST, "kernel": None}


def listing(tree: Path) -> list[tuple[str, int, str]]:
    """Path, mode and content (or link target) of every entry: what a pull must give back exactly."""
    entries = []
    for path in sorted(tree.rglob("*")):
        what = os.readlink(path) if path.is_symlink() else path.read_text() if path.is_file() else ""
        entries.append((str(path.relative_to(tree)), path.lstat().st_mode, what))
    return entries


def test_push_then_pull_gives_the_same_tree_pinned_and_cached(
    registry: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, _ = registry
    tree = extension_tree(tmp_path)
    pinned = push(tree, description(), f"{host}/kiln/hello:1.0")
    assert pinned.startswith(f"oci://{host}/kiln/hello:1.0@sha256:")
    assert push(tree, description(), f"{host}/kiln/hello:1.0") == pinned  # same bytes, same digest
    cache = tmp_path / "cache"
    pulled = pull(f"oci://{host}/kiln/hello:1.0", "amd64", cache)
    assert pulled.reference == pinned and pulled.name == "hello" and pulled.manifest.author == "tests"
    assert listing(pulled.tree) == listing(tree)
    with pytest.raises(InputError, match="is built for amd64, this image is arm64"):
        pull(f"oci://{host}/kiln/hello:1.0", "arm64", cache)
    # Once pulled, a digest-pinned reference needs no registry (an air-gapped factory): point it nowhere.
    digest = pinned.rsplit("@", 1)[1]
    offline = pull(f"oci://127.0.0.1:9/kiln/hello@{digest}", "amd64", cache)
    assert offline.tree == pulled.tree
    with pytest.raises(RegistryError, match="no such tag"):
        pull(f"oci://{host}/kiln/hello:2.0", "amd64", cache)


def put_artifact(host: str, repo: str, tag: str, config: bytes, tree_tar: bytes, tmp: Path) -> None:
    """An artifact written by hand, as a hostile registry or pusher could."""
    client = Client(Ref(host, repo))
    descriptors = []
    for name, data, media in (("config", config, CONFIG_TYPE), ("tree", tree_tar, TREE_TYPE)):
        (tmp / name).write_bytes(data)
        descriptors.append(client.put_blob_file(tmp / name, media))
    body = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptors[0],
        "layers": [descriptors[1]],
    }
    client.put_manifest(tag, json.dumps(body).encode())


def zstd_tar(members: list[tuple[str, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True).stdout


def test_hostile_artifacts_are_refused_and_leave_nothing(registry: tuple[str, Path], tmp_path: Path) -> None:
    host, _ = registry
    good_config = json.dumps(description()).encode()
    cases = [
        ("escape", good_config, zstd_tar([("../../etc/evil", b"x")]), "unsafe archive"),
        ("absolute", good_config, zstd_tar([("/etc/evil", b"x")]), "unsafe archive"),
        ("bad-name", json.dumps(description() | {"manifest": MANIFEST | {"name": "../x"}}).encode(), b"", "name"),
        ("not-json", b"{nope", zstd_tar([("usr/local/x", b"x")]), "not JSON"),
    ]
    cache = tmp_path / "cache"
    for tag, config, tree_tar, message in cases:
        put_artifact(host, "kiln/hostile", tag, config, tree_tar, tmp_path)
        with pytest.raises((RegistryError, InputError), match=message):
            pull(f"oci://{host}/kiln/hostile:{tag}", "amd64", cache)
    assert not (tmp_path / "etc").exists()
    assert [p.name for p in (cache / "extensions").iterdir()] == []  # no half-pulled entry stays
