"""The order a release's profiles start in: the longest first, so none starts last while a worker idles."""

from __future__ import annotations

from kiln.image.profile import Profile

# Rough seconds per GiB of disk on this 2-core machine, for the order profiles start in: the
# installer gzips its disk in-process, .gz and .xz read all of it, a fixed vhd is 1 GiB to write and
# hash, and a raw disk is hashed whole for its manifest.
_DISK_COST = {".gz": 8.0, ".tar.gz": 2.0, ".xz": 6.0, ".zst": 1.5, "raw": 3.0}
_FORMAT_COST = {"vhd": 4.0, "ova": 1.5, "vmdk": 1.5, "qcow2": 0.7}


def expected_cost(profile: Profile) -> float:
    """How long a profile's output takes, roughly (only the order matters)."""
    if profile.kind == "installer":
        return 10.0
    if profile.kind != "image":
        return 0.5
    if profile.disk_format != "raw":
        return _FORMAT_COST.get(profile.disk_format, 1.0)
    return _DISK_COST.get(profile.out_format, 1.0)
