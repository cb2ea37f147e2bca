"""A build's scratch directories on the host (kiln.build.scratch): in /dev/shm's tmpfs when it can,
never through something planted there, gone after the build, and a killed build's taken by the next."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.build.scratch import held, memory_base, remove_dead
from kiln.build.store.store import Store

SHM = Path("/dev/shm")
needs_shm = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A directory of our own on /dev/shm's tmpfs, standing in for /dev/shm itself."""
    if not SHM.is_dir():
        pytest.skip("no /dev/shm")
    path = SHM / f"kiln-test-{tmp_path.name}-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "cache")


def test_a_build_gets_empty_directories_in_memory_that_go_with_it(store: Store, shm: Path) -> None:
    with store.fresh_staging("a" * 64) as staging:
        with held(store, staging, ["/tmp/build/linux", "/tmp/x"], shm) as dirs:
            assert set(dirs) == {"/tmp/build/linux", "/tmp/x"}
            for directory in dirs.values():
                assert directory.is_dir() and not any(directory.iterdir())
                assert directory.is_relative_to(shm)  # a tmpfs with room: in memory
            (dirs["/tmp/x"] / "file").write_text("x")
        assert not any(path.exists() for path in dirs.values())
    assert list(shm.iterdir()) == []  # the store's memory directory went with its last build


def test_without_a_tmpfs_they_live_in_the_staging_dir(store: Store, tmp_path: Path) -> None:
    disk = tmp_path / "not-a-tmpfs"
    disk.mkdir()
    assert memory_base(store, disk) is None
    with store.fresh_staging("b" * 64) as staging, held(store, staging, ["/tmp/src"], disk) as dirs:
        assert dirs["/tmp/src"].parent == staging / "scratch"


def test_a_planted_link_or_foreign_directory_in_shm_is_not_used(store: Store, shm: Path, tmp_path: Path) -> None:
    """/dev/shm is writable by everyone: a name taken there by someone else means the disk instead."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    base = memory_base(store, shm)
    assert base is not None
    base.rmdir()
    base.symlink_to(target)
    assert memory_base(store, shm) is None
    with store.fresh_staging("c" * 64) as staging, held(store, staging, ["/tmp/src"], shm) as dirs:
        assert dirs["/tmp/src"].is_relative_to(staging)
    assert list(target.iterdir()) == []  # nothing made or removed through the link
    base.unlink()
    base.mkdir(mode=0o755)  # open to others: not ours to trust
    assert memory_base(store, shm) is None


def test_what_a_killed_build_left_goes_and_a_live_builds_stays(store: Store, shm: Path) -> None:
    base = memory_base(store, shm)
    assert base is not None
    dead = base / f"{'d' * 64}.4242.0123456789abcdef"  # a staging name nobody holds the lock of
    (dead / "linux").mkdir(parents=True)
    (dead / "linux" / "Makefile").write_text("left behind\n")
    odd = base / "not-a-staging-name"
    odd.mkdir()
    with store.fresh_staging("e" * 64) as live:
        (base / live.name).mkdir()
        assert remove_dead(store, base) == [dead.name]
        assert (base / live.name).is_dir() and odd.is_dir() and not dead.exists()
