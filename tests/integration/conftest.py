"""Real builds: a real debootstrap seed, real bubblewrap, real compilers.

The seed takes about a minute to make, so it is made once per machine in
KILN_TEST_SEED (default ~/.cache/kiln-test-seed) and hard-linked into each
test's otherwise empty store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln.build.cache_keys import stage0_key
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/buildgraph"
KILN = [sys.executable, "-m", "kiln.cli"]


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture(scope="session")
def seed_store() -> Path:
    """A store holding only the stage0 of pkgs/stage0.yaml, made once per machine."""
    store = Path(os.environ.get("KILN_TEST_SEED", Path.home() / ".cache/kiln-test-seed"))
    env = {**os.environ, "KILN_CACHE": str(store)}
    result = subprocess.run(
        [*KILN, "bootstrap", "--pkgs", str(FIXTURE / "pkgs")], env=env, text=True, capture_output=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return store


@dataclass
class Project:
    root: Path
    cache: Path

    @property
    def pkgs(self) -> Path:
        return self.root / "pkgs"

    def env(self) -> dict[str, str]:
        return {**os.environ, "KILN_CACHE": str(self.cache), "PYTHONUNBUFFERED": "1"}

    def kiln(self, *args: str, check: bool = False, timeout: float = 900) -> Run:
        result = subprocess.run(
            [*KILN, *args],
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return Run(result.returncode, result.stdout, result.stderr)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*KILN, *args], cwd=self.root, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


def seed_into(seed: Path, cache: Path, pkgs: Path) -> None:
    """Hard-link the seed entry into a fresh store: cheap, and the store is otherwise empty."""
    key = stage0_key(load_tree(pkgs, Platform.parse("linux/amd64")))
    (cache / "store").mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(seed / "store" / key), str(cache / "store" / key)], check=True)


@pytest.fixture
def project(tmp_path: Path, seed_store: Path) -> Iterator[Project]:
    """A copy of the fixture graph and an empty store that has only the seed."""
    root = tmp_path / "project"
    shutil.copytree(FIXTURE, root)
    cache = tmp_path / "cache"
    seed_into(seed_store, cache, root / "pkgs")
    yield Project(root, cache)


@pytest.fixture(scope="session")
def grub_tree(seed_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pkgs/grub-efi-arm64 built with `kiln build` into a store holding only the seed; its output tree.

    Built once per run for every arm64 image test: it only unpacks Debian's .deb.
    """
    base = tmp_path_factory.mktemp("grub-arm64")
    pkgs = base / "project" / "pkgs"
    pkgs.mkdir(parents=True)
    for name in ("vars.yaml", "stage0.yaml"):
        shutil.copy(ROOT / "pkgs" / name, pkgs / name)
    shutil.copytree(ROOT / "pkgs/grub-efi-arm64", pkgs / "grub-efi-arm64")
    cache = base / "cache"
    seed_into(seed_store, cache, pkgs)
    result = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "build", "grub-efi-arm64", "--out", str(base / "out")],
        cwd=pkgs.parent,
        env={**os.environ, "KILN_CACHE": str(cache), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return base / "out" / "grub-efi-arm64"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give integration tests the end-to-end tier's room for a cold store (pyproject's default is 30
    minutes a test). `make test` runs this tier beside the boots, so on a cold machine a fixture may
    wait for a package the other lane is building (the store's build lock), or share the cores with
    the kernel's compile while it makes the test seed; 90 minutes still ends a hung test.
    """
    for item in items:
        if item.nodeid.startswith("tests/integration/") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(5400))
