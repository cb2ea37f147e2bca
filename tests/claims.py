"""Two pytest processes share one tier: each runs the test modules it claims, in collection order.

`make test` boots in one lane from the start and, once the builds and Go lanes have ended, in a
second (scripts/test_lanes.py), so the core those lanes leave idle boots too. Both processes
collect the same tests; before a module's first test each tries to claim the module by creating
a file named after it in the directory KILN_TEST_CLAIMS names (O_EXCL: one of them wins) and
skips, unreported, the modules the other holds. A module is the unit, so its fixtures are set up
once; session fixtures stay up across the modules a process skips, because each test's teardown
is told the next test in collection order, as pytest's own loop does.

tests/conftest.py takes the hook in; elsewhere load it with `-p tests.claims`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CLAIMS_ENV = "KILN_TEST_CLAIMS"


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def claim(directory: Path, module: str) -> bool:
    """True when this process is the first to claim `module` in `directory`."""
    marker = directory / module.replace("/", "__")
    try:
        descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as out:
        out.write(f"{os.getpid()}\n")
    return True


def run_claimed(session: pytest.Session, directory: Path) -> bool:
    """pytest's run loop over the modules this process claims (pytest_runtestloop's contract)."""
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    if session.config.option.collectonly:
        return True
    items = session.items
    claimed = False
    for index, item in enumerate(items):
        if index == 0 or module_of(items[index - 1]) != module_of(item):
            claimed = claim(directory, module_of(item))
        if not claimed:
            continue
        nextitem = items[index + 1] if index + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With KILN_TEST_CLAIMS set, run only the modules claimed here; else pytest's own loop."""
    directory = os.environ.get(CLAIMS_ENV)
    return run_claimed(session, Path(directory)) if directory else None
