"""Where Kiln keeps its state on the host."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The store and every other cache: $KILN_CACHE, else ~/.cache/kiln."""
    configured = os.environ.get("KILN_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kiln"
