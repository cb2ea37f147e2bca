"""Wiring for the build verbs: a loaded graph plus store, fetcher and runner.

The CLI parses arguments and calls these; tests and benchmarks call them too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.build.bootstrap import ensure_stage0
from kiln.build.builder import Builder, logs_dir
from kiln.build.fetch import Fetcher, load_mirrors
from kiln.build.keys import compute_keys, stage0_key
from kiln.build.progress import LiveProgress, PlainProgress, download_progress
from kiln.build.runners.sandbox import SandboxRunner
from kiln.build.scheduler import FAILED, Outcome, Progress, Scheduler
from kiln.build.store import Store
from kiln.errors import BuildError, InputError
from kiln.paths import cache_dir
from kiln.pkg.graph import Graph

RUNNERS = ("sandbox",)


@dataclass
class Session:
    graph: Graph
    keys: dict[str, str]
    store: Store
    builder: Builder

    @classmethod
    def open(cls, graph: Graph, runner: str = "sandbox", make_jobs: int | None = None) -> Session:
        if runner not in RUNNERS:
            raise InputError(f"unknown runner {runner!r}: choose one of {', '.join(RUNNERS)}")
        keys = compute_keys(graph)
        store = Store(cache_dir())
        fetcher = Fetcher(cache_dir(), load_mirrors(graph.tree.project_root), download_progress())
        sde = int(graph.tree.variables.get("source_date_epoch", 0))
        builder = Builder(graph, keys, store, fetcher, SandboxRunner(), make_jobs or os.cpu_count() or 1, sde)
        return cls(graph, keys, store, builder)

    @property
    def source_date_epoch(self) -> int:
        return self.builder.source_date_epoch

    def needs_seed(self, names: list[str]) -> bool:
        return any(self.graph.tree.packages[n].variant in ("stage0", "toolchain") for n in names)

    def bootstrap(self, say: Callable[[str], None] = print) -> str:
        key = stage0_key(self.graph.tree)
        ensure_stage0(
            self.graph.tree.stage0, key, self.graph.tree.platform, self.store, logs_dir(self.store) / "stage0",
            say, self.source_date_epoch,
        )
        return key

    def build(
        self, targets: list[str], jobs: int, no_cache: bool, keep_going: bool, progress: Progress
    ) -> dict[str, Outcome]:
        names = self.graph.closure(targets)
        host = os.uname().machine
        if self.graph.tree.platform.carch != host:
            raise InputError(
                f"cannot build for {self.graph.tree.platform} on this {host} host: cross-arch builds "
                "(qemu-user in the sandbox) are not supported yet"
            )
        if self.needs_seed(names):
            self.bootstrap(lambda text: print(text, file=sys.stderr, flush=True))
        return Scheduler(self.builder, progress, jobs, no_cache, keep_going).run(targets)

    def export(self, names: list[str], out: Path) -> None:
        """Copy target outputs to out/<name>/ (hard links when on the same filesystem)."""
        for name in names:
            dest = out / name
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            source = self.store.tree(self.keys[name])
            result = subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(dest)], capture_output=True)
            if result.returncode != 0:
                raise BuildError(f"cannot export {name} to {dest}: {result.stderr.decode().strip()}")


def choose_progress(json_output: bool) -> Progress:
    if sys.stderr.isatty() and not json_output:
        return LiveProgress()
    return PlainProgress(sys.stderr)


def outcome_json(outcomes: dict[str, Outcome]) -> str:
    return json.dumps(
        {"packages": {o.name: {"key": o.key, "status": o.status, "seconds": o.seconds} for o in outcomes.values()}},
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
        outcomes = session.build(needs, jobs=os.cpu_count() or 1, no_cache=False, keep_going=False,
                                 progress=PlainProgress(sys.stderr))
        if failures(outcomes):
            raise BuildError(f"cannot open a shell: a dependency of '{target}' failed to build")
    elif session.needs_seed([target]):
        session.bootstrap(lambda text: print(text, file=sys.stderr))
    session.store.tmp_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=session.store.tmp_dir, prefix=f"shell-{target}-") as work:
        root = session.builder.prepare_root(package, Path(work))
        env = session.builder.env(package.steps[0].env if package.steps else ())
        env["PS1"] = f"kiln:{target}:\\w# "
        print(f"kiln: shell in {target}'s build root; changes are discarded on exit", file=sys.stderr)
        return session.builder.runner.shell(root, env, command)

