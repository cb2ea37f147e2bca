"""End-to-end: the real image, built through the graph, booted in QEMU (TCG).

The kernel + initramfs come from `kiln image --kind kernel,initramfs` on the shipped pkgs/
tree, built once per session into the default store (KILN_CACHE or ~/.cache/kiln), so a
machine that already ran `make image` reuses its packages. On a cold machine this builds the
seed, toolchain-seed, the kernel, Go and the userland: about 35 minutes on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]


def kiln(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """Run the real CLI from the project root; fail the test with its output if it fails."""
    result = subprocess.run(
        [*KILN, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"kiln {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vmlinuz + initramfs.zst of the base image (no extensions)."""
    out = tmp_path_factory.mktemp("image")
    kiln("image", "--kind", "kernel,initramfs", "--out", str(out), timeout=5400)
    return out


PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))


@pytest.fixture(scope="session")
def every_profile(tmp_path_factory: pytest.TempPathFactory, image_dir: Path) -> Path:
    """Every shipped profile's outputs, one directory each (image_dir: the packages are built)."""
    out = tmp_path_factory.mktemp("profiles")
    kiln("image", *PROFILES, "--out", str(out), timeout=3600)
    return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give end-to-end tests room for the cold image build (whichever test first needs it pays for it).

    The default per-test timeout (pyproject.toml, 30 minutes) fits every boot, but not building
    the kernel and Go from an empty store on 2 cores, which the first e2e test's fixture does.
    """
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(5400))
