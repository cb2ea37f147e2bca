"""Scheduling semantics: order, parallelism, cache hits, failures, --keep-going, progress output.

The builder here is a stub that writes a one-file output into a real Store instead of
running steps in bubblewrap, so these tests are fast and hermetic; the real builder is
exercised end to end by tests/integration/test_build.py.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kiln.build.cache_keys import compute_keys
from kiln.build.progress import LiveProgress, PlainProgress
from kiln.build.scheduler import Outcome, Scheduler
from kiln.build.session import NoRunner, outcome_json
from kiln.build.store import Entry, Store
from kiln.core.errors import BuildError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import write_tree


def pkg(name: str, *needs: str) -> str:
    deps = "".join(f"  - stage: {n}\n" for n in needs)
    return f"name: {name}\nvariant: scratch\n" + (f"dependencies:\n{deps}" if deps else "")


class StubBuilder:
    """Stands in for kiln.build.builder.Builder: same attributes, no sandbox."""

    def __init__(self, graph: Graph, store: Store, fail: set[str], delay: float = 0.0) -> None:
        self.graph = graph
        self.keys = compute_keys(graph)
        self.store = store
        self.fail = fail
        self.delay = delay
        self.runner = NoRunner()  # runs nothing: `build` below stands in for the runner too
        self.calls: list[str] = []
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def build(self, name: str, on_phase: Callable[[str], None], *, replace: bool = False) -> Entry:
        with self._lock:
            self.calls.append(name)
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            on_phase("step 1 build")
            time.sleep(self.delay)
            if name in self.fail:
                raise BuildError(f"package '{name}' failed")
            staging = self.store.staging(self.keys[name])
            (staging / "tree" / "out").write_text(name)
            if replace and self.store.has(self.keys[name]):  # as the real builder: once the rebuild succeeded
                self.store.remove_locked(self.keys[name])
            return self.store.commit(self.keys[name], staging, name, {}, 1704067200)
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture
def graph(tmp_path: Path) -> Graph:
    pkgs = write_tree(
        tmp_path,
        {
            "a/pkg.yaml": pkg("a"),
            "b/pkg.yaml": pkg("b", "a"),
            "c/pkg.yaml": pkg("c", "b"),
            "x/pkg.yaml": pkg("x"),
            "y/pkg.yaml": pkg("y", "x"),
            "top/pkg.yaml": pkg("top", "c", "y"),
        },
    )
    return Graph(load_tree(pkgs, Platform.parse("linux/amd64")))


def run(builder: StubBuilder, targets: list[str], **options: Any) -> dict[str, Outcome]:
    scheduler = Scheduler(builder, PlainProgress(io.StringIO()), **options)  # type: ignore[arg-type]
    return scheduler.run(targets)


def status(outcomes: dict[str, Outcome]) -> dict[str, str]:
    return {name: o.status for name, o in outcomes.items()}


def test_builds_in_dependency_order_then_all_cached(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set())
    first = run(builder, ["top"], jobs=2)
    assert set(status(first).values()) == {"built"}
    order = builder.calls
    assert order.index("a") < order.index("b") < order.index("c") < order.index("top")
    assert order.index("x") < order.index("y") < order.index("top")
    builder.calls.clear()
    second = run(builder, ["top"], jobs=2)
    assert set(status(second).values()) == {"cached"}
    assert builder.calls == []


def test_independent_packages_build_at_once(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set(), delay=0.2)
    run(builder, ["a", "x"], jobs=2)
    assert builder.peak == 2
    serial = StubBuilder(graph, Store(tmp_path / "cache2"), fail=set(), delay=0.05)
    run(serial, ["a", "x"], jobs=1)
    assert serial.peak == 1


def test_failure_stops_new_work_without_keep_going(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail={"a"})
    outcomes = run(builder, ["top"], jobs=1)
    assert outcomes["a"].status == "failed"
    assert isinstance(outcomes["a"].error, BuildError)
    assert {outcomes[n].status for n in ("b", "c", "top")} == {"skipped"}
    assert len(builder.calls) <= 2  # a, and at most x already running


def test_keep_going_builds_what_does_not_need_the_failure(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail={"b"})
    outcomes = run(builder, ["top"], jobs=1, keep_going=True)
    assert status(outcomes) == {
        "a": "built",
        "b": "failed",
        "c": "skipped",
        "x": "built",
        "y": "built",
        "top": "skipped",
    }


def test_outcomes_record_start_finish_and_needs(graph: Graph, tmp_path: Path) -> None:
    """Each outcome's times count from the run's origin; a package starts after its needs finish."""
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set(), delay=0.05)
    origin = time.monotonic()
    outcomes = run(builder, ["top"], jobs=2, origin=origin)
    elapsed = time.monotonic() - origin
    for outcome in outcomes.values():
        assert outcome.started is not None and outcome.finished is not None
        assert 0 <= outcome.started <= outcome.finished <= elapsed + 0.01
        assert outcome.finished - outcome.started >= 0.05
        for need in outcome.needs:
            done = outcomes[need].finished
            assert done is not None and done <= outcome.started
    assert set(outcomes["top"].needs) == {"c", "y"} and outcomes["a"].needs == ()
    again = run(builder, ["top"], jobs=2)
    assert all(o.status == "cached" and o.started == o.finished for o in again.values())
    data = json.loads(outcome_json(outcomes))["packages"]
    assert data["top"]["started"] == outcomes["top"].started
    assert sorted(data["top"]["needs"]) == ["c", "y"]


def test_a_failed_build_has_times_too(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail={"a"})
    outcomes = run(builder, ["b"], jobs=1)
    failed = outcomes["a"]
    assert failed.status == "failed" and failed.started is not None and failed.finished is not None
    assert outcomes["b"].status == "skipped" and outcomes["b"].started is None


def test_no_cache_rebuilds(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set())
    run(builder, ["b"], jobs=1)
    again = run(builder, ["b"], jobs=1, no_cache=True)
    assert status(again) == {"a": "built", "b": "built"}


def test_plain_progress_lines(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set())
    stream = io.StringIO()
    Scheduler(builder, PlainProgress(stream), jobs=1).run(["b"])  # type: ignore[arg-type]
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[0/2] a: building"
    assert "[0/2] a: step 1 build" in lines
    assert "[1/2] a: built in" in "\n".join(lines)
    assert lines[-1] == "done: built 2, cached 0, failed 0, skipped 0"


def test_live_progress_renders_running_packages_and_a_summary(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail={"b"})
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    live = LiveProgress(console)
    live.begin(["a", "b"])
    live.started("a")
    live.phase("a", "step 1 build")
    frame = Console(file=io.StringIO(), width=100, color_system=None)
    with frame.capture() as capture:
        frame.print(live._render())
    assert "a" in capture.get() and "step 1 build" in capture.get()
    live.live.stop()
    outcomes = Scheduler(builder, LiveProgress(console), jobs=1, keep_going=True).run(["b"])  # type: ignore[arg-type]
    text = out.getvalue()
    assert "kiln build" in text  # the summary table's title
    assert "failed" in text and "built" in text
    assert outcomes["b"].status == "failed"


def test_download_lines() -> None:
    from kiln.build.progress import DownloadLines

    stream = io.StringIO()
    report = DownloadLines(stream)
    report("musl-1.2.3.tar.gz", 0, 2 * 1048576)
    report("musl-1.2.3.tar.gz", 1048576, 2 * 1048576)
    report("musl-1.2.3.tar.gz", 2 * 1048576, 2 * 1048576)
    assert stream.getvalue().splitlines() == ["fetch: musl-1.2.3.tar.gz (2.0 MiB)", "fetch: musl-1.2.3.tar.gz: done"]


def test_the_heaviest_chain_starts_first(graph: Graph, tmp_path: Path) -> None:
    """With one worker, x (build order puts a first) goes first when its chain weighs more."""
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set())
    run(builder, ["top"], jobs=1, weigh=lambda name: 10 if name == "y" else 1)
    assert builder.calls[:2] == ["x", "y"]  # y's weight makes x's chain (x, y, top) the heaviest
    unweighed = StubBuilder(graph, Store(tmp_path / "cache2"), fail=set())
    run(unweighed, ["top"], jobs=1)
    assert unweighed.calls[0] == "a"  # no weights: build order


def test_never_more_builds_than_jobs_even_with_many_ready(graph: Graph, tmp_path: Path) -> None:
    builder = StubBuilder(graph, Store(tmp_path / "cache"), fail=set(), delay=0.05)
    run(builder, ["top"], jobs=1)
    assert builder.peak == 1 and len(builder.calls) == 6
