"""The image output: the raw GPT disk (kiln.image.outputs.disk) in its format (raw, or qcow2, vhd,
vmdk or ova by kiln.image.outputs.formats), compressed as out_format asks."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.image.assets import BootAssets
from kiln.image.compress import compress
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.formats import convert

if TYPE_CHECKING:
    from kiln.image.profile import Profile

GCP_MEMBER = "disk.raw"  # the name of the disk inside a .tar.gz (GCP takes no other)


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    """The disk, made beside `dest` and converted or compressed into it."""
    with tempfile.TemporaryDirectory(prefix="disk-", dir=dest.parent) as tmp:
        raw = build_raw(assets, Path(tmp) / GCP_MEMBER, profile.disk_size)
        final = dest / profile.file_name
        artifact = dest / profile.artifact_name
        if profile.disk_format != "raw":
            convert(raw, profile.disk_format, final, assets)
            compress(final, profile.out_format, assets.epoch, artifact)
        else:  # compressed from its temporary name: a .tar.gz holds it as disk.raw, as GCP wants
            compress(raw, profile.out_format, assets.epoch, artifact)
