"""Schematics: one ID per customisation whatever the spelling, errors at file:line, applied to profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.core.errors import InputError, InputErrors
from kiln.image.profile import CONFIG_PATH, apply_schematic, load_profile
from kiln.image.schematic import MAX_BYTES, load, parse

ROOT = Path(__file__).resolve().parents[2]
FULL = """\
# a comment changes nothing
extensions: [lldpd, "oci://127.0.0.1:5000/kiln/acpi-call:1.2.2"]
kernel_args: [quiet, "kiln.hostname=lab"]
machine_config:
  hostname: lab
  network: {dhcp: true}
platforms:
  aws: {kernel_args: [nvme_core.io_timeout=4294967295]}
  metal: {}
"""
SAME_REORDERED = json.dumps(
    {
        "platforms": {"metal": {"kernel_args": []}, "aws": {"kernel_args": ["nvme_core.io_timeout=4294967295"]}},
        "machine_config": {"network": {"dhcp": True}, "hostname": "lab"},
        "kernel_args": ["quiet", "kiln.hostname=lab"],
        "extensions": ["lldpd", "oci://127.0.0.1:5000/kiln/acpi-call:1.2.2"],
    }
)


def test_the_id_is_the_same_for_any_key_order_comment_or_empty_field() -> None:
    first, second = parse(FULL, "a.yaml"), parse(SAME_REORDERED, "b.json")
    assert first.id == second.id and len(first.id) == 64
    assert parse("", "e.yaml").id == parse("kernel_args: []\nplatforms: {}\n", "f.yaml").id
    # and it is the sha256 of the canonical JSON, which a factory client could compute itself
    import hashlib

    canonical = json.dumps(first.fields, sort_keys=True, separators=(",", ":")).encode()
    assert first.id == hashlib.sha256(canonical).hexdigest()


@pytest.mark.parametrize(
    "change",
    [
        "extensions: [oci://127.0.0.1:5000/kiln/acpi-call:1.2.2, lldpd]",  # layer order matters
        "kernel_args: [kiln.hostname=lab, quiet]",  # so does argument order
        "machine_config: {hostname: lab2}",
    ],
)
def test_any_change_that_changes_the_image_changes_the_id(change: str) -> None:
    key = change.split(":", 1)[0]
    kept = [line for line in FULL.splitlines() if not line.startswith(key)]
    if key == "machine_config":
        kept = [line for line in kept if not line.startswith("  hostname") and not line.startswith("  network")]
    assert parse("\n".join([*kept, change]), "c.yaml").id != parse(FULL, "a.yaml").id


def test_every_problem_is_reported_at_its_line() -> None:
    text = "extensions: [Bad]\nkernel_args: ['a b']\nplatforms:\n  AWS: {}\ncolour: blue\n"
    with pytest.raises(InputErrors) as caught:
        parse(text, "s.yaml")
    assert [str(e) for e in caught.value.errors] == [
        "s.yaml:1: 'Bad' is neither a package name nor an extension reference (oci://HOST/REPO:TAG)",
        "s.yaml:2: kernel argument 'a b' must be printable ASCII without spaces",
        "s.yaml:3: platform 'AWS' must be lower-case letters, digits and '-'",
        "s.yaml:5: unknown key 'colour'",
    ]
    with pytest.raises(InputError, match=r"s\.yaml:1: a schematic must be a mapping"):
        parse("- lldpd\n", "s.yaml")
    with pytest.raises(InputError, match=f"at most {MAX_BYTES} bytes"):
        parse("kernel_args: [" + "x," * MAX_BYTES + "]", "big.yaml")


def test_applied_to_a_profile(tmp_path: Path) -> None:
    (tmp_path / "aws.yaml").write_text(
        "platform: aws\ninput: {extensions: [lldpd]}\ncustomization: {machine_config: {hostname: own}}\n"
        "output: {kind: image}\n"
    )
    (tmp_path / "s.yaml").write_text(FULL)
    schematic = load(tmp_path / "s.yaml")
    profile = apply_schematic(load_profile(tmp_path / "aws.yaml"), schematic)
    assert profile.extensions == ("lldpd", "oci://127.0.0.1:5000/kiln/acpi-call:1.2.2")  # lldpd once
    assert profile.cmdline().split() == [
        "console=ttyS0",
        "quiet",
        "kiln.hostname=lab",
        "nvme_core.io_timeout=4294967295",  # aws's own override
        "kiln.platform=aws",
        f"kiln.config={CONFIG_PATH}",
    ]
    assert profile.machine_config == {"hostname": "lab", "network": {"dhcp": True}}
    assert profile.schematic == schematic
    assert json.loads(schematic.rootfs_document())["id"] == schematic.id


def test_the_cli_prints_the_id_and_refuses_bad_input(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(FULL)

    def kiln(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "kiln.cli", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=tmp_path, check=False)

    assert kiln("schematic", "id", "s.yaml").stdout.strip() == parse(FULL, "x").id
    assert json.loads(kiln("schematic", "id", "-", "--json", stdin=SAME_REORDERED).stdout)["id"] == parse(FULL, "x").id
    bad = kiln("schematic", "id", "-", stdin="extensions: lldpd\n")
    assert bad.returncode == 2 and bad.stderr.startswith("<stdin>:1: ") and "Traceback" not in bad.stderr
    without = kiln("image", "--schematic", "s.yaml", "--pkgs", str(ROOT / "pkgs"))
    assert without.returncode == 2 and "--schematic customises profiles" in without.stderr
