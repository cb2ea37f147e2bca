"""Building one package: assemble its root, place sources, run steps, finalize, store.

The scheduler decides what to build and when; this module knows how, for one
package whose dependencies are already in the store.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kiln.build import buildcache, scratch
from kiln.build.cache_keys import local_source_digest, stage0_key, tree_digest
from kiln.build.cancel import TOKEN
from kiln.build.emulation import cannot_run_reason
from kiln.build.rootplan import Layer, RootPlan, base_env
from kiln.build.runners.base import BuildRoot, GraphJob, GraphResult, GraphRunner, Runner
from kiln.build.sources.download import Fetcher
from kiln.build.sources.place import place_local, place_source
from kiln.build.store import Entry, Store
from kiln.core.errors import BuildError, Location
from kiln.core.hashing import file_sha256
from kiln.core.paths import PathEscape, join_inside, spec_parts
from kiln.pkg.graph import Graph
from kiln.pkg.model import Package

LOG_TAIL = 40


class StepFailed(BuildError):
    """A snippet exited non-zero: says which, shows the log's tail and where the log is."""

    def __init__(self, package: str, step: int, phase: str, snippet: str, log: Path, code: int) -> None:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        shown = "\n".join("    " + line for line in snippet.strip().splitlines())
        message = (
            f"package '{package}' failed in step {step} ({phase}), exit code {code}:\n{shown}\n"
            f"--- last {len(lines)} lines of {log} ---\n" + "\n".join(lines)
        )
        super().__init__(message)
        self.package, self.step, self.phase, self.log = package, step, phase, log


def logs_dir(store: Store) -> Path:
    return store.root / "logs"


def log_path(store: Store, name: str, key: str) -> Path:
    """logs/<name>/<key>.log; a name that is not one plain path component is refused (it is spec text)."""
    if spec_parts(name, "package name") != [name]:
        raise PathEscape(f"package name {name!r} cannot name a log directory")
    return logs_dir(store) / name / f"{key}.log"


@dataclass
class Builder:
    """Everything a build of one package needs, shared by all packages of a run."""

    graph: Graph
    keys: dict[str, str]
    store: Store
    fetcher: Fetcher
    runner: Runner
    make_jobs: int
    source_date_epoch: int
    # Local sources' contents as the keys saw them (taken when the run starts, with the keys).
    local_digests: dict[tuple[str, int, int], dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for package in self.graph.tree.packages.values():
            for s_index, step in enumerate(package.steps):
                for index, source in enumerate(step.sources):
                    if source.path is not None:
                        where = ("steps", s_index, "sources", index, "path")
                        self.local_digests[(package.name, s_index, index)] = local_source_digest(
                            self.graph.tree, package, source, where
                        )

    @property
    def seed_key(self) -> str:
        return stage0_key(self.graph.tree)

    def input_names(self, package: Package) -> list[str]:
        """The packages whose outputs are mounted into the package's root (the seed is not one)."""
        names = [d.stage for d in self.graph.build_inputs(package.name)]
        if package.variant == "toolchain":
            names.append(self.graph.tree.toolchain)
        return names

    def input_keys(self, package: Package) -> list[str]:
        """Store keys of every tree mounted into the package's root."""
        keys = [self.keys[name] for name in self.input_names(package)]
        if package.variant in ("toolchain", "stage0"):
            keys.append(self.seed_key)
        return keys

    def plan(self, package: Package) -> RootPlan:
        """The package's root: dependencies as declared, their runtime closures, the toolchain, the seed."""
        deps = []
        where = Location(str(package.file), package.line(("dependencies",)))
        for dep in self.graph.build_inputs(package.name):
            key = self.keys[dep.stage]
            # Resolved inside the stored tree: the overlay follows links in it with the host's view.
            try:
                part = join_inside(self.store.tree(key), dep.source, what=f"dependency '{dep.stage}' 'from'")
                spec_parts(dep.to, f"dependency '{dep.stage}' 'to'")
            except PathEscape as exc:
                raise BuildError(exc.message, where) from None
            if not part.exists():
                raise BuildError(f"dependency '{dep.stage}' has no {dep.source} in its output", where)
            deps.append(Layer(part, dep.to, key))
        toolchain = seed = None
        if package.variant == "toolchain":
            key = self.keys[self.graph.tree.toolchain]
            toolchain = Layer(self.store.tree(key), "/", key)
        if package.variant in ("toolchain", "stage0"):
            seed = Layer(self.store.tree(self.seed_key), "/", self.seed_key)
        return RootPlan(package.name, self.keys[package.name], package.variant, tuple(deps), toolchain, seed)

    def layers(self, package: Package) -> list[Layer]:
        """Top first: dependencies as declared, their runtime closures, the toolchain, the seed."""
        return self.plan(package).layers

    def env(self, extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
        return {**base_env(self.source_date_epoch, self.make_jobs), **dict(extra)}

    def prepare_root(self, package: Package, work: Path) -> BuildRoot:
        """The build root with every step's sources in /tmp/build (fetched if needed); the caller closes it."""
        work.mkdir(parents=True, exist_ok=True)
        root = self.runner.open(self.plan(package), work)
        try:
            self.place_sources(package, root.build_dir)
        except BaseException:
            root.close()
            raise
        return root

    def place_sources(self, package: Package, build_dir: Path) -> None:
        """Every step's sources at their destinations below build_dir (fetched and verified if needed)."""
        for s_index, step in enumerate(package.steps):
            for index, source in enumerate(step.sources):
                if source.is_local:
                    placed = place_local(self.graph.tree.project_root_of(package), source, build_dir)
                    self._check_unchanged(package, s_index, index, placed)
                else:
                    where = Location(str(package.file), package.line(("steps", s_index, "sources", index)))
                    place_source(self.fetcher.fetch(source, where), build_dir, source.destination)

    def _check_unchanged(self, package: Package, s_index: int, index: int, placed: Path) -> None:
        """A local source edited after the run started would be stored under the old contents' key."""
        expected = self.local_digests.get((package.name, s_index, index))
        if expected is None:
            return
        # A single file may be placed under another name: compare its content only.
        same = tree_digest(placed) == expected if placed.is_dir() else [file_sha256(placed)] == list(expected.values())
        if not same:
            path = package.steps[s_index].sources[index].path
            raise BuildError(
                f"{package.name}: local source {path!r} changed since this build started "
                "(its cache key was computed from the earlier contents); run the build again"
            )

    def build(self, name: str, on_phase: Callable[[str], None], *, replace: bool = False) -> Entry:
        """Build `name` into the store; the caller holds the store lock for its key.

        With `replace` (a --no-cache rebuild), a stored entry gives way only once the rebuild has
        succeeded: a failed or cancelled rebuild leaves it as it was."""
        if self.graph.tree.native_tool(name):
            raise BuildError(
                f"package '{name}' is a tool (tool: true): a cross build takes its native build, which is missing"
            )
        package = self.graph.tree.packages[name]
        key = self.keys[name]
        log = log_path(self.store, name, key)
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with contextlib.ExitStack() as stack:
            # Shared locks on what we mount: gc will not evict a tree under a running build.
            for dep_key in self.input_keys(package):
                stack.enter_context(self.store.use(dep_key))
            # Made inside the stack, so every way out (error, failure, cancel) discards it unless committed.
            staging = stack.enter_context(self.store.fresh_staging(key))
            caches = stack.enter_context(
                buildcache.held(self.store.root, name, self.graph.tree.platform.arch, _cache_paths(package))
            )
            caches |= stack.enter_context(scratch.held(self.store, staging, _scratch_paths(package)))
            return self._build(package, key, staging, log, on_phase, start, caches, replace=replace)

    def _build(
        self,
        package: Package,
        key: str,
        staging: Path,
        log: Path,
        on_phase: Callable[[str], None],
        start: float,
        caches: dict[str, Path],
        *,
        replace: bool,
    ) -> Entry:
        name = package.name
        with self._open_log(name) as out:
            on_phase("sources")
            with contextlib.closing(self.prepare_root(package, staging / "work")) as root:
                self._steps(package, root, staging, log, out, on_phase, caches)
            shutil.rmtree(staging / "work")
            seconds = round(time.monotonic() - start, 2)
            _mark(out, f"==> {name}: built in {seconds} s\n")
            TOKEN.check(f"package '{name}'")  # a cancelled run replaces nothing
            if replace and self.store.has(key):
                self.store.remove_locked(key)
            return self._commit(name, staging, seconds)

    def rebuild(self, name: str, staging: Path, log: Path, on_phase: Callable[[str], None]) -> Path:
        """Build `name` again into `staging`/tree and store nothing (kiln build --check): the same root,
        sources, steps and finalize as `build`, but the step caches start empty: an output that
        depends on them differs. The caller owns `staging` and holds shared locks on the package's
        inputs; the log goes to `log`, so the stored build's own log stays."""
        package = self.graph.tree.packages[name]
        log.parent.mkdir(parents=True, exist_ok=True)
        caches = buildcache.empty(staging / "caches", _cache_paths(package))
        with log.open("wb") as out, scratch.held(self.store, staging, _scratch_paths(package)) as scratches:
            on_phase("sources")
            with contextlib.closing(self.prepare_root(package, staging / "work")) as root:
                self._steps(package, root, staging, log, out, on_phase, caches | scratches)
        shutil.rmtree(staging / "work")
        shutil.rmtree(staging / "caches", ignore_errors=True)
        return staging / "tree"

    def _commit(self, name: str, staging: Path, seconds: float) -> Entry:
        """Store a filled staging dir under the package's key; the caller holds the key's build lock."""
        meta = {
            "seconds": seconds,
            "platform": str(self.graph.tree.platform),
            "build_platform": str(self.graph.tree.builder_platform),
            "version": self.graph.tree.packages[name].version,
            "runner": self.runner.name,
        }
        TOKEN.check(f"package '{name}'")  # a cancelled run stores nothing
        return self.store.commit(self.keys[name], staging, name, meta, self.source_date_epoch)

    def build_graph(self, names: list[str], on_phase: Callable[[str, str], None], *, no_cache: bool) -> GraphResult:
        """Build `names` at once on a whole-graph runner and store what it built; the caller holds their locks.

        With `no_cache`, a stored entry is replaced only once its rebuild succeeded.
        """
        runner = self.runner
        if not isinstance(runner, GraphRunner):
            raise BuildError(f"the {runner.name} runner builds one package at a time")
        needed = self._needed(names)
        with contextlib.ExitStack() as stack:
            prebuilt = {}
            for name in needed:
                if name not in names:
                    prebuilt[name] = stack.enter_context(self.store.use(self.keys[name])).tree
            seed = Layer(stack.enter_context(self.store.use(self.seed_key)).tree, "/", self.seed_key)
            stagings = {name: stack.enter_context(self.store.fresh_staging(self.keys[name])) for name in names}
            logs = {name: stack.enter_context(self._open_log(name)) for name in names}
            state = self.store.root / runner.name
            state.mkdir(parents=True, exist_ok=True)
            stack.enter_context(self.store.lock(f"{runner.name}-context"))
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=self.store.tmp_dir, prefix="graph-")))
            job = GraphJob(
                self.graph,
                self.keys,
                needed,
                {name: staging / "tree" for name, staging in stagings.items()},
                prebuilt,
                seed,
                self.place_sources,
                self.source_date_epoch,
                self.make_jobs,
                logs,
                on_phase,
                log=logs_dir(self.store) / f"_{runner.name}" / "last.log",
                state=state,
                scratch=scratch,
                no_cache=no_cache,
            )
            job.log.parent.mkdir(parents=True, exist_ok=True)
            result = runner.build_graph(job)
            if result.code == 0:
                for name in names:
                    if no_cache and self.store.has(self.keys[name]):
                        self.store.remove_locked(self.keys[name])
                    self._commit(name, stagings[name], result.seconds[name])
        return result

    def _needed(self, missing: list[str]) -> list[str]:
        """The missing packages and every stage their roots read, in build order."""
        wanted = set(missing)
        for name in missing:
            wanted.update(self.input_names(self.graph.tree.packages[name]))
        return [n for n in self.graph.order if n in wanted]

    @contextlib.contextmanager
    def _open_log(self, name: str) -> Iterator[IO[bytes]]:
        """logs/<name>/<key>.log, with last.log pointing at it."""
        path = log_path(self.store, name, self.keys[name])
        path.parent.mkdir(parents=True, exist_ok=True)
        last = path.parent / "last.log"
        with path.open("wb") as out:
            last.unlink(missing_ok=True)
            last.symlink_to(path.name)
            yield out

    def _steps(
        self,
        package: Package,
        root: BuildRoot,
        staging: Path,
        log: Path,
        out: IO[bytes],
        on_phase: Callable[[str], None],
        caches: dict[str, Path],
    ) -> None:
        """Run every snippet in order, with the step's cache and scratch directories; finalize into staging/tree."""
        name = package.name
        tree = self.graph.tree
        no_tests = cannot_run_reason(tree.platform.carch) if tree.cross else None
        for s_index, step in enumerate(package.steps, start=1):
            env = self.env(step.env)
            mounts = [(caches[path], path) for path in (*step.cache, *step.scratch)]
            for phase, script in step.snippets():
                if phase == "test" and no_tests:
                    on_phase(f"step {s_index} test skipped")
                    _mark(
                        out,
                        f"==> {name}: step {s_index} test SKIPPED: cannot run {tree.platform} programs: {no_tests}\n",
                    )
                    continue
                on_phase(f"step {s_index} {phase}")
                _mark(out, f"==> {name}: step {s_index} {phase}\n{script.rstrip()}\n")
                began = time.monotonic()
                code = root.run(script, env, out, network=step.network == "default", caches=mounts)
                _mark(out, f"==> {name}: step {s_index} {phase}: {time.monotonic() - began:.1f} s\n")
                if code != 0:
                    out.flush()
                    raise StepFailed(name, s_index, phase, script, log, code)
        on_phase("finalize")
        output = staging / "tree"
        output.mkdir(exist_ok=True)
        copies = [(f.source, f.to) for f in package.finalize]
        _mark(out, f"==> {name}: finalize {copies}\n")
        if copies and root.finalize(copies, output, out) != 0:
            out.flush()
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise BuildError(f"package '{name}' failed in finalize:\n" + "\n".join(tail))


def _cache_paths(package: Package) -> list[str]:
    return [path for step in package.steps for path in step.cache]


def _scratch_paths(package: Package) -> list[str]:
    return [path for step in package.steps for path in step.scratch]


def _mark(out: IO[bytes], text: str) -> None:
    out.write(text.encode())
    out.flush()
