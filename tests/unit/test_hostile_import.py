"""`kiln bootstrap --from-tar` against hostile image archives, built here with tarfile and unpacked for real."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from kiln.build.seed_import import import_tarball
from kiln.build.seed_layers import SeedError
from kiln.pkg.variables import Platform
from tests.conftest import Result, write_tree

AMD64 = Platform.parse("linux/amd64")
ARM64 = Platform.parse("linux/arm64")
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def layer(members: Mapping[str, bytes | str | None]) -> bytes:
    """A layer: name -> content; None makes a directory, a str a symlink to it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Image:
    """Blobs and an index for an OCI image layout archive."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def add(self, data: bytes, media_type: str, **extra: object) -> dict[str, object]:
        self.blobs[digest(data)] = data
        return {"mediaType": media_type, "digest": digest(data), "size": len(data), **extra}

    def manifest(
        self, layers: list[bytes], arch: str = "amd64", media_type: str = LAYER_TAR, diff_ids: list[bytes] | None = None
    ) -> bytes:
        config = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "rootfs": {
                    "type": "layers",
                    "diff_ids": [digest(d) for d in (diff_ids if diff_ids is not None else layers)],
                },
            }
        )
        return json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": self.add(config.encode(), "application/vnd.oci.image.config.v1+json"),
                "layers": [self.add(data, media_type) for data in layers],
            }
        ).encode()

    def write(
        self, path: Path, manifests: list[dict[str, object]], tamper: Callable[[dict[str, bytes]], None] | None = None
    ) -> Path:
        files = {
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": json.dumps({"schemaVersion": 2, "manifests": manifests}).encode(),
        }
        files |= {f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in self.blobs.items()}
        if tamper:
            tamper(files)
        return write_tar(path, files)


def write_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def single(tmp_path: Path, layers: list[bytes], **kwargs: object) -> Path:
    image = Image()
    manifest = image.manifest(layers, **kwargs)  # type: ignore[arg-type]
    return image.write(tmp_path / "image.tar", [image.add(manifest, MANIFEST)])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return tmp_path / "staging" / "tree"


def test_whiteout_escape_is_refused_and_the_canary_survives(tmp_path: Path, tree: Path) -> None:
    canary = tmp_path / "staging" / "victim"
    canary.mkdir(parents=True)
    (canary / "precious").write_text("keep me")
    bottom = layer({"etc/": None, "etc/a": b"a"})
    for evil in ("../victim/.wh..wh..opq", "../victim/.wh.precious", "etc/.wh...", "etc/.wh.."):
        archive = single(tmp_path, [bottom, layer({evil: b""})])
        with pytest.raises(SeedError) as info:
            import_tarball(archive, tree, AMD64)
        assert info.value.exit_code == 2
        assert (canary / "precious").read_text() == "keep me"
        assert (tree / "etc/a").exists()


def test_whiteout_through_a_symlink_of_the_tree_is_refused(tmp_path: Path, tree: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep me")
    bottom = layer({"lnk": str(outside)})
    for top in ({"lnk/.wh..wh..opq": b""}, {"lnk/.wh.keep": b""}, {"lnk/new": b"x"}):
        with pytest.raises(SeedError, match="symlink 'lnk'"):
            import_tarball(single(tmp_path, [bottom, layer(top)]), tree, AMD64)
        assert sorted(p.name for p in outside.iterdir()) == ["keep"]


def test_member_through_a_symlink_of_the_same_layer_is_refused(tmp_path: Path, tree: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = single(tmp_path, [layer({"etc": str(outside)}), layer({"x": "etc", "x/passwd": b"pwned"})])
    with pytest.raises(SeedError, match="through the symlink 'x'"):
        import_tarball(archive, tree, AMD64)
    assert list(outside.iterdir()) == []


def test_whiteouts_inside_still_work(tmp_path: Path, tree: Path) -> None:
    bottom = layer(
        {
            "etc/": None,
            "etc/a": b"a",
            "etc/b": b"b",
            "opt/": None,
            "opt/old/": None,
            "opt/old/f": b"old",
            "opt/lnk": "/etc",
        }
    )
    top = layer({"etc/.wh.a": b"", "opt/.wh..wh..opq": b"", "opt/new": b"new"})
    import_tarball(single(tmp_path, [bottom, top]), tree, AMD64)
    assert not (tree / "etc/a").exists() and (tree / "etc/b").read_bytes() == b"b"
    assert sorted(p.name for p in (tree / "opt").iterdir()) == ["new"]
    assert Path("/etc/passwd").exists()  # the opaque marker removed the link, not what it points to


def multi_arch(tmp_path: Path) -> Path:
    image = Image()
    amd = image.manifest([layer({"arch": b"amd64"})], arch="amd64")
    arm = image.manifest([layer({"arch": b"arm64"})], arch="arm64")
    attestation = image.add(b'{"schemaVersion": 2}', MANIFEST, platform={"os": "unknown", "architecture": "unknown"})
    nested = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                image.add(amd, MANIFEST, platform={"os": "linux", "architecture": "amd64"}),
                image.add(arm, MANIFEST, platform={"os": "linux", "architecture": "arm64", "variant": "v8"}),
                attestation,
            ],
        }
    ).encode()
    return image.write(tmp_path / "multi.tar", [image.add(nested, INDEX)])


@pytest.mark.parametrize("platform", [AMD64, ARM64], ids=str)
def test_multi_arch_index_gives_the_platforms_image(tmp_path: Path, tree: Path, platform: Platform) -> None:
    import_tarball(multi_arch(tmp_path), tree, platform)
    assert (tree / "arch").read_bytes() == platform.arch.encode()


def test_multi_arch_index_without_the_platform_is_an_error(tmp_path: Path, tree: Path) -> None:
    image = Image()
    amd = image.manifest([layer({"arch": b"amd64"})], arch="amd64")
    archive = image.write(
        tmp_path / "amd.tar", [image.add(amd, MANIFEST, platform={"os": "linux", "architecture": "amd64"})]
    )
    with pytest.raises(SeedError, match=r"no image for linux/arm64 in this archive \(it has linux/amd64\)"):
        import_tarball(archive, tree, ARM64)


def test_single_image_for_another_arch_is_an_error(tmp_path: Path, tree: Path) -> None:
    with pytest.raises(SeedError, match="no image for linux/arm64"):
        import_tarball(single(tmp_path, [layer({"f": b"x"})]), tree, ARM64)


def docker_save(tmp_path: Path, layers: list[bytes], arch: str = "amd64") -> Path:
    """A classic `docker save` archive: <id>/layer.tar files, a <sha>.json config, manifest.json."""
    config = json.dumps(
        {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": [digest(d) for d in layers]}}
    ).encode()
    config_name = digest(config).removeprefix("sha256:") + ".json"
    files = {config_name: config}
    paths = []
    for number, data in enumerate(layers):
        paths.append(f"{number:064x}/layer.tar")
        files[paths[-1]] = data
    files["manifest.json"] = json.dumps(
        [{"Config": config_name, "RepoTags": ["seed:latest"], "Layers": paths}]
    ).encode()
    return write_tar(tmp_path / "saved.tar", files)


def test_docker_save_archive_is_mapped_not_unpacked_as_a_root(tmp_path: Path, tree: Path) -> None:
    archive = docker_save(
        tmp_path,
        [
            layer({"bin/": None, "bin/tool": b"v1", "etc/": None, "etc/a": b"a"}),
            layer({"bin/tool": b"v2", "etc/.wh.a": b""}),
        ],
    )
    import_tarball(archive, tree, AMD64)
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == ["bin", "bin/tool", "etc"]
    assert (tree / "bin/tool").read_bytes() == b"v2"


def test_docker_save_layer_must_match_its_diff_id(tmp_path: Path, tree: Path) -> None:
    archive = docker_save(tmp_path, [layer({"f": b"x"})])
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    files[f"{0:064x}/layer.tar"] = layer({"f": b"swapped"})
    with pytest.raises(SeedError, match="does not match its diff_id"):
        import_tarball(write_tar(tmp_path / "swapped.tar", files), tree, AMD64)


def test_unknown_media_type_is_refused(tmp_path: Path, tree: Path) -> None:
    archive = single(tmp_path, [layer({"f": b"x"})], media_type="application/vnd.example.layer.v1.tar+lz4")
    with pytest.raises(SeedError, match=r"media type 'application/vnd\.example\.layer\.v1\.tar\+lz4'") as info:
        import_tarball(archive, tree, AMD64)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_layers_work(tmp_path: Path, tree: Path, compression: str) -> None:
    plain = layer({"usr/": None, "usr/hello": b"hello"})
    if compression == "gzip":
        blob = gzip.compress(plain, mtime=0)
    else:
        if shutil.which("zstd") is None:
            pytest.skip("zstd is not installed")
        blob = subprocess.run(["zstd", "-q", "-c"], input=plain, capture_output=True, check=True).stdout
    archive = single(tmp_path, [blob], media_type=f"{LAYER_TAR}+{compression}", diff_ids=[plain])
    import_tarball(archive, tree, AMD64)
    assert (tree / "usr/hello").read_bytes() == b"hello"


def test_blob_digest_mismatch_is_refused(tmp_path: Path, tree: Path) -> None:
    image = Image()
    manifest = image.manifest([layer({"f": b"good"})])
    good = digest(layer({"f": b"good"})).removeprefix("sha256:")

    def swap(files: dict[str, bytes]) -> None:
        files[f"blobs/sha256/{good}"] = layer({"f": b"evil"})

    archive = image.write(tmp_path / "bad.tar", [image.add(manifest, MANIFEST)], tamper=swap)
    with pytest.raises(SeedError, match=f"blob sha256:{good} does not match its digest"):
        import_tarball(archive, tree, AMD64)
    assert not (tree / "f").exists()


def test_digest_with_a_path_in_it_is_refused(tmp_path: Path, tree: Path) -> None:
    image = Image()
    archive = image.write(
        tmp_path / "odd.tar", [{"mediaType": MANIFEST, "digest": "sha256:../../../etc/passwd", "size": 1}]
    )
    with pytest.raises(SeedError, match="malformed digest"):
        import_tarball(archive, tree, AMD64)


def test_cli_reports_a_bad_seed_archive_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kiln: Callable[..., Result]
) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    canary = tmp_path / "cache" / "victim"
    canary.mkdir(parents=True)
    (canary / "precious").write_text("keep me")
    pkgs = write_tree(tmp_path, {"p/pkg.yaml": "name: p\nvariant: scratch\n"})
    archive = single(tmp_path, [layer({"etc/": None}), layer({"../../../victim/.wh..wh..opq": b""})])
    result = kiln("bootstrap", "--pkgs", str(pkgs), "--from-tar", str(archive))
    assert result.code == 2, result.err
    assert "image.tar layer 2: member '../../../victim/.wh..wh..opq' leads outside the root" in result.err
    assert "Traceback" not in result.err and (canary / "precious").exists()
