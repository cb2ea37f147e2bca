"""`kiln release push` without a registry: arguments, versions, the layout checks and the annotated manifest."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import IO, Any, ClassVar

import pytest

from kiln.cli import main
from kiln.core import registry
from kiln.core.errors import InputError
from kiln.core.registry import Ref
from kiln.core.semver import SemVer
from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import INDEX_TYPE, build_installer, build_installer_index, image_tag
from kiln.installer.image_layout import VERSION_KEY, open_layout
from kiln.installer.release import (
    ARCH_KEY,
    CHANNEL_KEY,
    UPGRADE_FROM_KEY,
    annotated_manifest,
    push_release,
    push_releases,
    read_release,
    read_releases,
)

EPOCH = 1700000000
VERSION = "1.4.0-rc.1+g1234abc"
ELF_MACHINES = {"amd64": 0x3E, "arm64": 0xB7}


def fake_static_elf(path: Path, arch: str = "amd64") -> Path:
    """A 64-byte ELF header with no program headers: what static_elf_arch reads, nothing that runs."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", header, 18, ELF_MACHINES[arch])
    struct.pack_into("<Q", header, 32, 64)  # e_phoff
    struct.pack_into("<HH", header, 54, 56, 0)  # e_phentsize, e_phnum
    path.write_bytes(bytes(header))
    return path


def make_layout(base: Path, version: str = VERSION, arch: str = "amd64") -> tuple[Path, Path]:
    """A small installer layout and its tar, written by the real build_installer from fake inputs."""
    inputs = base / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "vmlinuz").write_bytes(b"fake kernel " * 100)
    (inputs / "initramfs.zst").write_bytes(b"fake initramfs " * 100)
    (inputs / "disk.raw").write_bytes(b"\0" * 65536 + b"fake disk" * 100)
    assets = BootAssets.make(inputs / "vmlinuz", inputs / "initramfs.zst", "console=ttyS0", version, EPOCH)
    machined = fake_static_elf(inputs / "machined", arch)
    return build_installer(assets, inputs / "disk.raw", machined, base / "out", "installer")


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    return make_layout(tmp_path)


def layout_manifest(layout: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The layout's index entry and its image manifest."""
    [entry] = json.loads((layout / "index.json").read_bytes())["manifests"]
    return entry, json.loads((layout / "blobs/sha256" / entry["digest"][7:]).read_bytes())


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any HTTP request is recorded and refused."""
    calls: list[str] = []

    def refuse(self: object, method: str, url: str, **kwargs: object) -> None:
        calls.append(f"{method} {url}")
        raise AssertionError(f"nothing may be sent: {method} {url}")

    monkeypatch.setattr("requests.Session.request", refuse)
    return calls


def push(*args: str) -> int:
    return main(["release", "push", *args])


# --- versions and arguments ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1.4.0", "0.0.1", "1.5.0-rc.1", "1.0.0-alpha.beta.1", "2.0.0+g1234.dirty", VERSION])
def test_semantic_versions_are_accepted(text: str) -> None:
    assert str(SemVer.parse(text)) == text


@pytest.mark.parametrize(
    "text", ["1.4", "v1.4.0", "01.4.0", "1.4.0-", "1.4.0-rc..1", "1.4.0-01", "1.4.0+", "1.4.0 ", "1.٤.0", "dev", ""]
)
def test_other_versions_are_refused(text: str) -> None:
    with pytest.raises(InputError, match="is not a semantic version"):
        SemVer.parse(text)


def test_semver_precedence() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.2.0",
        "1.10.0",
        "2.0.0",
    ]
    versions = [SemVer.parse(v) for v in ordered]
    assert sorted(reversed(versions)) == versions
    assert SemVer.parse("1.0.0+a").key() == SemVer.parse("1.0.0+b").key()


def test_repository_references() -> None:
    ref = Ref.parse("localhost:5000/kiln/installer")
    assert (ref.host, ref.repo, ref.scheme, str(ref)) == (
        "localhost:5000",
        "kiln/installer",
        "http",
        ref.host + "/kiln/installer",
    )
    assert Ref.parse("registry.example.com/kiln").scheme == "https"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "localhost:5000/kiln:1.0.0"], "expected HOST[:PORT]/REPOSITORY"),
        (["--to", "oci://localhost:5000/kiln"], "expected HOST[:PORT]/REPOSITORY"),
        (["--to", "localhost:5000/Kiln"], "expected HOST[:PORT]/REPOSITORY"),
        (["--to", "localhost:5000/kiln", "--upgrade-from", "1.2"], "--upgrade-from '1.2' is not a semantic version"),
        (["--to", "localhost:5000/kiln", "--upgrade-from", "2.0.0"], "--upgrade-from 2.0.0 is newer than"),
        (["--to", "localhost:5000/kiln", "--out", "elsewhere"], "--out applies when a profile is built"),
        (["--to", "localhost:5000/kiln", "--schematic", "s.yaml"], "--schematic applies when a profile is built"),
    ],
)
def test_bad_arguments_exit_2(
    layout: tuple[Path, Path],
    no_network: list[str],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    assert push(str(layout[0]), "--channel", "beta", *args) == 2
    assert message in capsys.readouterr().err
    assert no_network == []


def test_unknown_channel_is_refused(layout: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        push(str(layout[0]), "--to", "localhost:5000/kiln", "--channel", "nightly")
    assert exited.value.code == 2
    assert "invalid choice: 'nightly'" in capsys.readouterr().err


def test_missing_path_and_non_installer_profile(
    tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert push(str(tmp_path / "nope.tar"), "--to", "localhost:5000/kiln", "--channel", "beta") == 2
    assert "no such installer layout or tarball" in capsys.readouterr().err
    profiles = Path(__file__).resolve().parents[2] / "profiles"
    assert push("metal", "--profiles-dir", str(profiles), "--to", "localhost:5000/k", "--channel", "beta") == 2
    assert "profile metal writes image: kiln release push needs an installer profile" in capsys.readouterr().err
    assert push("nosuch", "--profiles-dir", str(profiles), "--to", "localhost:5000/k", "--channel", "beta") == 2
    assert "nosuch is not an existing layout or tar, nor a profile: unknown profile" in capsys.readouterr().err


def test_a_version_that_is_not_semver_is_refused(tmp_path: Path, no_network: list[str]) -> None:
    layout, _ = make_layout(tmp_path, version="dev-build")
    with open_layout(layout) as opened, pytest.raises(InputError, match="'dev-build' is not a semantic version"):
        read_release(opened)


# --- reading the layout ----------------------------------------------------------------------------------------------


def test_directory_and_tar_read_the_same_release(layout: tuple[Path, Path]) -> None:
    directory, tar = layout
    with open_layout(directory) as a, open_layout(tar) as b:
        first, second = read_release(a), read_release(b)
    assert first.manifest == second.manifest
    assert (first.version.text, first.architecture) == (VERSION, "amd64")
    assert (second.version.text, second.architecture) == (VERSION, "amd64")
    _, manifest = layout_manifest(directory)
    assert [b.digest for b in first.blobs] == [manifest["config"]["digest"]] + [
        layer["digest"] for layer in manifest["layers"]
    ]


def test_architecture_comes_from_the_config(tmp_path: Path) -> None:
    directory, _ = make_layout(tmp_path, version="2.0.0", arch="arm64")
    with open_layout(directory) as opened:
        assert read_release(opened).architecture == "arm64"


def test_version_falls_back_to_the_config_label(layout: tuple[Path, Path]) -> None:
    directory, _ = layout
    _, manifest = layout_manifest(directory)
    del manifest["annotations"][VERSION_KEY]
    rewrite_manifest(directory, manifest)
    with open_layout(directory) as opened:
        assert read_release(opened).version.text == VERSION


def rewrite_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Store a changed manifest as a new blob and point index.json at it (a consistent layout)."""
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (directory / "blobs/sha256" / digest).write_bytes(data)
    index = json.loads((directory / "index.json").read_bytes())
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(data))
    (directory / "index.json").write_text(json.dumps(index))


def test_annotated_manifest(layout: tuple[Path, Path]) -> None:
    directory, tar = layout
    _, original = layout_manifest(directory)
    with open_layout(directory) as opened:
        release = read_release(opened)
    body = annotated_manifest(release.manifest, release.version, "beta", release.architecture, None)
    with open_layout(tar) as opened:
        again = read_release(opened)
    assert annotated_manifest(again.manifest, again.version, "beta", again.architecture, None) == body
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    pushed = json.loads(body)
    assert pushed["config"] == original["config"]
    assert pushed["layers"] == original["layers"]
    assert pushed["mediaType"] == original["mediaType"]
    assert pushed["annotations"] == {
        **original["annotations"],
        VERSION_KEY: VERSION,
        CHANNEL_KEY: "beta",
        ARCH_KEY: "amd64",
    }
    assert UPGRADE_FROM_KEY not in pushed["annotations"]

    stable = annotated_manifest(release.manifest, release.version, "stable", "amd64", SemVer.parse("1.3.0"))
    assert json.loads(stable)["annotations"][UPGRADE_FROM_KEY] == "1.3.0"
    assert json.loads(stable)["annotations"][CHANNEL_KEY] == "stable"
    assert stable != body

    # Release keys in the layout (one pushed before, pulled back) are replaced, never kept.
    stale = {**release.manifest, "annotations": {**original["annotations"], UPGRADE_FROM_KEY: "0.1.0"}}
    assert annotated_manifest(stale, release.version, "beta", "amd64", None) == body


# --- refusals: nothing is pushed -------------------------------------------------------------------------------------


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("which", ["layer", "config", "manifest"])
def test_a_blob_that_does_not_match_its_digest_is_refused(
    layout: tuple[Path, Path], no_network: list[str], capsys: pytest.CaptureFixture[str], which: str
) -> None:
    directory, _ = layout
    entry, manifest = layout_manifest(directory)
    digest = {"layer": manifest["layers"][-1], "config": manifest["config"], "manifest": entry}[which]["digest"]
    flip_last_byte(directory / "blobs/sha256" / digest[7:])
    assert push(str(directory), "--to", "127.0.0.1:9/kiln/installer", "--channel", "stable") == 2
    err = capsys.readouterr().err
    assert f"blob {digest}" in err and "does not match its descriptor" in err
    assert no_network == []


def test_a_short_or_missing_blob_is_refused(
    layout: tuple[Path, Path], no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = layout
    _, manifest = layout_manifest(directory)
    first, second = manifest["layers"][0]["digest"][7:], manifest["layers"][1]["digest"][7:]
    blob = directory / "blobs/sha256" / first
    whole = blob.read_bytes()
    blob.write_bytes(whole[:-1])
    assert push(str(directory), "--to", "127.0.0.1:9/kiln", "--channel", "alpha") == 2
    assert f"it holds {manifest['layers'][0]['size'] - 1} bytes" in capsys.readouterr().err
    blob.write_bytes(whole)
    (directory / "blobs/sha256" / second).unlink()
    with (
        open_layout(directory) as opened,
        pytest.raises(InputError, match=f"has no regular file blobs/sha256/{second}"),
    ):
        read_release(opened)
    assert no_network == []


def test_a_tampered_tar_is_refused(tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, tar = make_layout(tmp_path)
    data = bytearray(tar.read_bytes())
    at = data.find(b'"Kiln installer"')  # in the config blob, stored as it is in the tar
    assert at > 0 and data.count(b'"Kiln installer"') == 1
    data[at + 1 : at + 2] = b"k"
    tar.write_bytes(bytes(data))
    assert push(str(tar), "--to", "127.0.0.1:9/kiln", "--channel", "beta") == 2
    assert "does not match its descriptor" in capsys.readouterr().err
    assert no_network == []


def test_an_index_with_two_images_of_one_arch_is_refused(layout: tuple[Path, Path], no_network: list[str]) -> None:
    directory, _ = layout
    index = json.loads((directory / "index.json").read_bytes())
    index["manifests"] *= 2
    (directory / "index.json").write_text(json.dumps(index))
    with open_layout(directory) as opened, pytest.raises(InputError, match="two images for linux/amd64"):
        read_releases(opened)
    index["manifests"] *= 2
    (directory / "index.json").write_text(json.dumps(index))
    with open_layout(directory) as opened, pytest.raises(InputError, match=r"one per architecture .*it names 4"):
        read_releases(opened)


def test_not_a_layout(tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    assert push(str(junk), "--to", "127.0.0.1:9/kiln", "--channel", "beta") == 2
    assert "not an OCI image layout directory or a readable tar" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert push(str(tmp_path / "empty"), "--to", "127.0.0.1:9/kiln", "--channel", "beta") == 2
    assert "has no regular file index.json" in capsys.readouterr().err


# --- what is sent, with a stand-in client ----------------------------------------------------------------------------


class FakeClient:
    """A registry in memory that holds the config already."""

    instances: ClassVar[list[FakeClient]] = []

    def __init__(self, ref: Ref) -> None:
        self.ref = ref
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        FakeClient.instances.append(self)

    def has_blob(self, digest: str) -> bool:
        return digest in self.blobs

    def upload_blob(self, data: IO[bytes], digest: str, size: int, what: str = "") -> None:
        content = data.read()
        assert len(content) == size and "sha256:" + hashlib.sha256(content).hexdigest() == digest
        self.blobs[digest] = content

    def manifest_digest(self, reference: str, accept: str = "") -> str | None:
        body = self.manifests.get(reference)
        return None if body is None else "sha256:" + hashlib.sha256(body).hexdigest()

    def put_manifest(self, reference: str, body: bytes, media_type: str = "") -> str:
        self.manifests[reference] = body
        return "sha256:" + hashlib.sha256(body).hexdigest()


def test_push_sends_missing_blobs_then_the_manifest_under_the_version_tag(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = layout
    monkeypatch.setattr(registry, "Client", FakeClient)
    FakeClient.instances.clear()
    said: list[str] = []
    with open_layout(directory) as opened:
        release = read_release(opened)
        config = release.blobs[0]
        monkeypatch.setattr(FakeClient, "has_blob", lambda self, digest: digest == config.digest)
        pushed = push_release(release, Ref.parse("localhost:5000/kiln/installer"), "beta", None, said.append)
    [client] = FakeClient.instances
    assert set(client.blobs) == {b.digest for b in release.blobs[1:]}
    assert list(client.manifests) == [image_tag(VERSION)] == ["1.4.0-rc.1-g1234abc"]
    assert pushed.digest == "sha256:" + hashlib.sha256(client.manifests[pushed.tag]).hexdigest()
    assert pushed.skipped == [config] and pushed.uploaded_bytes == sum(b.size for b in release.blobs[1:])
    assert len(said) == len(release.blobs) - 1
    assert pushed.line().startswith(f"pushed localhost:5000/kiln/installer:1.4.0-rc.1-g1234abc@{pushed.digest} (")
    assert pushed.line().endswith(
        "(channel beta, version 1.4.0-rc.1+g1234abc, 0.0 MiB uploaded, 0.0 MiB already there)"
    )
    summary = pushed.summary()
    assert summary["uploaded"]["blobs"] == len(release.blobs) - 1
    assert summary["skipped"] == {"blobs": 1, "bytes": config.size}
    assert summary["replaced"] is None and summary["upgrade_from"] is None


def test_a_blob_that_is_a_symlink_is_refused(layout: tuple[Path, Path], tmp_path: Path, no_network: list[str]) -> None:
    directory, _ = layout
    _, manifest = layout_manifest(directory)
    blob = directory / "blobs/sha256" / manifest["layers"][0]["digest"][7:]
    outside = tmp_path / "outside"
    outside.write_bytes(blob.read_bytes())  # the right bytes, but not a file of the layout
    blob.unlink()
    blob.symlink_to(outside)
    with open_layout(directory) as opened, pytest.raises(InputError, match="has no regular file blobs/sha256/"):
        read_release(opened)


# --- one release for both arches: an image index ---------------------------------------------------------------------


def make_index(base: Path, versions: tuple[str, str] = ("1.4.0", "1.4.0")) -> tuple[Path, Path]:
    """installer-oci/ and installer-index.tar over an amd64 and an arm64 layout (build_installer_index)."""
    layouts = [
        make_layout(base / arch, version, arch)[0] for arch, version in zip(("amd64", "arm64"), versions, strict=True)
    ]
    return build_installer_index(layouts, base / "out", "installer", EPOCH)


def test_a_layout_with_one_image_per_arch_is_one_release(tmp_path: Path) -> None:
    directory, tar = make_index(tmp_path)
    for source in (directory, tar):
        with open_layout(source) as opened:
            releases = read_releases(opened)
            assert [(r.architecture, r.version.text) for r in releases] == [("amd64", "1.4.0"), ("arm64", "1.4.0")]
        with open_layout(source) as opened, pytest.raises(InputError, match="exactly one image manifest, it names 2"):
            read_release(opened)


def test_one_release_has_one_version(tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    directory, _ = make_index(tmp_path, ("1.4.0", "1.5.0"))
    assert push(str(directory), "--to", "127.0.0.1:9/kiln/installer", "--channel", "beta") == 2
    assert "the images have different versions (amd64 1.4.0, arm64 1.5.0): a release is one version" in (
        capsys.readouterr().err
    )
    assert no_network == []


def test_an_index_reached_through_index_json_is_followed(tmp_path: Path) -> None:
    """The buildx shape: index.json's one entry is an image index, whose entries are the images."""
    directory, _ = make_index(tmp_path)
    nested = (directory / "index.json").read_bytes()
    digest = hashlib.sha256(nested).hexdigest()
    (directory / "blobs/sha256" / digest).write_bytes(nested)
    entry = {"mediaType": INDEX_TYPE, "digest": f"sha256:{digest}", "size": len(nested)}
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    with open_layout(directory) as opened:
        assert [r.architecture for r in read_releases(opened)] == ["amd64", "arm64"]
    (directory / "blobs/sha256" / digest).write_bytes(nested + b" ")
    with open_layout(directory) as opened, pytest.raises(InputError, match=r"image index.*does not match"):
        read_releases(opened)


def test_push_sends_both_manifests_by_digest_then_the_index_under_the_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = make_index(tmp_path)
    monkeypatch.setattr(registry, "Client", FakeClient)
    FakeClient.instances.clear()
    with open_layout(directory) as opened:
        releases = read_releases(opened)
        pushed = push_releases(releases, Ref.parse("localhost:5000/kiln/installer"), "beta", SemVer.parse("1.3.0"))
    [client] = FakeClient.instances
    every = {b.digest: b.size for r in releases for b in r.blobs}
    assert len(every) < sum(len(r.blobs) for r in releases)  # the images share blobs (the disk layer)
    assert {d: len(data) for d, data in client.blobs.items()} == every  # each sent once
    assert pushed.uploaded_bytes == sum(every.values()) and pushed.skipped == []

    tag = image_tag("1.4.0")
    assert list(client.manifests) == [*pushed.manifests.values(), tag]  # the manifests first, then the tag
    index = json.loads(client.manifests[tag])
    assert pushed.digest == "sha256:" + hashlib.sha256(client.manifests[tag]).hexdigest()
    assert index["mediaType"] == INDEX_TYPE and index["schemaVersion"] == 2
    assert index["annotations"] == {VERSION_KEY: "1.4.0", CHANNEL_KEY: "beta", UPGRADE_FROM_KEY: "1.3.0"}
    assert [(m["platform"], m["digest"]) for m in index["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, pushed.manifests["amd64"]),
        ({"architecture": "arm64", "os": "linux"}, pushed.manifests["arm64"]),
    ]
    for entry in index["manifests"]:
        body = client.manifests[entry["digest"]]
        assert entry["size"] == len(body) and entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        annotations = json.loads(body)["annotations"]
        assert annotations[ARCH_KEY] == entry["platform"]["architecture"]
        assert (annotations[CHANNEL_KEY], annotations[VERSION_KEY], annotations[UPGRADE_FROM_KEY]) == (
            "beta",
            "1.4.0",
            "1.3.0",
        )
    summary = pushed.summary()
    assert (summary["architecture"], summary["media_type"]) == (None, INDEX_TYPE)
    assert summary["manifests"] == pushed.manifests
    assert pushed.line().startswith(
        f"pushed localhost:5000/kiln/installer:1.4.0@{pushed.digest} (index of amd64, arm64;"
    )
    # the same layout, channel and upgrade-from: the same index
    with open_layout(directory) as opened:
        again = push_releases(read_releases(opened), Ref.parse("localhost:5000/kiln/x"), "beta", SemVer.parse("1.3.0"))
    assert again.digest == pushed.digest


def test_a_profile_for_several_platforms_pushes_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kiln release push installer --platform linux/amd64,linux/arm64`: built as `kiln image` does for both,
    then the index layout is what is pushed (the building is stood in for here)."""
    from kiln.image import multiarch

    directory, _ = make_index(tmp_path / "index")
    (tmp_path / "installer.yaml").write_text("platform: metal\noutput: {kind: installer}\n")
    asked: list[list[str]] = []

    def build_platforms(load: object, profiles: list[Any], platforms: list[str], *args: Any, **kw: Any) -> list[Any]:
        asked.append(platforms)
        return []

    def make_platform_images(*args: Any) -> tuple[list[Any], list[Any]]:
        return [multiarch.PlatformsResult("installer", directory.parent, [])], []

    monkeypatch.setattr(multiarch, "build_platforms", build_platforms)
    monkeypatch.setattr(multiarch, "make_platform_images", make_platform_images)
    monkeypatch.setattr(registry, "Client", FakeClient)
    FakeClient.instances.clear()
    code = push(
        "installer",
        "--profiles-dir",
        str(tmp_path),
        "--platform",
        "linux/amd64,linux/arm64",
        "--to",
        "localhost:5000/kiln/installer",
        "--channel",
        "alpha",
        "--json",
    )
    assert code == 0
    assert asked == [["linux/amd64", "linux/arm64"]]
    summary = json.loads(capsys.readouterr().out)
    assert summary["media_type"] == INDEX_TYPE and sorted(summary["manifests"]) == ["amd64", "arm64"]
