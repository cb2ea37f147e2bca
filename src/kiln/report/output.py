"""Where a picture goes: a file, or stdout (never a PNG to a terminal); its format from its name."""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.core.errors import InputError

FORMATS = ("svg", "png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def format_for(path: Path, explicit: str | None = None) -> str:
    """The picture format: explicit, else the file's suffix (.svg or .png)."""
    fmt = explicit or path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise InputError(f"cannot tell the picture format of {path}: name it .svg or .png, or pass --format")
    return fmt


def write(data: bytes, out: Path | None, fmt: str) -> None:
    """Write a picture to `out`, or to stdout when out is None or '-'; a PNG is never written to a terminal."""
    if out is not None and str(out) != "-":
        out.write_bytes(data)
        return
    if fmt == "png" and sys.stdout.isatty():
        raise InputError("refusing to write a PNG to the terminal: pass -o FILE.png or redirect stdout")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
