"""Priority inheritance for build locks (kiln.build.store.priority), with real processes, real flocks
and real nice values: a niced holder and its children run at the waiter's priority once it waits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.build.store.priority import descendants, lend_priority, lock_holders
from kiln.build.store.store import Store

needs_cap_sys_nice = pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice value needs CAP_SYS_NICE")
pytestmark = pytest.mark.skipif(
    os.getpriority(os.PRIO_PROCESS, 0) > 9, reason="the holders run 7 and 10 above us, and nice stops at 19"
)

# Holds an exclusive flock on argv[1], starts a child (which inherits nothing of the lock but its
# nice value), prints both pids, then sleeps until killed.
HOLDER = """
import fcntl, os, subprocess, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
child = subprocess.Popen(["sleep", "300"])
print(os.getpid(), child.pid, flush=True)
time.sleep(300)
"""


@pytest.fixture
def niced_holder(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """(lock file, holder pid, child pid): a process at a nice value 7 above ours holding the lock, with a child."""
    lock = tmp_path / "key.build.lock"
    process = subprocess.Popen(
        ["nice", "-n", "7", sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, process_group=0
    )
    assert process.stdout is not None
    holder, child = (int(pid) for pid in process.stdout.readline().split())
    try:
        yield lock, holder, child
    finally:
        os.killpg(process.pid, 9)
        process.wait()


def nice_of(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def ours() -> int:
    """This process's nice value: `make test` runs this tier under `nice -n 5`, and `nice -n N` adds to it."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def test_the_holder_of_a_lock_is_found_and_a_waiter_is_not(niced_holder: tuple[Path, int, int]) -> None:
    lock, holder, child = niced_holder
    assert lock_holders(lock) == {holder}
    assert {holder, child} <= descendants({holder})
    assert lock_holders(lock.with_name("other.lock")) == set()


@needs_cap_sys_nice
def test_a_waiter_lends_its_priority_to_the_holder_and_its_children(niced_holder: tuple[Path, int, int]) -> None:
    lock, holder, child = niced_holder
    assert nice_of(holder) == nice_of(child) == ours() + 7
    assert lend_priority(lock) >= 2  # the holder's threads and its child
    assert nice_of(holder) == nice_of(child) == ours()


@needs_cap_sys_nice
def test_a_holder_at_a_better_priority_keeps_it(tmp_path: Path) -> None:
    """The waiter here runs 10 above us: the holder (7 above us) is not made worse."""
    lock = tmp_path / "key.build.lock"
    process = subprocess.Popen(
        ["nice", "-n", "7", sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, process_group=0
    )
    try:
        assert process.stdout is not None
        holder = int(process.stdout.readline().split()[0])
        lender = "import sys; from pathlib import Path; from kiln.build.store.priority import lend_priority; "
        lender += "print(lend_priority(Path(sys.argv[1])))"
        lent = subprocess.run(["nice", "-n", "10", sys.executable, "-c", lender, str(lock)], capture_output=True)
        assert lent.stdout.strip() == b"0", lent.stderr
        assert nice_of(holder) == ours() + 7
    finally:
        os.killpg(process.pid, 9)
        process.wait()


def take_and_release(store: Store, key: str) -> None:
    with store.lock(key):
        pass


@needs_cap_sys_nice
def test_the_store_lends_while_it_waits_for_a_key_being_built(tmp_path: Path) -> None:
    """Store.lock, waiting on a key a niced process is building, raises that build's priority."""
    store = Store(tmp_path / "cache")
    key = "a" * 64
    code = (
        "import sys, time; from pathlib import Path; from kiln.build.store.store import Store; "
        "s = Store(Path(sys.argv[1]))\nwith s.lock(sys.argv[2]):\n    print('held', flush=True); time.sleep(300)"
    )
    process = subprocess.Popen(
        ["nice", "-n", "7", sys.executable, "-c", code, str(tmp_path / "cache"), key],
        stdout=subprocess.PIPE,
        process_group=0,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == b"held"
        waiter = threading.Thread(target=take_and_release, args=(store, key), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while nice_of(process.pid) == ours() + 7 and time.monotonic() < deadline:
            time.sleep(0.02)  # the waiter lends before it blocks
        assert nice_of(process.pid) == ours()
    finally:
        os.killpg(process.pid, 9)
        process.wait()
    waiter.join(timeout=10)  # the holder died: its flock went with it, and the waiter got the key
    assert not waiter.is_alive()
