"""The kernel output: the profile's vmlinuz as it is, for a boot loader or a hypervisor of one's own."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.image.assets import BootAssets

if TYPE_CHECKING:
    from kiln.image.profile import Profile


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    shutil.copyfile(assets.vmlinuz, dest / profile.artifact_name)
