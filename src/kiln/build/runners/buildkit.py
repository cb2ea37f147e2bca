"""The buildkit runner: the graph exported as one Dockerfile (kiln.build.dockerfile), built by BuildKit.

It finds a client that can run BuildKit builds, probes what its Dockerfile frontend supports
(per-RUN networks), builds the packages the scheduler hands it in one solve and splits
BuildKit's log by package. Locking and storing are the scheduler's and the builder's, as
for every runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from kiln.build.cancel import TOKEN
from kiln.build.dockerfile import OUTPUTS, Exporter
from kiln.build.rootplan import Layer, RootPlan
from kiln.build.runners.base import GraphJob, GraphResult
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
            with TOKEN.stopper(process.kill):  # a cancelled run stops the solve with its client
                for line in process.stdout:
                    out.write(line)
                    log.feed(line.rstrip("\n"))
        except BaseException:
            process.kill()
            raise
        finally:
            process.stdout.close()
        code = process.wait()
        TOKEN.check("buildkit")  # killed by a cancel: not a package failure
        return code


# --- the runner ----------------------------------------------------------------------------------------------------


class BuildKitRunner:
    """Builds the missing part of a graph in one BuildKit solve; packages never run one by one through `open`.

    The scheduler claims the keys and the builder stores the trees, as for every runner:
    this class only exports, runs the client and splits its log.
    """

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

    def build_graph(self, job: GraphJob) -> GraphResult:
        """Export the closure (stored packages as prebuilt inputs), build the missing ones, move their trees."""
        seed_tag, engine_id = _seed_image(job.seed)
        flags = probe_network_flag(self.client, seed_tag, job.state / "features.json", engine_id)
        exporter = Exporter(
            job.graph,
            job.keys,
            job.seed.key,
            job.place_sources,
            job.source_date_epoch,
            job.jobs,
            network_flags=flags,
            prebuilt=job.prebuilt,
        )
        export = exporter.write(job.needed, {n: job.keys[n] for n in job.trees}, job.state / "context")
        if export.networked and not flags:
            raise BuildError(
                f"{', '.join(export.networked)} declare network: default, and this BuildKit frontend "
                f"({self.client.version}) cannot give one RUN a network and another none; build them with "
                "--runner sandbox or docker, or use buildx with a current frontend"
            )

        def on_line(package: str, line: str) -> None:
            if package in job.logs:
                job.logs[package].write(line.encode() + b"\n")
                job.logs[package].flush()
                job.on_phase(package, line.split("] ", 1)[-1][:60] if "] " in line else "building")

        log = BuildLog(export.stages, on_line)
        dest = job.scratch / "out"
        start = time.monotonic()
        code = run_build(
            self.client,
            export.context,
            dest,
            {"KILN_STAGE0": seed_tag},
            network_none=not flags and not export.networked,
            no_cache=job.no_cache,
            log=log,
            full_log=job.log,
        )
        total = round(time.monotonic() - start, 2)
        result = GraphResult(code, job.log)
        if code != 0:
            result.failed = log.failed or list(job.trees)
            result.tail = "\n".join(job.log.read_text(errors="replace").splitlines()[-30:])
            return result
        for name, tree in job.trees.items():
            tree.rmdir()
            os.rename(dest / job.keys[name], tree)
            result.seconds[name] = round(log.seconds.get(name, total), 2)
        return result


def _seed_image(seed: Layer) -> tuple[str, str]:
    """The seed's image reference and the engine's ID (for the feature probe's cache).

    A remote builder cannot see this engine's images: KILN_STAGE0_IMAGE names the seed in a registry.
    """
    from kiln.build.runners.docker import client, ensure_stage0_image

    seed_tag = os.environ.get("KILN_STAGE0_IMAGE", "")
    if seed_tag:
        return seed_tag, "remote"
    engine = client()
    return ensure_stage0_image(engine, seed.tree, seed.key), str(engine.info().get("ID", ""))
