"""The parts every output shares: out_format compression, manifest.json and the SBOMs (SPDX, CycloneDX).

Real tools throughout."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.image.compress import compress
from kiln.image.manifest import SbomPackage, SbomSubject, write_manifest, write_spdx
from kiln.image.sbom_cyclonedx import write_cyclonedx
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
EPOCH = 1700000000


def sparse_disk(path: Path) -> Path:
    """A 64 MiB sparse file with some data in it: stands in for a disk image (content does not matter here)."""
    with path.open("wb") as out:
        out.write(b"kiln" * 4096)
        out.seek(32 << 20)
        out.write(bytes(range(256)) * 64)
        out.truncate(64 << 20)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("out_format", [".gz", ".xz", ".zst", ".tar.gz"])
def test_compression_is_reproducible_and_round_trips(tmp_path: Path, out_format: str) -> None:
    hashes = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        disk = sparse_disk(tmp_path / run / "disk.raw")
        original = sha(disk)
        made = compress(disk, out_format, EPOCH)
        assert made.name == "disk.raw" + out_format and not disk.exists()
        hashes.append(sha(made))
    assert hashes[0] == hashes[1]
    if out_format == ".tar.gz":
        with tarfile.open(made) as archive:
            members = archive.getmembers()
            assert [m.name for m in members] == ["disk.raw"]
            assert members[0].mtime == EPOCH and members[0].uid == 0
            data = archive.extractfile(members[0])
            assert data is not None and hashlib.sha256(data.read()).hexdigest() == original
        raw_tar = subprocess.run(["gzip", "-dc", str(made)], capture_output=True, check=True).stdout
        assert raw_tar[257:265] == b"ustar  \0"  # GNU format, as GCP requires
    else:
        tool = {".gz": "gzip", ".xz": "xz", ".zst": "zstd"}[out_format]
        back = subprocess.run([tool, "-dc", str(made)], capture_output=True, check=True).stdout
        assert hashlib.sha256(back).hexdigest() == original


def test_raw_out_format_leaves_the_file(tmp_path: Path) -> None:
    disk = sparse_disk(tmp_path / "disk.raw")
    assert compress(disk, "raw", EPOCH) == disk and disk.exists()


def written_twice(
    write: Callable[[Path, SbomSubject], Path], rootfs: list[str], tmp_path: Path
) -> tuple[Tree, list[Path]]:
    """The shipped tree, and one SBOM writer's document for `rootfs` and the kernel, written twice."""
    tree = load_tree(ROOT / "pkgs", Platform.parse("linux/amd64"))
    chosen = [SbomPackage.built(tree.packages[n], f"{i:064x}", "rootfs") for i, n in enumerate(rootfs)]
    chosen.append(SbomPackage.built(tree.packages["kernel"], "f" * 64, "kernel"))
    outputs = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        outputs.append(write(tmp_path / run, SbomSubject("metal", "0.1.0", "ab" * 32, EPOCH, chosen)))
    return tree, outputs


def test_sbom_validates_lists_the_packages_and_is_reproducible(tmp_path: Path) -> None:
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    tree, outputs = written_twice(write_spdx, ["kmod", "e2fsprogs"], tmp_path)
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
    document = parse_file(str(outputs[0]))
    assert validate_full_spdx_document(document) == []
    names = {p.name: p for p in document.packages}
    built = {"kiln-metal", "kmod", "e2fsprogs", "kernel"}
    assert built <= set(names)
    assert {n for n in names if n not in built} == {
        f"{name} source {s.destination}"
        for name in ("kmod", "e2fsprogs", "kernel")
        for step in tree.packages[name].steps
        for s in step.sources
        if s.url
    }, "every remote source is listed, each as its own package"
    assert names["kmod"].version == tree.packages["kmod"].version
    assert names["e2fsprogs"].checksums[0].value == tree.packages["e2fsprogs"].steps[0].sources[0].sha256
    assert str(names["kernel"].license_declared) == "GPL-2.0-only WITH Linux-syscall-note"
    refs = {(r.reference_type, r.locator) for r in names["kernel"].external_references}
    assert ("cpe23Type", tree.packages["kernel"].cpe) in refs
    assert any(kind == "purl" and locator.startswith("pkg:deb/debian/linux@") for kind, locator in refs)
    relationships = {(r.spdx_element_id, r.relationship_type.name) for r in document.relationships}
    assert ("SPDXRef-Package-kernel", "GENERATED_FROM") in relationships
    data = json.loads(outputs[0].read_text())
    assert data["spdxVersion"] == "SPDX-2.3" and data["creationInfo"]["created"] == "2023-11-14T22:13:20Z"


def test_cyclonedx_sbom_validates_names_purls_cpes_licenses_and_is_reproducible(tmp_path: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    tree, outputs = written_twice(write_cyclonedx, ["util-linux", "kmod"], tmp_path)
    assert outputs[0].name == "sbom.cdx.json" and outputs[0].read_bytes() == outputs[1].read_bytes()
    text = outputs[0].read_text()
    assert JsonStrictValidator(SchemaVersion.V1_5).validate_str(text) is None
    data = json.loads(text)
    assert data["specVersion"] == "1.5" and data["metadata"]["timestamp"].startswith("2023-11-14T22:13:20")
    components = {c["name"]: c for c in data["components"]}
    assert set(components) == {"util-linux", "kmod", "kernel"}
    kernel = components["kernel"]
    assert kernel["cpe"] == tree.packages["kernel"].cpe and kernel["purl"].startswith("pkg:deb/debian/linux@")
    assert kernel["licenses"] == [{"expression": "GPL-2.0-only WITH Linux-syscall-note"}]
    [reference] = kernel["externalReferences"]
    assert reference["hashes"] == [{"alg": "SHA-256", "content": tree.packages["kernel"].steps[0].sources[0].sha256}]
    assert "cpe" not in components["kmod"] and components["kmod"]["purl"].startswith("pkg:deb/debian/kmod@")


def test_a_registry_extension_is_in_both_sboms_by_its_pinned_reference(tmp_path: Path) -> None:
    """An extension pulled from a registry has no store key or sources: the SBOMs name it by its
    digest-pinned reference, an OCI purl and the manifest's digest."""
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    from kiln.image.imager import registry_sbom_package
    from kiln.image.oci_extension import Pulled
    from kiln.rootfs.extension import Manifest

    digest = "sha256:" + "d" * 64
    reference = f"oci://127.0.0.1:5000/team/lldpd:1.0.16@{digest}"
    manifest = Manifest("lldpd", "1.0.16", "tests", "LLDP daemon", ">=0.1")
    item = registry_sbom_package(Pulled(reference, manifest, tmp_path, {}))
    assert item.purl == f"pkg:oci/lldpd@sha256:{'d' * 64}?repository_url=127.0.0.1:5000/team/lldpd&tag=1.0.16"
    (tmp_path / "spdx").mkdir()
    subject = SbomSubject("metal", "0.1.0", "ab" * 32, EPOCH, [item])
    spdx = write_spdx(tmp_path / "spdx", subject)
    document = parse_file(str(spdx))
    assert validate_full_spdx_document(document) == []
    [package] = [p for p in document.packages if p.name == "lldpd"]
    assert package.version == "1.0.16" and package.checksums[0].value == "d" * 64
    refs = {(r.reference_type, r.locator) for r in package.external_references}
    assert refs == {("kiln-oci-reference", reference), ("purl", item.purl)}
    assert package.source_info == f"pulled by Kiln (extension) from {reference}"
    (tmp_path / "cdx").mkdir()
    cdx = json.loads(write_cyclonedx(tmp_path / "cdx", subject).read_text())
    [component] = cdx["components"]
    assert component["purl"] == item.purl and component["hashes"] == [{"alg": "SHA-256", "content": "d" * 64}]
    assert {"name": "kiln:oci-reference", "value": reference} in component["properties"]


def test_manifest_lists_every_artifact_with_hash_and_size(tmp_path: Path) -> None:
    (tmp_path / "oci/blobs").mkdir(parents=True)
    (tmp_path / "disk.raw").write_bytes(b"x" * 10)
    (tmp_path / "oci/blobs/b").write_bytes(b"yy")
    path = write_manifest(tmp_path, {"name": "metal"}, {"packages": {"kernel": "k" * 64}})
    data = json.loads(path.read_text())
    assert data["artifacts"] == [
        {"path": "disk.raw", "sha256": hashlib.sha256(b"x" * 10).hexdigest(), "size": 10},
        {"path": "oci/blobs/b", "sha256": hashlib.sha256(b"yy").hexdigest(), "size": 2},
    ]
    assert data["inputs"]["packages"]["kernel"] == "k" * 64
