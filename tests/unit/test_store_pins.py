"""Pins, gc and cancellation: what a run relies on stays stored, and a stopped run stores nothing.

Real Store objects on a real filesystem (flock works between two Store objects of one
process as between processes); the builder is a stub or has a runner that runs nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from kiln.build.builder import Builder
from kiln.build.cache_keys import compute_keys
from kiln.build.cancel import TOKEN, Cancelled, Interrupted
from kiln.build.progress import PlainProgress
from kiln.build.rootplan import RootPlan
from kiln.build.runners.base import Caches
from kiln.build.scheduler import Outcome, Scheduler
from kiln.build.session import NoRunner
from kiln.build.sources.download import Fetcher
from kiln.build.store import Entry, Pins, Store
from kiln.core.errors import BuildError, KilnError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.conftest import write_tree

SDE = 1_704_067_200
WAIT = 30.0


@pytest.fixture(autouse=True)
def fresh_token() -> Iterator[None]:
    """The cancel token is process-wide: every test starts and ends uncancelled."""
    TOKEN.reset()
    yield
    TOKEN.reset()


def put(store: Store, key: str, size: int = 100) -> None:
    staging = store.staging(key)
    (staging / "tree" / "blob").write_bytes(b"x" * size)
    store.commit(key, staging, key, {}, SDE)


def leftovers(root: Path) -> list[str]:
    dirs = [root / "tmp", root / "locks"]
    return sorted(str(p.relative_to(root)) for d in dirs if d.is_dir() for p in d.iterdir())


def test_pinned_entries_survive_gc_and_remove(tmp_path: Path) -> None:
    store, other = Store(tmp_path), Store(tmp_path)  # `other` stands for a concurrent `kiln cache gc`
    for key in ("a", "b", "c"):
        put(store, key)
    with Pins(store) as pins:
        assert pins.pin("a") and pins.pin("b", wait=False)
        assert "a" in pins and "c" not in pins
        assert other.gc(0) == ["c"]
        with pytest.raises(KilnError, match="in use"):
            other.remove("a")
        pins.unpin("b")
        assert other.gc(0) == ["b"]
        assert store.has("a")
    assert other.gc(0) == ["a"]
    assert leftovers(tmp_path) == []


def test_pin_of_a_missing_or_busy_entry_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    pins = Pins(store)
    assert not pins.pin("nope")
    assert leftovers(tmp_path) == []  # no lock file made for nothing
    put(store, "a")
    fd = os.open(tmp_path / "locks" / "a.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what gc holds while it evicts
        assert not pins.pin("a", wait=False)
    finally:
        os.unlink(tmp_path / "locks" / "a.lock")
        os.close(fd)
    assert pins.pin("a")
    pins.release()
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(30)
def test_a_build_lock_never_waits_for_pins(tmp_path: Path) -> None:
    """Two runs that pin each other's outputs and then wait to build them must not deadlock."""
    store, other = Store(tmp_path), Store(tmp_path)
    put(store, "x")
    with Pins(store) as pins:
        assert pins.pin("x")
        with other.lock("x"):  # the other run's worker: would wait for our run's end if it shared the file
            assert other.has("x")
            assert other.gc(0) == []  # and gc still skips a key being built
        assert other.gc(0) == []  # pinned
    assert other.gc(0) == ["x"]
    assert leftovers(tmp_path) == []


def test_pins_go_with_the_process_and_gc_removes_unheld_lock_files(tmp_path: Path) -> None:
    store = Store(tmp_path)
    put(store, "a")
    pins = Pins(store)
    assert pins.pin("a")
    del pins  # a verb that never closed its session: released when the object goes (or at exit)
    assert leftovers(tmp_path) == []
    (tmp_path / "locks" / "b.lock").touch()  # left by a process killed while it held it
    with Store(tmp_path).use("a"):
        assert store.clean_locks() == 1
        assert leftovers(tmp_path) == ["locks/a.lock"]  # held: kept
    assert store.gc(None) == [] and leftovers(tmp_path) == []


def test_pin_checks_again_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry evicted between the first look and the lock is missing, and its lock is let go."""
    store = Store(tmp_path)
    answers = iter([True, False])
    monkeypatch.setattr(store, "has", lambda key: next(answers))
    assert not Pins(store).pin("a")
    assert leftovers(tmp_path) == []


def graph_of(tmp_path: Path, packages: dict[str, tuple[str, ...]]) -> Graph:
    def pkg(name: str, needs: tuple[str, ...]) -> str:
        deps = "".join(f"  - stage: {n}\n" for n in needs)
        return f"name: {name}\nvariant: scratch\n" + (f"dependencies:\n{deps}" if deps else "")

    pkgs = write_tree(tmp_path, {f"{n}/pkg.yaml": pkg(n, needs) for n, needs in packages.items()})
    return Graph(load_tree(pkgs, Platform.parse("linux/amd64")))


class StubBuilder:
    """Builds like the real Builder (dependencies under `use`, a held staging dir), with a hook instead of steps."""

    def __init__(self, graph: Graph, store: Store, during: Callable[[str], None]) -> None:
        self.graph, self.store, self.during = graph, store, during
        self.keys = compute_keys(graph)
        self.runner = NoRunner()  # runs nothing: `build` below stands in for the runner too

    def build(self, name: str, on_phase: Callable[[str], None], *, replace: bool = False) -> Entry:
        self.during(name)
        deps = [self.keys[d] for d in self.graph.edges[name]]
        for key in deps:
            with self.store.use(key):  # what mounting a dependency does
                pass
        with self.store.fresh_staging(self.keys[name]) as staging:
            (staging / "tree" / "out").write_text(name)
            TOKEN.check(f"package '{name}'")
            if replace and self.store.has(self.keys[name]):  # as the real builder: once the rebuild succeeded
                self.store.remove_locked(self.keys[name])
            return self.store.commit(self.keys[name], staging, name, {}, SDE)


def schedule(builder: StubBuilder, targets: list[str]) -> dict[str, Outcome]:
    return Scheduler(builder, PlainProgress(io.StringIO()), jobs=2).run(targets)  # type: ignore[arg-type]


def test_a_cached_dependency_is_pinned_until_its_dependent_mounts_it(tmp_path: Path) -> None:
    """The gap between "judged cached" and the dependent's build: a gc there used to evict it."""
    graph = graph_of(tmp_path, {"dep": (), "app": ("dep",)})
    root = tmp_path / "cache"
    store = Store(root)
    keys = compute_keys(graph)
    put(store, keys["dep"])
    evicted: list[str] = []
    builder = StubBuilder(graph, store, lambda name: evicted.extend(Store(root).gc(0)))
    outcomes = schedule(builder, ["app"])
    assert {n: o.status for n, o in outcomes.items()} == {"dep": "cached", "app": "built"}, outcomes["app"].error
    assert evicted == [] and store.has(keys["dep"])
    assert sorted(Store(root).gc(0)) == sorted([keys["dep"], keys["app"]])  # the run's pins are gone
    assert leftovers(root) == []


def test_outputs_built_earlier_in_the_run_stay_pinned(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, {"lib": (), "app": ("lib",)})
    root = tmp_path / "cache"
    store = Store(root)
    evicted: list[str] = []
    builder = StubBuilder(graph, store, lambda name: evicted.extend(Store(root).gc(0)) if name == "app" else None)
    outcomes = schedule(builder, ["app"])
    assert {o.status for o in outcomes.values()} == {"built"}
    assert evicted == []
    assert leftovers(root) == []


def test_cancel_stops_the_run_stores_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, {"slow": (), "after": ("slow",)})
    root = tmp_path / "cache"
    store = Store(root)
    started = threading.Event()
    stopped = threading.Event()

    def step(name: str) -> None:
        """A step process: runs until the cancel's stopper kills it."""
        with TOKEN.stopper(stopped.set):
            started.set()
            assert stopped.wait(WAIT)

    def cancel_when_started() -> None:
        assert started.wait(WAIT)
        TOKEN.cancel(signal.SIGTERM)  # what the SIGTERM handler does, from another thread here

    canceller = threading.Thread(target=cancel_when_started)
    canceller.start()
    with pytest.raises(Interrupted) as caught:
        schedule(StubBuilder(graph, store, step), ["after"])
    canceller.join(WAIT)
    assert caught.value.exit_code == 143
    assert "SIGTERM" in str(caught.value)
    assert store.entries() == []
    assert leftovers(root) == []


class NoopRoot:
    """A build root whose steps succeed at once; `on_run` lets a test act in the middle of one."""

    def __init__(self, work: Path, on_run: Callable[[], None]) -> None:
        self.work, self.on_run = work, on_run

    @property
    def build_dir(self) -> Path:
        path = self.work / "build"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()) -> int:
        self.on_run()
        return 0

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        (out / "file").write_text("done")
        return 0

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        return 0

    def close(self) -> None:
        pass


class NoopRunner:
    name = "noop"

    def __init__(self, on_run: Callable[[], None], fail_open: bool = False) -> None:
        self.on_run, self.fail_open = on_run, fail_open

    def open(self, plan: RootPlan, work: Path) -> NoopRoot:
        if self.fail_open:
            raise BuildError(f"package '{plan.name}': no root today")
        return NoopRoot(work, self.on_run)


def real_builder(tmp_path: Path, runner: NoopRunner) -> Builder:
    pkgs = write_tree(
        tmp_path,
        {
            "one/pkg.yaml": """
        name: one
        variant: scratch
        steps:
          - build: [echo hi]
        finalize: [{from: /out, to: /}]
        """
        },
    )
    graph = Graph(load_tree(pkgs, Platform.parse("linux/amd64")))
    store = Store(tmp_path / "cache")
    return Builder(graph, compute_keys(graph), store, Fetcher(store.root, []), runner, 1, SDE)


def test_a_step_that_ends_after_the_cancel_is_not_committed(tmp_path: Path) -> None:
    """The step returned 0, but the signal came while it ran: its output is not trusted."""
    builder = real_builder(tmp_path, NoopRunner(lambda: TOKEN.cancel(signal.SIGINT)))
    with pytest.raises(Cancelled):
        builder.build("one", lambda text: None)
    assert builder.store.entries() == []
    assert leftovers(builder.store.root) == []


def test_every_failed_build_discards_its_staging_dir(tmp_path: Path) -> None:
    builder = real_builder(tmp_path, NoopRunner(lambda: None, fail_open=True))
    with pytest.raises(BuildError, match="no root today"):
        builder.build("one", lambda text: None)
    assert leftovers(builder.store.root) == []
    ok = real_builder(tmp_path / "again", NoopRunner(lambda: None))
    assert (ok.build("one", lambda text: None).tree / "file").read_text() == "done"
    assert leftovers(ok.store.root) == []


def test_signal_handlers_cancel_stop_steps_and_raise_in_the_main_thread() -> None:
    from kiln.build import cancel

    before = signal.getsignal(signal.SIGTERM)
    stopped: list[str] = []
    with cancel.handlers(), TOKEN.stopper(lambda: stopped.append("step")):
        with pytest.raises(Interrupted) as caught:
            signal.raise_signal(signal.SIGTERM)
        assert TOKEN.cancelled and TOKEN.signum == signal.SIGTERM
        assert stopped == ["step"]
        with pytest.raises(Cancelled):
            TOKEN.check()
    assert caught.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before
    late: list[str] = []
    with TOKEN.stopper(lambda: late.append("late")):  # registered after the cancel: stopped at once
        assert late == ["late"]


def test_an_ignored_sigint_stays_ignored() -> None:
    from kiln.build import cancel

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with cancel.handlers():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is cancel.interrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_cancel_ends_a_download_and_keeps_no_partial_file(tmp_path: Path) -> None:
    """Downloads run in build workers too: the progress callback ends them at the next chunk."""
    from kiln.build.progress import Cancellable, DownloadLines
    from kiln.build.sources.mirrors import Mirror
    from kiln.pkg.model import Source

    data = b"x" * (3 << 20)  # a few chunks
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "big-1.0.tar.gz").write_bytes(data)
    lines = DownloadLines(io.StringIO())

    def report(label: str, done: int, total: int | None) -> None:
        lines(label, done, total)
        if done:
            TOKEN.cancel(signal.SIGINT)  # the signal lands during the download

    cache = tmp_path / "cache"
    fetcher = Fetcher(cache, [Mirror.parse(mirror.as_uri(), tmp_path)], Cancellable(report), retries=0)
    source = Source(
        destination="big.tar.gz", url="http://127.0.0.1:9/big-1.0.tar.gz", sha256=hashlib.sha256(data).hexdigest()
    )
    with pytest.raises(Cancelled, match="download of"):
        fetcher.fetch(source)
    assert [p.name for p in (cache / "sources").iterdir()] == []
