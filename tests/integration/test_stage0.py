"""stage0 from a user's root tarball or OCI archive (`--from-tar`), instead of debootstrap.

The debootstrap path itself is exercised by the session fixture `seed_store`, which
every build test depends on.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from kiln.build.cache_keys import stage0_key
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.integration.conftest import Project

pytestmark = pytest.mark.integration


def stage0_entries(project: Project) -> list[dict[str, object]]:
    listing = json.loads(project.kiln("cache", "ls", "--json", check=True).out)
    return [e for e in listing if e["name"] == "stage0"]


def test_root_tarball_becomes_the_seed_and_builds_work_on_it(project: Project, seed_store: Path) -> None:
    seed_key = stage0_key(load_tree(project.pkgs, Platform.parse("linux/amd64")))
    tarball = project.root.parent / "root.tar"
    subprocess.run(["tar", "-C", str(seed_store / "store" / seed_key / "tree"), "-cf", str(tarball), "."], check=True)
    boot = project.kiln("bootstrap", "--from-tar", str(tarball), check=True)
    tar_key = boot.out.split()[-1]
    assert tar_key != seed_key  # keyed by the tarball's hash, not by stage0.yaml
    built = project.kiln("build", "greet-lib", "--from-tar", str(tarball), "--json", check=True)
    info = json.loads(built.out)["packages"]["greet-lib"]
    assert info["status"] == "built"
    plain = json.loads(project.kiln("ls", "--json", check=True).out)
    assert plain["greet-lib"]["key"] != info["key"]


def _tar(members: dict[str, bytes | None]) -> bytes:
    """A layer: name -> content (None makes a directory)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o755 if name.startswith("bin/") else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def oci_archive(path: Path, layers: list[bytes]) -> None:
    """An OCI image layout in a tar, as `docker save`/skopeo/buildah write them."""
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return f"sha256:{digest}"

    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": add(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": add(layer), "size": len(layer)}
                for layer in layers
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": add(manifest),
                    "size": len(manifest),
                }
            ],
        }
    ).encode()
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
    files |= {f"blobs/sha256/{d}": data for d, data in blobs.items()}
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_oci_archive_layers_apply_in_order_with_whiteouts(project: Project) -> None:
    bottom = _tar(
        {
            "bin/": None,
            "bin/tool": b"v1",
            "etc/": None,
            "etc/a": b"a",
            "etc/b": b"b",
            "opt/": None,
            "opt/old/": None,
            "opt/old/file": b"old",
        }
    )
    top = _tar({"bin/tool": b"v2", "etc/.wh.a": b"", "opt/.wh..wh..opq": b"", "opt/new": b"new"})
    archive = project.root.parent / "image.oci.tar"
    oci_archive(archive, [bottom, top])
    key = project.kiln("bootstrap", "--from-tar", str(archive), check=True).out.split()[-1]
    assert key in {e["key"] for e in stage0_entries(project)}
    tree = project.cache / "store" / key / "tree"
    assert (tree / "bin/tool").read_bytes() == b"v2"
    assert not (tree / "etc/a").exists()
    assert (tree / "etc/b").read_bytes() == b"b"
    assert not (tree / "opt/old").exists()
    assert (tree / "opt/new").read_bytes() == b"new"
    assert not list(tree.rglob(".wh.*"))
    assert "0 damaged" in project.kiln("cache", "verify", check=True).out


def test_missing_tarball_is_a_clear_error(project: Project) -> None:
    result = project.kiln("bootstrap", "--from-tar", "nope.tar")
    assert (result.code, result.err.strip()) == (2, "--from-tar: 'nope.tar' is not a file")
