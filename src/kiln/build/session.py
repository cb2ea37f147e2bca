"""Wiring for the build verbs: a loaded graph plus store, fetcher and runner.

The CLI parses arguments and calls these; tests and benchmarks call them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kiln.build import prefetch
from kiln.build.bootstrap import ensure_stage0
from kiln.build.builder import Builder, logs_dir
from kiln.build.cache_keys import compute_keys, stage0_key
from kiln.build.check import Checked, check_package
from kiln.build.dockerfile import Export, Exporter
from kiln.build.emulation import cannot_run_reason
from kiln.build.progress import LiveProgress, PlainProgress, download_progress
from kiln.build.progress import live as progress_live
from kiln.build.rootplan import RootPlan
from kiln.build.runners.base import BuildRoot, GraphRunner, Runner
from kiln.build.runners.buildkit import BuildKitRunner
from kiln.build.runners.sandbox import SandboxRunner
from kiln.build.scheduler import FAILED, Outcome, Progress, Scheduler
from kiln.build.sources.download import Fetcher
from kiln.build.sources.mirrors import load_mirrors
from kiln.build.store import Pins, Store
from kiln.core import console, tools
from kiln.core.console import say_line
from kiln.core.errors import BuildError, InputError, Location
from kiln.core.paths import cache_dir
from kiln.pkg.graph import Graph

RUNNERS = ("sandbox", "docker", "buildkit")
PIN_ATTEMPTS = 3


class NoRunner:
    """For verbs that plan, fetch, export or move cache entries but never run a step."""

    name = "none"

    def open(self, plan: RootPlan, work: Path) -> BuildRoot:
        raise BuildError(f"package '{plan.name}': no runner was chosen for this command")


def make_runner(name: str) -> Runner:
    """The runner called `name`; docker and buildkit need an engine and are imported only then."""
    if name == "sandbox":
        return SandboxRunner()
    if name == "docker":
        from kiln.build.runners.docker import DockerRunner

        return DockerRunner()
    if name == "buildkit":
        return BuildKitRunner()
    if name == "none":
        return NoRunner()
    raise InputError(f"unknown runner {name!r}: choose one of {', '.join(RUNNERS)}")


@dataclass
class Session:
    """One verb's graph, store and builder; entries its builds rely on stay pinned until `close`."""

    graph: Graph
    keys: dict[str, str]
    store: Store
    builder: Builder
    pins: Pins = field(init=False)

    def __post_init__(self) -> None:
        self.pins = Pins(self.store)

    def close(self) -> None:
        """Release the pins (process exit does too): gc may evict this session's entries again."""
        self.pins.release()

    @classmethod
    def open(cls, graph: Graph, runner: str = "sandbox", make_jobs: int | None = None) -> Session:
        chosen = make_runner(runner)
        keys = compute_keys(graph)
        store = Store(cache_dir())
        fetcher = Fetcher(cache_dir(), load_mirrors(graph.tree.project_root), download_progress())
        sde = int(graph.tree.variables.get("source_date_epoch", 0))
        builder = Builder(graph, keys, store, fetcher, chosen, make_jobs or os.cpu_count() or 1, sde)
        return cls(graph, keys, store, builder)

    @property
    def source_date_epoch(self) -> int:
        return self.builder.source_date_epoch

    def needs_seed(self, names: list[str]) -> bool:
        return any(self.graph.tree.packages[n].variant in ("stage0", "toolchain") for n in names)

    def bootstrap(self, say: Callable[[str], None] = print) -> str:
        tree = self.graph.tree
        key = stage0_key(tree)
        ensure_stage0(
            tree.stage0,
            key,
            tree.builder_platform,
            tree.platform.arch if tree.cross else None,
            self.store,
            logs_dir(self.store) / "stage0",
            say,
            self.source_date_epoch,
        )
        return key

    def _pinned_seed(self) -> None:
        """Make the seed if needed and pin it: a gc between bootstrap and the first mount must not take it."""
        for _ in range(PIN_ATTEMPTS):
            if self.pins.pin(self.bootstrap(say_line)):
                return
        raise BuildError(f"a concurrent gc evicted the stage0 seed as soon as it was made, {PIN_ATTEMPTS} times")

    def build(
        self,
        targets: list[str],
        jobs: int,
        progress: Progress,
        *,
        no_cache: bool,
        keep_going: bool,
        cache_from: str | None = None,
        cache_to: str | None = None,
        origin: float | None = None,
    ) -> dict[str, Outcome]:
        """Build targets and their needs; with cache_from, first pull what a registry has that is needed.

        Outcomes' start and finish times count from `origin` (time.monotonic(); default: now).
        """
        origin = time.monotonic() if origin is None else origin
        names = self.graph.closure(targets)
        tree = self.graph.tree
        no_tests = cannot_run_reason(tree.platform.carch) if tree.cross else None
        if no_tests:
            console.warning(f"kiln: warning: the test steps of {tree.platform} packages will be skipped: {no_tests}")
        if no_cache:
            self.pins.release()  # a rebuild locks keys exclusively: our own pins would block it forever
        if cache_from and not no_cache:
            self.pull_needed(targets, cache_from)
        prefetch.start(self.builder, self._to_build(names, no_cache=no_cache))  # overlaps the seed's bootstrap
        tools = self.build_tools(names, jobs, progress, no_cache=no_cache, keep_going=keep_going, origin=origin)
        if any(outcome.status == FAILED for outcome in tools.values()):
            return tools
        if isinstance(self.builder.runner, GraphRunner) or self.needs_seed(self._to_build(names, no_cache=no_cache)):
            self._pinned_seed()  # a whole-graph runner's export names the seed even for scratch packages
        scheduler = Scheduler(
            self.builder,
            progress,
            jobs,
            no_cache=no_cache,
            keep_going=keep_going,
            pins=self.pins,
            prebuilt=frozenset(tools),
            origin=origin,
            weigh=prefetch.source_bytes(self.builder),
        )
        outcomes = {**scheduler.run(targets), **tools}
        if cache_to:
            self.push([self.keys[n] for n in names if self.store.has(self.keys[n])], cache_to)
        return outcomes

    def build_all(
        self, targets: list[str], jobs: int, progress: Progress, *, purpose: str, cache_from: str | None = None
    ) -> dict[str, Outcome]:
        """Build targets (or find them stored) for a verb that goes on only if all of them are there:
        each failed package's error on its own line, then BuildError("<purpose>: N package(s) failed")."""
        outcomes = self.build(targets, jobs, progress, no_cache=False, keep_going=False, cache_from=cache_from)
        failed = failures(outcomes)
        if failed:
            for outcome in failed:
                console.error(str(outcome.error))
            raise BuildError(f"{purpose}: {len(failed)} package(s) failed")
        return outcomes

    def trees(self, names: list[str]) -> dict[str, Path]:
        """The stored output tree of each package (built or found by this session)."""
        return {name: self.store.tree(self.keys[name]) for name in names}

    def check(
        self, targets: list[str], *, deep: bool, jobs: int, progress: Progress, say: Callable[[str], None]
    ) -> list[Checked]:
        """kiln build --check: build what is missing first (so there is a stored output to compare
        with), then build each target (with `deep`, each package of their closure, in build order)
        again and compare (kiln.build.check), `jobs` rebuilds at a time; results in build order."""
        if isinstance(self.builder.runner, GraphRunner):
            raise InputError("--check rebuilds one package at a time: use the sandbox or docker runner")
        self.build_all(targets, jobs, progress, purpose="cannot check what does not build")
        tree = self.graph.tree
        names = self.graph.closure(targets) if deep else list(dict.fromkeys(targets))
        names = [n for n in names if not tree.native_tool(n)]  # a cross build's tools are the native tree's

        def one(name: str) -> Checked:
            say(f"{name}: building again to compare with {self.keys[name][:16]}")
            return check_package(self.builder, self.store, name, self.source_date_epoch, lambda _: None)

        # each rebuild has its own staging and only reads the store: they run side by side
        with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
            return list(pool.map(one, names))

    def _to_build(self, names: list[str], *, no_cache: bool) -> list[str]:
        """The packages this build will make: every one with no_cache, else those not stored.

        The stored ones are pinned here (the scheduler pins them too), so none can be evicted
        between this check and its use: a build whose every entry is stored or pulled needs no
        seed, and does not make one (a debootstrap of a few hundred packages in a fresh CI container).
        """
        if no_cache:
            return names
        return [name for name in names if not self.pins.pin(self.keys[name])]

    def build_tools(
        self,
        names: list[str],
        jobs: int,
        progress: Progress,
        *,
        no_cache: bool,
        keep_going: bool,
        origin: float | None = None,
    ) -> dict[str, Outcome]:
        """A cross build's tool packages (`tool: true`), built first by the build machine's native graph.

        They run on the build machine, so their native builds serve every target: one key, one
        build (the Go toolchain is not built again for arm64). Returns their outcomes.
        """
        tree = self.graph.tree
        tools = [name for name in names if tree.native_tool(name)]
        if not tools or tree.native is None:
            return {}
        graph = Graph(tree.native)
        keys = compute_keys(graph)
        native = Session(
            graph,
            keys,
            self.store,
            Builder(
                graph,
                keys,
                self.store,
                self.builder.fetcher,
                self.builder.runner,
                self.builder.make_jobs,
                self.source_date_epoch,
            ),
        )
        native.pins = self.pins  # one set of pins: they hold until this session closes
        say_line(f"tools for {tree.platform} from the native {tree.builder_platform} build: {', '.join(tools)}")
        outcomes = native.build(tools, jobs, progress, no_cache=no_cache, keep_going=keep_going, origin=origin)
        return {name: outcomes[name] for name in tools}

    def pull_needed(self, targets: list[str], ref: str) -> list[str]:
        """Pull from the registry every entry of the targets' closure that is not stored; returns their names.

        The whole closure, not just the targets: a build walks every package of it, and what
        the registry has need not be built here.
        """
        from kiln.build.remote import Ref, Registry

        registry = Registry(Ref.parse(ref))
        pulled: list[str] = []
        for name in self.graph.closure(targets):
            key = self.keys[name]
            if self.store.has(key):
                continue
            with self.store.lock(key):
                if not self.store.has(key) and registry.pull(self.store, key, self.source_date_epoch):
                    pulled.append(name)
        if pulled:
            say_line(
                f"kiln: pulled {len(pulled)} entr{'y' if len(pulled) == 1 else 'ies'} from {ref}: " + ", ".join(pulled)
            )
        return pulled

    def export_dockerfile(
        self, names: list[str], targets: list[str], out: Path, *, stage0: str, network_flags: bool
    ) -> Export:
        """`kiln export dockerfile`: the closure `names` as a Dockerfile and context in `out`, `targets` exported."""
        seed_tree = None
        if stage0 == "tar":
            self.bootstrap(say_line)
            seed_tree = self.store.tree(self.builder.seed_key)
        exporter = Exporter(
            self.graph,
            self.keys,
            self.builder.seed_key,
            self.builder.place_sources,
            self.builder.source_date_epoch,
            self.builder.make_jobs,
            network_flags=network_flags,
            stage0=stage0,
            seed_tree=seed_tree,
        )
        return exporter.write(names, {n: n for n in targets}, out)

    def fetch(self, names: list[str]) -> int:
        """Fetch (and check) every remote source of `names`, in parallel; returns how many."""
        from kiln.build.sources.download import fetch_all

        wanted = []
        for name in names:
            package = self.graph.tree.packages[name]
            for s_index, step in enumerate(package.steps):
                for index, source in enumerate(step.sources):
                    if not source.is_local:
                        where = Location(str(package.file), package.line(("steps", s_index, "sources", index)))
                        wanted.append((source, where))
        return len(fetch_all(self.builder.fetcher, wanted))

    def push(self, keys: list[str], ref: str) -> int:
        """Upload stored entries the registry lacks; returns how many were uploaded."""
        from kiln.build.remote import Ref, Registry

        sent = Registry(Ref.parse(ref)).push_all(self.store, keys)
        say_line(f"kiln: pushed {sent} of {len(keys)} entries to {ref} (the rest were there)")
        return sent

    def export(self, names: list[str], out: Path) -> None:
        """Copy target outputs to out/<name>/ (hard links when on the same filesystem)."""
        for name in names:
            dest = out / name
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            source = self.store.tree(self.keys[name])
            tools.run(["cp", "-a", "--reflink=auto", str(source), str(dest)], what=f"exporting {name} to {dest}")


def choose_progress(*, json_output: bool) -> Progress:
    """The live view or plain lines (progress.live: --progress); plain beside --json's output."""
    if progress_live() and not json_output:
        return LiveProgress()
    return PlainProgress(sys.stderr)


def outcome_json(outcomes: dict[str, Outcome]) -> str:
    """`kiln build --json`: per package its key, status, build seconds, when it started and finished
    (seconds since the build began, monotonic; null for a package never started) and what it needed."""
    return json.dumps(
        {
            "packages": {
                o.name: {
                    "key": o.key,
                    "status": o.status,
                    "seconds": o.seconds,
                    "started": o.started,
                    "finished": o.finished,
                    "needs": list(o.needs),
                }
                for o in outcomes.values()
            }
        },
        indent=2,
    )


def failures(outcomes: dict[str, Outcome]) -> list[Outcome]:
    return [o for o in outcomes.values() if o.status == FAILED]


def shell(session: Session, target: str, command: list[str]) -> int:
    """An interactive shell in TARGET's build root: dependencies merged, sources placed.

    The root is thrown away on exit; dependencies are built first if missing.
    """
    package = session.graph.tree.packages[target]
    needs = [d for d in session.graph.closure([target]) if d != target]
    if needs:
        outcomes = session.build(
            needs, jobs=os.cpu_count() or 1, no_cache=False, keep_going=False, progress=PlainProgress(sys.stderr)
        )
        if failures(outcomes):
            raise BuildError(f"cannot open a shell: a dependency of '{target}' failed to build")
    elif session.needs_seed([target]):
        session.bootstrap(say_line)
    session.store.tmp_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=session.store.tmp_dir, prefix=f"shell-{target}-") as work:
        env = session.builder.env(package.steps[0].env if package.steps else ())
        env["PS1"] = f"kiln:{target}:\\w# "
        with contextlib.closing(session.builder.prepare_root(package, Path(work))) as root:
            say_line(f"kiln: shell in {target}'s build root; changes are discarded on exit")
            return root.shell(env, command)
