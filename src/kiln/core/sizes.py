"""Sizes as people write them ("20GiB", "500M", "1.5 GB") and as Kiln prints them: one grammar everywhere."""

from __future__ import annotations

import re
from decimal import Decimal

from kiln.core.errors import InputError

# K/M/G/T and KiB.. are powers of 1024 (as qemu-img and truncate read them), KB/MB.. powers of 1000; any case.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes from "1000", "500M", "10G", "1.5GiB", "20GB"; an InputError (no location) otherwise."""
    match = _SIZE_RE.fullmatch(text)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise InputError(f"invalid size {text!r}: expected a number with an optional unit (K, M, G, T, KiB, MB, ...)")
    return int(Decimal(match.group(1)) * unit)


def format_size(size: int) -> str:
    """ "512 B", "1.5 KiB" .. "3.2 GiB": binary units, one decimal."""
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
