"""The scheduler and builder with a whole-graph runner: claims, pins, storing, failures, --no-cache.

The runner here is a stub that writes one file per package into the trees it is handed
instead of running BuildKit; everything around it (the scheduler's claims and pins, the
builder's staging, logs and commits, a real Store) is the real code. The BuildKit runner
goes through the same path against a real engine in tests/integration/test_runners.py
(same outputs on every runner, a failed step named by package).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import NoReturn

import pytest

from kiln.build.builder import Builder
from kiln.build.cache_keys import compute_keys
from kiln.build.progress import PlainProgress
from kiln.build.rootplan import RootPlan
from kiln.build.runners.base import GraphJob, GraphResult, GraphRunner
from kiln.build.scheduler import Outcome, Scheduler
from kiln.build.sources.download import Fetcher
from kiln.build.store import Store
from kiln.core.errors import BuildError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import write_tree


class StubGraphRunner:
    """Builds every package of a job by writing its name into `out`; fails the names in `fail`."""

    name = "stub-graph"

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.jobs: list[GraphJob] = []

    def open(self, plan: RootPlan, work: Path) -> NoReturn:
        raise BuildError(f"{plan.name}: the stub builds whole graphs only")

    def build_graph(self, job: GraphJob) -> GraphResult:
        self.jobs.append(job)
        assert all(tree.is_dir() and not any(tree.iterdir()) for tree in job.trees.values())
        assert all(path.is_dir() for path in job.prebuilt.values())
        culprits = sorted(self.fail & set(job.trees))
        if culprits:
            job.log.write_text("#7 ERROR: boom\n")
            return GraphResult(1, job.log, failed=culprits, tail="#7 ERROR: boom")
        for name, tree in job.trees.items():
            (tree / "out").write_text(f"{name} {len(self.jobs)}\n")
            job.logs[name].write(b"built\n")
            job.on_phase(name, "building")
        return GraphResult(0, job.log, seconds=dict.fromkeys(job.trees, 0.5))


def pkg(name: str, *needs: str) -> str:
    deps = "".join(f"  - stage: {n}\n" for n in needs)
    return f"name: {name}\nvariant: scratch\n" + (f"dependencies:\n{deps}" if deps else "")


@pytest.fixture
def graph(tmp_path: Path) -> Graph:
    pkgs = write_tree(
        tmp_path,
        {"a/pkg.yaml": pkg("a"), "b/pkg.yaml": pkg("b", "a"), "c/pkg.yaml": pkg("c", "b"), "x/pkg.yaml": pkg("x")},
    )
    return Graph(load_tree(pkgs, Platform.parse("linux/amd64")))


def make_builder(graph: Graph, tmp_path: Path, runner: StubGraphRunner) -> Builder:
    """A real Builder on a real Store, with a one-file seed stored (a whole-graph export names the seed)."""
    store = Store(tmp_path / "cache")
    builder = Builder(graph, compute_keys(graph), store, Fetcher(tmp_path / "cache", []), runner, 1, 1704067200)
    staging = store.staging(builder.seed_key)
    (staging / "tree" / "seed").write_text("seed\n")
    store.commit(builder.seed_key, staging, "stage0", {}, 1704067200)
    return builder


def run(builder: Builder, targets: list[str], *, no_cache: bool = False) -> dict[str, Outcome]:
    return Scheduler(builder, PlainProgress(io.StringIO()), 2, no_cache=no_cache).run(targets)


def status(outcomes: dict[str, Outcome]) -> dict[str, str]:
    return {name: o.status for name, o in outcomes.items()}


def stored(builder: Builder, name: str) -> str:
    return (builder.store.tree(builder.keys[name]) / "out").read_text()


def test_the_stub_is_a_graph_runner() -> None:
    assert isinstance(StubGraphRunner(), GraphRunner)


def test_missing_packages_go_in_one_job_stored_ones_as_prebuilt(graph: Graph, tmp_path: Path) -> None:
    runner = StubGraphRunner()
    builder = make_builder(graph, tmp_path, runner)
    assert status(run(builder, ["a"])) == {"a": "built"}
    outcomes = run(builder, ["c", "x"])
    assert status(outcomes) == {"a": "cached", "b": "built", "c": "built", "x": "built"}
    job = runner.jobs[-1]
    assert sorted(job.trees) == ["b", "c", "x"]
    assert list(job.prebuilt) == ["a"]  # b's root reads it
    assert job.needed == [n for n in graph.order if n in {"a", "b", "c", "x"}]
    assert stored(builder, "c") == "c 2\n"
    assert builder.store.entry(builder.keys["c"]).meta["runner"] == "stub-graph"
    log = tmp_path / "cache" / "logs" / "c" / f"{builder.keys['c']}.log"
    assert log.read_text() == "built\n"
    assert status(run(builder, ["c", "x"])) == dict.fromkeys(["a", "b", "c", "x"], "cached")
    assert len(runner.jobs) == 2  # nothing handed to the runner when everything is stored


def test_a_failed_solve_stores_nothing_and_blames_its_culprits(graph: Graph, tmp_path: Path) -> None:
    builder = make_builder(graph, tmp_path, StubGraphRunner(fail={"b"}))
    outcomes = run(builder, ["c", "x"])
    assert status(outcomes) == {"a": "skipped", "b": "failed", "c": "skipped", "x": "skipped"}
    error = outcomes["b"].error
    assert error is not None
    assert "package 'b' failed on stub-graph (exit 1)" in error.message
    assert "#7 ERROR: boom" in error.message
    assert not any(builder.store.has(builder.keys[n]) for n in "abcx")
    assert not list(builder.store.tmp_dir.iterdir())  # every staging dir was discarded


def test_no_cache_replaces_an_entry_only_when_the_rebuild_succeeds(graph: Graph, tmp_path: Path) -> None:
    runner = StubGraphRunner()
    builder = make_builder(graph, tmp_path, runner)
    run(builder, ["b"])
    assert stored(builder, "b") == "b 1\n"
    runner.fail = {"b"}
    assert status(run(builder, ["b"], no_cache=True))["b"] == "failed"
    assert stored(builder, "b") == "b 1\n"
    runner.fail = set()
    assert status(run(builder, ["b"], no_cache=True)) == {"a": "built", "b": "built"}
    assert stored(builder, "b") == "b 3\n"
