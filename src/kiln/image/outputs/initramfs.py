"""The initramfs output: the assembled initramfs.zst (init, rootfs.sqsh, extension layers) as it is."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.image.assets import BootAssets

if TYPE_CHECKING:
    from kiln.image.profile import Profile


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    shutil.copyfile(assets.initramfs, dest / profile.artifact_name)
