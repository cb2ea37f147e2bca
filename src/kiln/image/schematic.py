"""Schematics: how an image is customised, in one file, named by the hash of its canonical form.

A schematic lists extensions (packages of the tree or `oci://` references, in layer order),
kernel arguments added after the profile's, a machine config embedded in the rootfs (in place of
the profile's), and per-platform overrides of the last two. Its ID is the sha256 of its canonical
JSON (keys sorted, no whitespace, empty fields left out), so the same schematic written with
other key orders, comments or spacing has the same ID, and a factory can cache images by it.

`kiln image PROFILE --schematic FILE` applies it to each profile (kiln.image.profile.apply_schematic:
profiles know schematics, schematics know no profile): the ID goes in the manifest, both SBOMs and
the rootfs (`/usr/lib/kiln/schematic.json`, which machined reports in /v1/status), so a running
machine tells which schematic it was made from, and an installer made with it carries its
extensions to every machine it installs or upgrades.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, Location
from kiln.core.yamlfile import parse_text, read_text_file

MAX_BYTES = 64 << 10  # a schematic names things; a machine config is a few KiB
ROOTFS_PATH = "usr/lib/kiln/schematic.json"


@dataclass(frozen=True)
class Schematic:
    """A validated schematic: its canonical fields and their ID."""

    fields: dict[str, Any]

    @property
    def canonical(self) -> bytes:
        return json.dumps(self.fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    @property
    def id(self) -> str:
        return hashlib.sha256(self.canonical).hexdigest()

    @property
    def extensions(self) -> tuple[str, ...]:
        return tuple(self.fields.get("extensions", ()))

    def kernel_args(self, platform: str) -> tuple[str, ...]:
        own = self.fields.get("kernel_args", [])
        return (*own, *self.fields.get("platforms", {}).get(platform, {}).get("kernel_args", []))

    def machine_config(self, platform: str) -> dict[str, Any] | None:
        override = self.fields.get("platforms", {}).get(platform, {}).get("machine_config")
        return override if override is not None else self.fields.get("machine_config")

    def rootfs_document(self) -> str:
        """What the rootfs holds: the ID and the schematic itself, for machined and for people."""
        return json.dumps({"id": self.id, "schematic": self.fields}, indent=2, sort_keys=True) + "\n"


def parse(text: str, where: str) -> Schematic:
    """A schematic from YAML (or JSON) text; every problem an InputError at `where`:line."""
    if len(text.encode()) > MAX_BYTES:
        raise InputError(f"a schematic is at most {MAX_BYTES} bytes", Location(where, 1))
    positioned = parse_text(text, where)
    data = {} if positioned.value is None else positioned.value
    if not isinstance(data, dict):
        raise InputError("a schematic must be a mapping", Location(where, 1))
    problems = schema.validate(data, "schematic.schema.json", "kiln.image")
    if problems:
        raise InputErrors([InputError(msg, Location(where, positioned.line(path))) for path, msg in problems])
    return Schematic(_canonical_fields(data))


def load(file: Path) -> Schematic:
    return parse(read_text_file(file, MAX_BYTES, "schematic"), str(file))


def _canonical_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The fields that change an image, empty ones dropped: `kernel_args: []` names the same image as none."""
    fields = {key: value for key, value in data.items() if value not in (None, [], {})}
    platforms = {
        name: {key: value for key, value in override.items() if value not in (None, [])}
        for name, override in fields.get("platforms", {}).items()
    }
    platforms = {name: override for name, override in platforms.items() if override}
    return fields | {"platforms": platforms} if platforms else {k: v for k, v in fields.items() if k != "platforms"}
