"""An output directory's SLSA provenance (kiln.image.provenance): subjects equal to what SHA256SUMS lists,
the statement valid against the in-toto Statement v1 and SLSA provenance v1 schemas, no secret in it,
the checkout's commit and dirty flag, every package with its store key and sources, and kept out of
the checksums that must be the same for the same inputs."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kiln.build.cache_keys import compute_keys
from kiln.core.gitstate import head
from kiln.image import schematic
from kiln.image.imager import Built
from kiln.image.manifest import write_manifest, write_release_sums
from kiln.image.profile import Profile, apply_schematic, load_profile
from kiln.image.provenance import BUILD_TYPE, STORE_KEY, Origin, Part, origin, write_provenance
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from kiln.signing.release import PROVENANCE, parse_sums, write_sums
from tests.conftest import SHA, write_tree

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "attestation"
SOURCE = "https://example.org/app-1.2.tar.gz"
TREE = {
    "toolchain/pkg.yaml": """
        name: toolchain
        variant: stage0
        version: "12.2"
        steps: []
        finalize: [{from: /out, to: /}]
    """,
    "lib/pkg.yaml": """
        name: lib
        variant: scratch
        version: "0.3"
        steps: []
        finalize: [{from: /out, to: /}]
    """,
    "app/pkg.yaml": f"""
        name: app
        variant: toolchain
        version: "1.2"
        dependencies: [{{stage: lib}}]
        steps:
          - sources: [{{url: {SOURCE}, destination: app.tar.gz, sha256: {SHA}}}]
        finalize: [{{from: /out, to: /}}]
    """,
    "unused/pkg.yaml": """
        name: unused
        variant: scratch
        version: "9"
        steps: []
        finalize: [{from: /out, to: /}]
    """,
}
PEM_KEY = (
    "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIPROFILEKEYBYTESPROFILEKEYBYTES00\n-----END PRIVATE KEY-----\n"
)
SCHEMATIC_API_KEY = "sk-schematic-0123456789abcdef0123456789"
SCHEMATIC = f"""
kernel_args: [console=ttyS0]
machine_config:
  hostname: edge-1
  services:
    - name: agent
      env:
        API_KEY: {SCHEMATIC_API_KEY}
        LOG_LEVEL: info
"""


def write_profile(directory: Path, **extra: Any) -> Path:
    """A profile whose kernel is the tree's `app` package and whose initramfs is a file, or, with a
    customization (a machine config needs an assembled initramfs), made of the tree's `lib`."""
    (directory / "initramfs.zst").write_bytes(b"initramfs")
    assembled = (
        {"init": "lib", "rootfs": ["lib"]} if "customization" in extra else {"initramfs": {"path": "./initramfs.zst"}}
    )
    profile = {
        "name": "edge",
        "platform": "metal",
        "input": {"kernel": {"package": "app"}, **assembled},
        "output": {"kind": "initramfs"},
        **extra,
    }
    path = directory / "edge.yaml"
    path.write_text(json.dumps(profile))
    return path


@pytest.fixture
def part(tmp_path: Path) -> Part:
    pkgs = write_tree(tmp_path / "project", TREE)
    graph = Graph(load_tree(pkgs, Platform.parse("linux/amd64")))
    built = Built(graph, {}, compute_keys(graph), 1700000000, started=1700000100.0, runner="sandbox")
    return Part(load_profile(write_profile(tmp_path)), built)


def output_directory(directory: Path, profile: Profile) -> Path:
    """What make_profile leaves before the provenance: artifacts, manifest.json and the SBOMs."""
    (directory / "boot").mkdir(parents=True)
    (directory / "edge-amd64.raw").write_bytes(b"\0" * 4096 + b"disk")
    (directory / "boot" / "grub.cfg").write_text("menuentry kiln {}\n")
    (directory / "sbom.spdx.json").write_text('{"spdxVersion": "SPDX-2.3"}\n')
    (directory / "sbom.cdx.json").write_text('{"bomFormat": "CycloneDX"}\n')
    write_manifest(directory, {"name": profile.name}, {"source_date_epoch": 1700000000})
    return directory


def written(directory: Path, part: Part, run: Origin | None = None) -> dict[str, Any]:
    path = write_provenance(directory, [part], run or Origin(None, ()))
    assert path.name == PROVENANCE
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def subjects(statement: dict[str, Any]) -> dict[str, str]:
    return {str(entry["name"]): str(entry["digest"]["sha256"]) for entry in statement["subject"]}


def dependency(statement: dict[str, Any], name: str) -> dict[str, Any]:
    every: list[dict[str, Any]] = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    found = [d for d in every if d.get("name") == name]
    assert len(found) == 1, [d.get("name") for d in every]
    return found[0]


def test_subjects_are_what_sha256sums_lists_and_never_the_statement(tmp_path: Path, part: Part) -> None:
    out = tmp_path / "out"
    directory = output_directory(out / "edge", part.profile)
    statement = written(directory, part)
    listed = parse_sums(write_sums(directory).read_bytes())  # the per-directory list a release signs
    assert subjects(statement) == listed
    assert set(listed) == {"edge-amd64.raw", "boot/grub.cfg", "manifest.json", "sbom.spdx.json", "sbom.cdx.json"}
    top = parse_sums(write_release_sums(out).read_bytes())  # the run's list over every profile
    assert {name.removeprefix("edge/"): digest for name, digest in top.items()} == listed
    assert [entry["name"] for entry in statement["subject"]] == sorted(listed, key=str.encode)


def test_the_statement_validates_against_both_schemas(tmp_path: Path, part: Part) -> None:
    statement = written(output_directory(tmp_path / "edge", part.profile), part, origin(part.built))
    for name, instance in (
        ("in-toto-statement-v1.schema.json", statement),
        ("slsa-provenance-v1.schema.json", statement["predicate"]),
    ):
        schema = json.loads((SCHEMAS / name).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(instance)
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["predicate"]["buildDefinition"]["buildType"] == BUILD_TYPE


def test_the_schemas_refuse_what_the_specifications_forbid() -> None:
    """The schemas are not vacuous: a statement without digests, or a provenance without a builder, fails."""
    statement = json.loads((SCHEMAS / "in-toto-statement-v1.schema.json").read_text())
    provenance = json.loads((SCHEMAS / "slsa-provenance-v1.schema.json").read_text())
    bad = [
        (statement, {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "x"}], "predicateType": "x:y"}),
        (statement, {"_type": "https://in-toto.io/Statement/v0.1", "subject": [], "predicateType": "x:y"}),
        (statement, {"_type": "https://in-toto.io/Statement/v1", "subject": [{"digest": {"sha256": "AB"}}]}),
        (provenance, {"buildDefinition": {"buildType": "x:y", "externalParameters": {}}, "runDetails": {}}),
        (provenance, {"buildDefinition": {"externalParameters": {}}, "runDetails": {"builder": {"id": "x:y"}}}),
        (
            provenance,
            {
                "buildDefinition": {"buildType": "x:y", "externalParameters": {}},
                "runDetails": {"builder": {"id": "x:y"}, "metadata": {"startedOn": "2024-01-01 10:00:00"}},
            },
        ),
    ]
    for schema, instance in bad:
        assert not jsonschema.Draft202012Validator(schema).is_valid(instance), instance


def test_packages_with_their_store_keys_versions_sources_toolchain_and_seed(tmp_path: Path, part: Part) -> None:
    statement = written(output_directory(tmp_path / "edge", part.profile), part)
    keys = part.built.keys
    app = dependency(statement, "app")
    assert app["digest"] == {STORE_KEY: keys["app"]}
    assert app["annotations"] == {"kind": "package", "platform": "linux/amd64", "version": "1.2"}
    assert dependency(statement, "lib")["digest"] == {STORE_KEY: keys["lib"]}
    assert dependency(statement, "toolchain")["annotations"]["role"] == "toolchain"
    assert dependency(statement, "app:app.tar.gz") == {
        "name": "app:app.tar.gz",
        "uri": SOURCE,
        "digest": {"sha256": SHA},
    }
    assert dependency(statement, "stage0")["annotations"]["kind"] == "seed"  # toolchain builds on the seed
    names = {d.get("name") for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert "unused" not in names  # only what the output needs
    assert dependency(statement, "profile")["digest"]["sha256"]
    details = statement["predicate"]["runDetails"]
    assert details["builder"]["id"].endswith("/builders/sandbox")
    assert details["metadata"]["startedOn"] == "2023-11-14T22:15:00Z"
    assert details["metadata"]["finishedOn"] >= details["metadata"]["startedOn"]
    internal = statement["predicate"]["buildDefinition"]["internalParameters"]
    assert internal == {
        "sourceDateEpoch": 1700000000,
        "platforms": {"linux/amd64": {"toolchain": "toolchain", "buildPlatform": "linux/amd64"}},
    }


def test_secrets_in_the_profile_schematic_and_variables_never_reach_the_file(tmp_path: Path, part: Part) -> None:
    config = {"hostname": "edge-1", "api": {"key": PEM_KEY, "cert": "public"}}
    custom = {"machine_config": config, "kernel_args": ["registry=https://bot:hunter2hunter2@registry.example/"]}
    profile = load_profile(write_profile(tmp_path, customization=custom))
    (tmp_path / "schematic.yaml").write_text(SCHEMATIC)
    customised = apply_schematic(profile, schematic.load(tmp_path / "schematic.yaml"))
    part.built.graph.tree.overrides["registry_token"] = "tok-variable-secret-98765"
    secret_part = replace(part, profile=customised)
    directory = output_directory(tmp_path / "edge", customised)
    path = write_provenance(directory, [secret_part], Origin(None, ()))
    data = path.read_bytes()
    for secret in (PEM_KEY, "PROFILEKEYBYTES", SCHEMATIC_API_KEY, "hunter2hunter2", "tok-variable-secret-98765"):
        assert secret.encode() not in data, secret
    given = json.loads(data)["predicate"]["buildDefinition"]["externalParameters"]
    assert given["profile"]["customization"]["machine_config"]["api"] == {"key": "[redacted]", "cert": "public"}
    assert given["profile"]["customization"]["kernel_args"] == ["[redacted]"]
    assert given["schematic"]["fields"]["machine_config"]["services"][0]["env"] == {
        "API_KEY": "[redacted]",
        "LOG_LEVEL": "info",
    }
    assert customised.schematic is not None and given["schematic"]["id"] == customised.schematic.id
    assert given["variables"]["registry_token"] == "[redacted]"
    assert given["profile"]["customization"]["machine_config"]["hostname"] == "edge-1"  # the rest as given


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def test_the_checkout_commit_and_whether_it_was_dirty(tmp_path: Path, part: Part) -> None:
    project = part.built.graph.tree.project_root
    assert head(project) is None  # not a checkout yet: no project entry
    statement = written(output_directory(tmp_path / "a", part.profile), part, origin(part.built))
    names = [d.get("name") for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]]
    assert "project" not in names and "package-tree:pkgs" in names
    git(project, "init", "-q")
    git(project, "add", "pkgs")
    git(project, "commit", "-q", "-m", "tree")
    commit = subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    clean = written(output_directory(tmp_path / "b", part.profile), part, origin(part.built))
    assert dependency(clean, "project") == {
        "name": "project",
        "digest": {"gitCommit": commit.strip()},
        "annotations": {"dirty": False},
    }
    (project / "pkgs" / "lib" / "notes.txt").write_text("an untracked file changes the tree too\n")
    dirty = written(output_directory(tmp_path / "c", part.profile), part, origin(part.built))
    assert dependency(dirty, "project")["annotations"] == {"dirty": True}
    assert dependency(dirty, "package-tree:pkgs")["digest"] != dependency(clean, "package-tree:pkgs")["digest"]


def test_the_run_times_change_the_statement_but_never_the_checksums(tmp_path: Path, part: Part) -> None:
    """Byte-identical outputs: two runs of the same inputs at other times give the same SHA256SUMS."""
    sums, statements = [], []
    for run, started in (("one", 1700000100.0), ("two", 1800000000.0)):
        out = tmp_path / run
        directory = output_directory(out / "edge", part.profile)
        statements.append(written(directory, replace(part, built=replace(part.built, started=started))))
        sums.append((write_release_sums(out).read_bytes(), write_sums(directory).read_bytes()))
        assert PROVENANCE.encode() not in sums[-1][0] + sums[-1][1]
    assert sums[0] == sums[1]
    assert statements[0]["subject"] == statements[1]["subject"]
    assert statements[0]["predicate"]["runDetails"] != statements[1]["predicate"]["runDetails"]
