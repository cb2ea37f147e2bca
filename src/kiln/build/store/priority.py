"""Priority inheritance for build locks: a build that must wait for a key another process is building
lends that build its own CPU priority.

Why: `make test` builds what later tests need in the background at `nice 5`, and a background build
can take a key (Go, the seed toolchain) that a foreground build at nice 0 needs as well. The
foreground then waits on a niced build that gets a small share of the cores while it competes with
every other niced build: a priority inversion that cost a cold test run's first boot many minutes.
Lending the waiter's nice value to the holder's process tree (every thread: Linux keeps nice per
thread, and children inherit it) makes the build everyone waits for run at the best priority of
those waiting for it. Lowering a nice value needs CAP_SYS_NICE; without it nothing changes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")


def lock_holders(lock: Path) -> set[int]:
    """The pids holding a flock(2) or POSIX lock on `lock` (from /proc/locks; waiters left out)."""
    try:
        info = os.stat(lock)
        table = (PROC / "locks").read_text()
    except OSError:
        return set()
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    holders = set()
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's line has "->" after the number
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == wanted and fields[4].isdigit():
            holders.add(int(fields[4]))
    return holders


def _parents() -> dict[int, int]:
    """Every process's parent pid, from /proc/PID/stat (processes that end meanwhile are skipped)."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # the command name may hold spaces and parentheses: the fields after its last ")" are fixed
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return parents


def descendants(roots: set[int]) -> set[int]:
    """`roots` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def lend_priority(lock: Path) -> int:
    """Lower the nice value of every thread of `lock`'s holders and their descendants to ours where
    theirs is higher; the number of threads changed."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    changed = 0
    for pid in descendants(lock_holders(lock)):
        try:
            threads = [int(task.name) for task in (PROC / str(pid) / "task").iterdir()]
        except OSError:
            continue  # ended meanwhile
        for tid in threads:
            with contextlib.suppress(OSError):  # ended meanwhile, or no CAP_SYS_NICE
                if os.getpriority(os.PRIO_PROCESS, tid) > ours:
                    os.setpriority(os.PRIO_PROCESS, tid, ours)
                    changed += 1
    return changed
