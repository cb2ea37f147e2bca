"""Extensions from registries: references, the manifest read from a pulled description, layer naming.

Hermetic: nothing here talks to a registry (tests/integration/test_extension_registry.py pushes
and pulls through a real one; tests/e2e/test_extensions.py compares images made both ways)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import InputError
from kiln.core.registry import RegistryError
from kiln.image.oci_extension import (
    ARTIFACT_TYPE,
    CONFIG_TYPE,
    TREE_TYPE,
    Pulled,
    Reference,
    _descriptors,
    extension_layers,
    is_oci,
    parse_push_target,
)
from kiln.rootfs.extension import Manifest, manifest_from_json

DIGEST = "sha256:" + "ab" * 32
MANIFEST = {"name": "acpi-call", "version": "1.2.2", "author": "me", "compatibility": ">=0.1", "modules": ["acpi_call"]}


def test_references_name_a_tag_a_digest_or_both() -> None:
    tagged = Reference.parse("oci://127.0.0.1:5000/kiln/acpi-call:1.2.2")
    assert (str(tagged.repository), tagged.tag, tagged.digest) == ("127.0.0.1:5000/kiln/acpi-call", "1.2.2", None)
    assert tagged.pinned(DIGEST) == f"oci://127.0.0.1:5000/kiln/acpi-call:1.2.2@{DIGEST}"
    pinned = Reference.parse(f"oci://registry.example/ext@{DIGEST}")
    assert (pinned.tag, pinned.digest, pinned.pinned(DIGEST)) == (None, DIGEST, f"oci://registry.example/ext@{DIGEST}")
    assert Reference.parse(f"oci://r.example/ext:v1@{DIGEST}").digest == DIGEST
    assert is_oci("oci://x/y:1") and not is_oci("acpi-call")


@pytest.mark.parametrize(
    "text",
    [
        "oci://127.0.0.1:5000/ext",  # neither tag nor digest
        "oci://r.example/Ext:1",  # upper-case repository
        "oci://r.example/ext:1@sha256:abc",  # short digest
        "oci://r.example/ext:-bad",
        "oci://r.example/ext:1\n",
        "oci://r.example/../ext:1",
        "oci:///ext:1",
    ],
)
def test_bad_references_are_input_errors(text: str) -> None:
    with pytest.raises(InputError, match="invalid extension reference"):
        Reference.parse(text)


def test_push_targets_need_a_tag() -> None:
    ref, tag = parse_push_target("localhost:5000/kiln/lldpd:1.0.16")
    assert (str(ref), tag) == ("localhost:5000/kiln/lldpd", "1.0.16")
    assert parse_push_target("oci://localhost:5000/x:1")[1] == "1"
    with pytest.raises(InputError, match="expected HOST"):
        parse_push_target("localhost:5000/kiln/lldpd")


def test_a_pulled_manifest_round_trips() -> None:
    manifest = Manifest("lldpd", "1.0.16", "me", "LLDP", ">=0.1,<0.2", ">=6.1,<6.2", ("a", "b"))
    assert manifest_from_json(json.loads(manifest.to_json()), "x") == manifest
    assert manifest_from_json(MANIFEST, "x").description == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "../etc"}, "name '../etc' is not a package name"),
        ({"name": "a/b"}, "is not a package name"),
        ({"name": 7}, "field 'name' is not a line of text"),
        ({"author": "x\ny"}, "field 'author' is not a line of text"),
        ({"version": "v" * 5000}, "field 'version' is not a line of text"),
        ({"compatibility": "soon"}, "field 'compatibility' is not a version range"),
        ({"kernel": ">=six"}, "field 'kernel' is not a version range"),
        ({"modules": ["ok", "../evil"]}, "field 'modules' is not a list of module names"),
        ({"modules": "acpi_call"}, "field 'modules' is not a list of module names"),
        ({"extra": 1}, "has unknown fields: extra"),
    ],
)
def test_a_hostile_manifest_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        manifest_from_json(MANIFEST | change, "oci://r/x:1")
    with pytest.raises(InputError, match="is not a JSON object"):
        manifest_from_json(["acpi-call"], "oci://r/x:1")


def manifest_body(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "schemaVersion": 2,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": DIGEST, "size": 300},
        "layers": [{"mediaType": TREE_TYPE, "digest": DIGEST, "size": 1000}],
    }
    return json.dumps(body | changes).encode()


def test_only_kiln_extension_manifests_are_taken() -> None:
    config, layer = _descriptors(manifest_body(), "r")
    assert (config["mediaType"], layer["mediaType"]) == (CONFIG_TYPE, TREE_TYPE)
    refused = [
        (manifest_body(artifactType="application/vnd.kiln.store-entry.v1"), "artifact type"),
        (manifest_body(layers=[]), "not a manifest with one layer"),
        (manifest_body(layers=[{"mediaType": "application/x-tar", "digest": DIGEST, "size": 1}]), "layer type"),
        (manifest_body(config={"mediaType": CONFIG_TYPE, "digest": DIGEST, "size": 1 << 30}), "larger than"),
        (b"not json", "not a manifest"),
    ]
    for body, message in refused:
        with pytest.raises(RegistryError, match=message):
            _descriptors(body, "r")


def test_pulled_layers_take_their_manifest_name_and_keep_the_order(tmp_path: Path) -> None:
    pulled = Pulled(f"oci://r/acpi:1@{DIGEST}", manifest_from_json(MANIFEST, "r"), tmp_path / "tree", {})
    trees: dict[str, Path] = {"kernel": tmp_path / "k"}
    local = Manifest("lldpd", "1", "me", "", ">=0.1")
    layers = extension_layers(["lldpd", "oci://r/acpi:1"], {"oci://r/acpi:1": pulled}, trees, lambda _: local)
    assert [name for _, name in layers] == ["lldpd", "acpi-call"]
    assert trees["acpi-call"] == tmp_path / "tree"
    with pytest.raises(InputError, match="is named acpi-call, as a package of this image already is"):
        extension_layers(["acpi-call", "oci://r/acpi:1"], {"oci://r/acpi:1": pulled}, {}, lambda _: local)
