"""Host canaries for hostile-tree tests: a file and a directory outside the work dir that a planted link
points at, and a check that Kiln left both exactly as they were (bytes, mode, times, listing)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _state(path: Path) -> tuple[object, ...]:
    info = path.lstat()
    listing = sorted(os.listdir(path)) if path.is_dir() else path.read_bytes()
    return (info.st_mode, info.st_mtime_ns, info.st_ino, listing)


@dataclass
class Canary:
    """`file` and `dir` live in `root` (outside the tree under test); `check` fails on any change."""

    root: Path
    seen: dict[Path, tuple[object, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True)
        (self.dir / "kept").write_bytes(b"host directory content\n")
        self.file.write_bytes(b"host file content\n")
        os.chmod(self.file, 0o600)
        os.utime(self.file, ns=(1_000_000_000, 1_000_000_000))
        self.snapshot()

    def snapshot(self) -> None:
        """What `check` compares against: everything in `root` now (after a test adds its own bait)."""
        self.seen = {p: _state(p) for p in sorted(self.root.rglob("*"))}

    @property
    def file(self) -> Path:
        return self.root / "host-file"

    @property
    def dir(self) -> Path:
        return self.root / "host-dir"

    def check(self) -> None:
        for path, state in self.seen.items():
            assert _state(path) == state, f"{path} outside the tree was changed"
