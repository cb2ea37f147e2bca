"""Nothing built goes into git, and what a developer builds in a local source never reaches a key.

A binary in the repository is a second, unreviewable copy of something a command makes; one that sits
in a local source's directory also changes that package's key and every image after it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# what builds leave: object files, libraries, Python bytecode, disk and filesystem images
BUILT_SUFFIXES = (".o", ".a", ".so", ".ko", ".pyc", ".test", ".iso", ".qcow2", ".vhd", ".vmdk", ".ova", ".sqsh",
                  ".squashfs", ".efi", ".img", ".raw", ".cpio", ".zst")  # fmt: skip
MAGICS = {
    b"\x7fELF": "an ELF binary",
    b"MZ": "a PE/EFI binary",
    b"hsqs": "a squashfs image",
    b"QFI\xfb": "a qcow2 image",
}


def tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    return [name for name in listed.stdout.decode().split("\0") if name]


def built(name: str) -> str | None:
    """Why the tracked file `name` looks like a build output, or None."""
    if name.endswith(BUILT_SUFFIXES):
        return "its name is a build output's"
    path = ROOT / name
    if path.is_symlink() or not path.is_file():
        return None
    with path.open("rb") as handle:
        head = handle.read(4)
    return next((what for magic, what in MAGICS.items() if head.startswith(magic)), None)


def test_no_tracked_file_is_a_build_output() -> None:
    found = [f"{name}: {why}" for name in tracked() if (why := built(name))]
    assert not found, "built files are tracked (remove them, and ignore them in .gitignore):\n" + "\n".join(found)


def test_the_check_knows_a_binary() -> None:
    """The check itself: a real ELF (this interpreter's) is named as one."""
    with Path(sys.executable).resolve().open("rb") as handle:
        assert handle.read(4) == b"\x7fELF"
    assert built("runtime/machined/machined.o") == "its name is a build output's"


def test_what_git_ignores_in_machined_stays_out_of_its_key() -> None:
    """machined's local source excludes what a `go build` or `go test -c` leaves in runtime/machined, and git
    ignores the same, so neither a commit nor a key ever holds it."""
    tracked()  # skips outside a git checkout
    spec = yaml.safe_load((ROOT / "pkgs/machined/pkg.yaml").read_text())
    source = next(s for step in spec["steps"] for s in step.get("sources", []) if s.get("path") == "runtime/machined")
    assert source["exclude"] == ["machined", "*.test"]
    for leftover in (
        "runtime/machined/machined",
        "runtime/machined/machined.test",
        "runtime/machined/internal/oci/oci.test",
    ):
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", leftover], cwd=ROOT)
        assert ignored.returncode == 0, f"git does not ignore {leftover}"
