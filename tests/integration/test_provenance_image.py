"""`kiln image` writes an SLSA provenance into every output directory, and `kiln verify` checks it.

The profile is test_image_stress.py's initramfs one (a prebuilt kernel and initramfs: no package
is built, so this measures the imager and the provenance, not a build), customised with a
schematic whose machine config holds an API key and signed with a release key made here. Run
twice: the checksums and their signatures are the same bytes, the provenance valid against the
in-toto Statement v1 and SLSA provenance v1 schemas, its subjects what SHA256SUMS lists, the key
nowhere in it, and one changed byte of the artifact fails `kiln verify` by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kiln.signing.release import ENVELOPE, PROVENANCE, SIGNATURE, SUMS, parse_sums
from tests.integration.test_image_stress import write_inputs
from tests.unit.test_release_signing import make_keys

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]
SCHEMAS = ROOT / "tests" / "data" / "attestation"
PROFILE = "s-initramfs"
API_KEY = "kiln-test-api-key-3f9a1c0d7e5b2a4c6e8f"
SCHEMATIC = f"""
kernel_args: [kiln.debug=1]
machine_config:
  hostname: provenance-test
  services:
    - name: agent
      env: {{API_KEY: {API_KEY}}}
"""


def kiln(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([*KILN, *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The profile written twice into two output directories, signed; and the key directory."""
    base = tmp_path_factory.mktemp("provenance")
    profile = next(p for p in write_inputs(base / "inputs") if p.stem == PROFILE)
    (base / "schematic.yaml").write_text(SCHEMATIC)
    keys = make_keys(base / "keys")
    outs = []
    for run in ("one", "two"):
        args = [str(profile), "--schematic", str(base / "schematic.yaml"), "--keys", str(keys.root)]
        result = kiln("image", *args, "--out", str(base / run), cache=base / "cache")
        assert result.returncode == 0, result.stdout + result.stderr
        outs.append(base / run)
    return outs[0], outs[1], keys.release_public


def statement(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / PROFILE / PROVENANCE).read_text())
    return data


def test_the_provenance_validates_and_its_subjects_are_what_sha256sums_lists(runs: tuple[Path, Path, Path]) -> None:
    out = runs[0]
    document = statement(out)
    for name, instance in (
        ("in-toto-statement-v1.schema.json", document),
        ("slsa-provenance-v1.schema.json", document["predicate"]),
    ):
        jsonschema.Draft202012Validator(json.loads((SCHEMAS / name).read_text())).validate(instance)
    subjects = {s["name"]: s["digest"]["sha256"] for s in document["subject"]}
    top = parse_sums((out / SUMS).read_bytes())
    assert subjects == {name.removeprefix(f"{PROFILE}/"): digest for name, digest in top.items()}
    assert subjects == parse_sums((out / PROFILE / SUMS).read_bytes())
    assert {"initramfs-amd64.zst", "manifest.json", "sbom.spdx.json", "sbom.cdx.json"} == set(subjects)


def test_the_provenance_says_what_made_the_output(runs: tuple[Path, Path, Path]) -> None:
    document = statement(runs[0])
    definition = document["predicate"]["buildDefinition"]
    given = definition["externalParameters"]
    assert given["profile"]["name"] == PROFILE and given["platforms"] == ["linux/amd64"]
    assert given["schematic"]["fields"]["kernel_args"] == ["kiln.debug=1"]
    manifest = json.loads((runs[0] / PROFILE / "manifest.json").read_text())
    assert given["schematic"]["id"] == manifest["profile"]["schematic"]
    names = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert names["profile"]["digest"]["sha256"] == manifest["inputs"]["profile_sha256"]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if commit.returncode == 0:  # a checkout (CI's is a clone): the commit and whether it was dirty
        assert names["project"]["digest"] == {"gitCommit": commit.stdout.strip()}
        assert isinstance(names["project"]["annotations"]["dirty"], bool)
    assert "package-tree:pkgs" in names
    details = document["predicate"]["runDetails"]
    assert details["builder"]["id"].endswith("/builders/sandbox")
    assert details["metadata"]["startedOn"] <= details["metadata"]["finishedOn"]


def test_the_schematics_api_key_is_in_no_file(runs: tuple[Path, Path, Path]) -> None:
    for out in runs[:2]:
        for path in (p for p in out.rglob("*") if p.is_file()):
            assert API_KEY.encode() not in path.read_bytes(), path
    env = statement(runs[0])["predicate"]["buildDefinition"]["externalParameters"]["schematic"]["fields"]
    assert env["machine_config"]["services"][0]["env"] == {"API_KEY": "[redacted]"}


def test_checksums_and_signatures_are_the_same_bytes_in_both_runs(runs: tuple[Path, Path, Path]) -> None:
    one, two, _ = runs
    assert (one / SUMS).read_bytes() == (two / SUMS).read_bytes()
    for name in (SUMS, SIGNATURE, "initramfs-amd64.zst", "manifest.json", "sbom.spdx.json", "sbom.cdx.json"):
        assert (one / PROFILE / name).read_bytes() == (two / PROFILE / name).read_bytes(), name
    for out in (one, two):
        assert PROVENANCE not in (out / SUMS).read_text() + (out / PROFILE / SUMS).read_text()
        assert (out / PROFILE / ENVELOPE).is_file()


def test_kiln_verify_accepts_the_release_and_names_a_changed_artifact(
    runs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    one, _, public = runs
    good = kiln("verify", str(one / PROFILE), "--key", str(public), cache=tmp_path / "cache")
    assert good.returncode == 0, good.stderr
    assert "verified the provenance of" in good.stdout and "4 subjects" in good.stdout
    copy = tmp_path / PROFILE
    subprocess.run(["cp", "-a", str(one / PROFILE), str(copy)], check=True)
    artifact = copy / "initramfs-amd64.zst"
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x01
    artifact.write_bytes(bytes(data))
    bad = kiln("verify", str(copy), "--key", str(public), cache=tmp_path / "cache")
    assert bad.returncode == 1, bad
    assert "Traceback" not in bad.stderr
    assert "initramfs-amd64.zst: changed since the provenance was signed" in bad.stderr
    assert "initramfs-amd64.zst: checksum differs" in bad.stderr
