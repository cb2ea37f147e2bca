"""The buildkit runner: the graph exported as one Dockerfile (kiln.build.dockerfile), built by BuildKit.

It finds a client that can run BuildKit builds, probes what its Dockerfile frontend supports
(per-RUN networks), builds what the store lacks, splits BuildKit's log by package and stores
each output as every runner does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

from kiln.build.builder import Builder, log_path, logs_dir
from kiln.build.dockerfile import OUTPUTS, Exporter
from kiln.build.runners.base import RootPlan
from kiln.build.scheduler import BUILT, CACHED, FAILED, Outcome, Progress
from kiln.build.store import Store
from kiln.core.errors import BuildError

_UNKNOWN_FLAG = re.compile(r"unknown flag: network", re.IGNORECASE)


# --- running it ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    """How to run a BuildKit build here: `docker buildx build`, or a pre-23 client with DOCKER_BUILDKIT=1."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    version: str

    def environ(self) -> dict[str, str]:
        return {**os.environ, **dict(self.env)}


def find_client() -> Client:
    """The first docker CLI that can run a BuildKit build ($KILN_DOCKER first, then PATH, then /usr/bin).

    Docker 23+ clients hand `docker build` to buildx and fail without it; clients before 23
    (Debian's docker.io 20.10) carry a BuildKit client of their own behind DOCKER_BUILDKIT=1.
    """
    candidates = [os.environ.get("KILN_DOCKER"), shutil.which("docker"), "/usr/bin/docker"]
    seen: list[str] = []
    for cand in candidates:
        if not cand or cand in seen or not os.access(cand, os.X_OK):
            continue
        seen.append(cand)
        buildx = subprocess.run([cand, "buildx", "version"], capture_output=True, text=True)
        if buildx.returncode == 0:
            return Client((cand, "buildx", "build"), (), buildx.stdout.strip())
        version = subprocess.run([cand, "--version"], capture_output=True, text=True).stdout.strip()
        match = re.search(r"version (\d+)\.", version)
        if match and int(match.group(1)) < 23:
            return Client((cand, "build"), (("DOCKER_BUILDKIT", "1"),), version)
    raise BuildError(
        "no docker client here can run BuildKit builds: install the buildx plugin, or Debian's docker.io "
        f"(its /usr/bin/docker 20.10 builds with DOCKER_BUILDKIT=1); tried {', '.join(seen) or 'nothing'}"
    )


def probe_network_flag(client: Client, base_image: str, cache: Path, engine_id: str) -> bool:
    """Does this client's Dockerfile frontend take `RUN --network=`? Asked once per client and engine."""
    ident = hashlib.sha256(
        json.dumps([client.argv, client.version, engine_id, os.environ.get("BUILDX_BUILDER", "")]).encode()
    ).hexdigest()
    known: dict[str, bool] = {}
    if cache.is_file():
        try:
            known = json.loads(cache.read_text())
        except ValueError:
            known = {}
    if ident in known:
        return bool(known[ident])
    with tempfile.TemporaryDirectory(prefix="kiln-probe-") as tmp:
        (Path(tmp) / "Dockerfile").write_text(f"FROM {base_image}\nRUN --network=none true\n")
        probe = subprocess.run(
            [*client.argv, "--progress", "plain", "--no-cache", tmp],
            capture_output=True,
            text=True,
            env=client.environ(),
        )
    output = probe.stdout + probe.stderr
    if probe.returncode == 0:
        supported = True
    elif _UNKNOWN_FLAG.search(output):
        supported = False
    else:
        raise BuildError(f"a BuildKit probe build failed (exit {probe.returncode}):\n{output[-2000:]}")
    known[ident] = supported
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return supported


_VERTEX = re.compile(r"^#(\d+) \[([a-z0-9._-]+) \d+/\d+\]")
_ERROR = re.compile(r"^#(\d+) ERROR")
_DONE = re.compile(r"^#(\d+) DONE ([0-9.]+)s")
_ANY = re.compile(r"^#(\d+) ")


@dataclass
class BuildLog:
    """Splits BuildKit's plain progress into per-package logs and finds which package failed."""

    stages: dict[str, str]
    on_line: Callable[[str, str], None]  # (package, line)
    vertex: dict[str, str] = field(default_factory=dict)  # vertex id -> package
    failed: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def feed(self, line: str) -> None:
        match = _VERTEX.match(line)
        if match and match.group(2) in self.stages:
            self.vertex[match.group(1)] = self.stages[match.group(2)]
        any_match = _ANY.match(line)
        package = self.vertex.get(any_match.group(1)) if any_match else None
        if package is None:
            return
        self.on_line(package, line)
        if _ERROR.match(line) and package not in self.failed:
            self.failed.append(package)
        done = _DONE.match(line)
        if done:
            self.seconds[package] = self.seconds.get(package, 0.0) + float(done.group(2))


def run_build(
    client: Client,
    context: Path,
    dest: Path,
    build_args: dict[str, str],
    log: BuildLog,
    full_log: Path,
    *,
    network_none: bool,
    no_cache: bool,
) -> int:
    """Run the build of `kiln-outputs` into `dest`; returns the client's exit code."""
    argv = [*client.argv, "--progress", "plain", "--target", OUTPUTS, "--output", f"type=local,dest={dest}"]
    for name, value in sorted(build_args.items()):
        argv += ["--build-arg", f"{name}={value}"]
    if network_none:
        argv += ["--network", "none"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(str(context))
    full_log.parent.mkdir(parents=True, exist_ok=True)
    with full_log.open("w") as out:
        out.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=client.environ(), errors="replace"
        )
        assert process.stdout is not None
        try:
            for line in process.stdout:
                out.write(line)
                log.feed(line.rstrip("\n"))
        except BaseException:
            process.kill()
            raise
        finally:
            process.stdout.close()
        return process.wait()


# --- the runner ----------------------------------------------------------------------------------------------------


class BuildKitRunner:
    """Builds a whole closure in one BuildKit solve; packages never run one by one through `open`."""

    name = "buildkit"

    def __init__(self) -> None:
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        """Found on first use, so a build that finds everything stored never looks for one."""
        if self._client is None:
            self._client = find_client()
        return self._client

    def open(self, plan: RootPlan, work: Path) -> NoReturn:
        raise BuildError(
            f"package '{plan.name}': the buildkit runner builds the graph at once; "
            "use the sandbox or docker runner for a single root (kiln shell)"
        )

    def build_graph(
        self, builder: Builder, targets: list[str], progress: Progress, *, no_cache: bool
    ) -> dict[str, Outcome]:
        """Export the closure (stored packages as prebuilt inputs), build what is missing, store it."""
        graph, keys, store = builder.graph, builder.keys, builder.store
        names = graph.closure(targets)
        outcomes = {name: Outcome(name, keys[name]) for name in names}
        progress.begin(names)
        with contextlib.ExitStack() as stack:
            missing = _claim_missing(stack, builder, names, outcomes, progress, no_cache=no_cache)
            if not missing:
                progress.end(outcomes)
                return outcomes
            needed = _needed(builder, missing)
            prebuilt = {n: store.tree(keys[n]) for n in needed if n not in missing}
            for name in prebuilt:
                stack.enter_context(store.use(keys[name]))
            seed_tag, engine_id = _seed_image(store, builder.seed_key)
            flags = probe_network_flag(self.client, seed_tag, store.root / "buildkit" / "features.json", engine_id)
            exporter = Exporter(
                graph,
                keys,
                builder.seed_key,
                builder.place_sources,
                builder.source_date_epoch,
                builder.make_jobs,
                network_flags=flags,
                prebuilt=prebuilt,
            )
            for name in missing:
                progress.started(name)
            stack.enter_context(store.lock("buildkit-context"))
            context = store.root / "buildkit" / "context"
            export = exporter.write(needed, {n: keys[n] for n in missing}, context)
            if export.networked and not flags:
                raise BuildError(
                    f"{', '.join(export.networked)} declare network: default, and this BuildKit frontend "
                    f"({self.client.version}) cannot give one RUN a network and another none; build them with "
                    "--runner sandbox or docker, or use buildx with a current frontend"
                )
            store.tmp_dir.mkdir(parents=True, exist_ok=True)
            dest = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="buildkit-out-")))
            logs = {n: stack.enter_context(_package_log(store, n, keys[n])) for n in missing}

            def on_line(package: str, line: str) -> None:
                if package in logs:
                    logs[package].write(line + "\n")
                    logs[package].flush()
                    progress.phase(package, line.split("] ", 1)[-1][:60] if "] " in line else "building")

            log = BuildLog(export.stages, on_line)
            full_log = logs_dir(store) / "_buildkit" / "last.log"
            start = time.monotonic()
            code = run_build(
                self.client,
                context,
                dest,
                {"KILN_STAGE0": seed_tag},
                network_none=not flags and not export.networked,
                no_cache=no_cache,
                log=log,
                full_log=full_log,
            )
            total = round(time.monotonic() - start, 2)
            if code != 0:
                _mark_failed(builder, missing, outcomes, progress, code, log, full_log)
            else:
                for name in missing:
                    seconds = round(log.seconds.get(name, total), 2)
                    self._commit(builder, name, dest, seconds, no_cache=no_cache)
                    outcomes[name].status, outcomes[name].seconds = BUILT, seconds
                    progress.done(outcomes[name])
        progress.end(outcomes)
        return outcomes

    def _commit(self, builder: Builder, name: str, dest: Path, seconds: float, *, no_cache: bool) -> None:
        """Store the tree BuildKit wrote for `name` (under its key in `dest`); the caller holds the key's lock."""
        graph, store, key = builder.graph, builder.store, builder.keys[name]
        if no_cache and store.has(key):
            store.remove_locked(key)
        staging = store.staging(key)
        (staging / "tree").rmdir()
        os.rename(dest / key, staging / "tree")
        meta = {
            "seconds": seconds,
            "platform": str(graph.tree.platform),
            "version": graph.tree.packages[name].version,
            "runner": self.name,
        }
        store.commit(key, staging, name, meta, builder.source_date_epoch)


def _claim_missing(
    stack: contextlib.ExitStack,
    builder: Builder,
    names: list[str],
    outcomes: dict[str, Outcome],
    progress: Progress,
    *,
    no_cache: bool,
) -> list[str]:
    """Lock what is not stored (checked again under the locks) and report the rest as cached."""
    store, keys = builder.store, builder.keys
    missing = [n for n in names if no_cache or not store.has(keys[n])]
    for name in sorted(missing, key=lambda n: keys[n]):  # one order for every process: no deadlock
        stack.enter_context(store.lock(keys[name]))
    missing = [n for n in missing if no_cache or not store.has(keys[n])]
    for name in names:
        if name not in missing:
            store.touch(keys[name])
            outcomes[name].status = CACHED
            progress.done(outcomes[name])
    return missing


def _seed_image(store: Store, seed_key: str) -> tuple[str, str]:
    """The seed's image reference and the engine's ID (for the feature probe's cache).

    A remote builder cannot see this engine's images: KILN_STAGE0_IMAGE names the seed in a registry.
    """
    from kiln.build.runners.docker import client, ensure_stage0_image

    seed_tag = os.environ.get("KILN_STAGE0_IMAGE", "")
    if seed_tag:
        return seed_tag, "remote"
    engine = client()
    return ensure_stage0_image(engine, store.tree(seed_key), seed_key), str(engine.info().get("ID", ""))


def _mark_failed(
    builder: Builder,
    missing: list[str],
    outcomes: dict[str, Outcome],
    progress: Progress,
    code: int,
    log: BuildLog,
    full_log: Path,
) -> None:
    """The packages the log blames (all missing ones if it blames none) failed, with the log's tail."""
    culprits = log.failed or missing
    tail = "\n".join(full_log.read_text(errors="replace").splitlines()[-30:])
    for name in missing:
        outcome = outcomes[name]
        if name in culprits:
            outcome.status = FAILED
            outcome.error = BuildError(
                f"package '{name}' failed on buildkit (exit {code}); full log {full_log}, "
                f"package log {log_path(builder.store, name, builder.keys[name])}:\n{tail}"
            )
        progress.done(outcome)


def _needed(builder: Builder, missing: list[str]) -> list[str]:
    """The missing packages and every stage their roots read (in build order)."""
    graph = builder.graph
    wanted = set(missing)
    for name in missing:
        wanted.update(d.stage for d in graph.build_inputs(name))
        if graph.tree.packages[name].variant == "toolchain":
            wanted.add(graph.tree.toolchain)
    return [n for n in graph.order if n in wanted]


@contextlib.contextmanager
def _package_log(store: Store, name: str, key: str) -> Iterator[IO[str]]:
    path = log_path(store, name, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    last = path.parent / "last.log"
    with path.open("w") as out:
        last.unlink(missing_ok=True)
        last.symlink_to(path.name)
        yield out
