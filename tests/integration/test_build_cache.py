"""A step's `cache:` directories, for real in bubblewrap: kept between builds, empty under --check; and its
`scratch:` directories: in memory, empty at every build."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kiln.build.scratch import memory_base
from kiln.build.store.store import Store
from tests.integration.conftest import Project

pytestmark = pytest.mark.integration

# Counts its builds in the cache and says so in the log; the output holds the count only in `leaky`.
COUNTER = """\
name: {name}
variant: stage0
version: "1.0"
steps:
  - cache:
      - /var/cache/counter
    install:
      - echo x >> /var/cache/counter/builds
      - 'echo "builds so far: $(wc -l < /var/cache/counter/builds)"'
      - mkdir -p /out/share
      - echo stable > /out/share/stable.txt
      - '{leak}'
finalize:
  - from: /out
    to: /
"""


def write(project: Project, name: str, leak: str = "true") -> None:  # leak: one shell line, no quote
    (project.pkgs / name).mkdir()
    (project.pkgs / name / "pkg.yaml").write_text(textwrap.dedent(COUNTER.format(name=name, leak=leak)))


def test_a_cache_outlives_the_build_and_check_starts_it_empty(project: Project) -> None:
    write(project, "counter")
    project.kiln("build", "counter", check=True)
    project.kiln("build", "counter", "--no-cache", check=True)  # the same key again: its cache is kept
    assert "builds so far: 2" in project.kiln("log", "counter", check=True).out
    [directory] = (project.cache / "build-caches/counter/amd64").iterdir()
    assert (directory / "builds").read_text() == "x\nx\n"
    assert "build caches:" in project.kiln("cache", "ls", check=True).out
    checked = project.kiln("build", "counter", "--check", "--json", check=True)
    assert json.loads(checked.out)["packages"]["counter"]["reproducible"] is True
    assert (directory / "builds").read_text() == "x\nx\n"  # the check's rebuild had a cache of its own
    emptied = json.loads(project.kiln("cache", "gc", "--build-caches", "--json", check=True).out)
    assert emptied["build_caches"] == ["build-caches/counter/amd64"]
    assert not (project.cache / "build-caches/counter/amd64").exists()


def test_an_output_that_depends_on_its_cache_fails_the_check(project: Project) -> None:
    write(project, "leaky", leak="wc -l < /var/cache/counter/builds > /out/share/count")
    project.kiln("build", "leaky", check=True)
    project.kiln("build", "leaky", "--no-cache", check=True)  # stored output: count 2
    result = project.kiln("build", "leaky", "--check", "--json")
    assert result.code == 1, result.err
    [difference] = json.loads(result.out)["packages"]["leaky"]["differences"]
    assert difference["path"] == "share/count"


def test_a_failed_no_cache_rebuild_keeps_the_stored_entry(project: Project) -> None:
    """The real builder: --no-cache replaces an entry only once the rebuild succeeded (here the
    second build fails, as it counts two builds in its cache)."""
    write(project, "second-fails", leak="test $(wc -l < /var/cache/counter/builds) -lt 2")
    project.kiln("build", "second-fails", check=True)
    failed = project.kiln("build", "second-fails", "--no-cache")
    assert failed.code == 1, failed.err
    again = project.kiln("build", "second-fails", "--json", check=True)
    assert json.loads(again.out)["packages"]["second-fails"]["status"] == "cached"


# Writes into its scratch directory in one snippet and reads it in the next; says what it found first
# and which filesystem holds it; the output holds neither.
SCRATCH = """\
name: scratchy
variant: stage0
version: "1.0"
steps:
  - scratch:
      - /tmp/build/src
    prepare:
      - 'echo "found at start: $(ls -A /tmp/build/src | wc -l)"'
      - 'echo "filesystem: $(stat -f -c %T /tmp/build/src)"'
      - echo unpacked > /tmp/build/src/tree
    build:
      - 'echo "read in build: $(cat /tmp/build/src/tree)"'
    install:
      - mkdir -p /out/share && echo stable > /out/share/stable.txt
finalize:
  - from: /out
    to: /
"""


def test_a_scratch_directory_is_in_memory_for_the_build_and_empty_at_the_next(project: Project) -> None:
    (project.pkgs / "scratchy").mkdir()
    (project.pkgs / "scratchy" / "pkg.yaml").write_text(SCRATCH)
    base = memory_base(Store(project.cache))  # this store's directory in memory, made here
    assert base is not None and base.is_relative_to(Path("/dev/shm"))
    project.kiln("build", "scratchy", check=True)
    project.kiln("build", "scratchy", "--no-cache", check=True)  # the same key again: nothing kept
    log = project.kiln("log", "scratchy", check=True).out
    assert "found at start: 0" in log and "read in build: unpacked" in log
    assert "filesystem: tmpfs" in log  # this machine's /dev/shm is a tmpfs with room
    checked = project.kiln("build", "scratchy", "--check", "--json", check=True)
    assert json.loads(checked.out)["packages"]["scratchy"]["reproducible"] is True
    assert not base.exists()  # every build's directories went with it, and the store's directory with the last
