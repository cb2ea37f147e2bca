"""A KILNCFG config drive for end-to-end boots: what a user burns or plugs in to hand a machine its config."""

from __future__ import annotations

import subprocess
from pathlib import Path


def config_drive(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    """A KILNCFG disc (ISO 9660 with Rock Ridge, so a planted link stays a link) holding `files` and
    the symbolic links `links` (name -> target)."""
    tree = path.with_suffix(".d")
    tree.mkdir()
    for name, data in files.items():
        (tree / name).write_bytes(data)
    for name, target in (links or {}).items():
        (tree / name).symlink_to(target)
    subprocess.run(
        ["xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", "KILNCFG", "-o", str(path), str(tree)], check=True
    )
    return path
