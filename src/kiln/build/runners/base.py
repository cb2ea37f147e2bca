"""What a runner is: a build root it opens for one package, or a whole graph it builds at once.

The Builder asks a runner to `open` a package's `RootPlan` (kiln.build.rootplan), places
sources in the root's `build_dir`, then runs snippets and finalize through the `BuildRoot`
protocol; every runner ends with kiln.core.treecopy's finalize rules. A `GraphRunner`
(BuildKit) instead gets every missing package of a run as one `GraphJob`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from kiln.build.rootplan import Layer, RootPlan
from kiln.pkg.graph import Graph
from kiln.pkg.model import Package

Caches = Sequence[tuple[Path, str]]


class BuildRoot(Protocol):
    """One package's root on some runner, alive until `close`."""

    @property
    def build_dir(self) -> Path:
        """Host directory whose contents appear at /tmp/build; filled before the first `run`."""
        ...

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()) -> int:
        """Run one snippet with `set -eu` in /tmp/build, output to the log; returns its exit code.

        `caches` are (host directory, path in the root) of the step's `cache:` (kiln.build.buildcache);
        a runner that cannot mount host directories runs with them empty, which changes no output.
        """
        ...

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        """Copy each `from` of the root to `to` under the host directory `out`; non-zero on failure."""
        ...

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        """An interactive process in the root, attached to the caller's terminal."""
        ...

    def close(self) -> None:
        """Release what the root holds (mounts, containers); the host work dir is the caller's."""
        ...


class Runner(Protocol):
    """Where steps run: `sandbox` (bubblewrap), `docker` (an engine through the SDK) or `buildkit`."""

    name: str

    def open(self, plan: RootPlan, work: Path) -> BuildRoot:
        """A root for `plan` using `work` (an empty host dir) for its state."""
        ...


@dataclass
class GraphJob:
    """Every missing package of a run, for a runner that builds them in one solve (BuildKit).

    The scheduler has locked each missing key and the builder has made its staging tree
    and log; the runner only fills `trees` (each still empty) and writes `logs`.
    """

    graph: Graph
    keys: dict[str, str]
    needed: list[str]  # build order: the missing packages and the stored ones their roots read
    trees: dict[str, Path]  # missing package -> its empty staging tree
    prebuilt: dict[str, Path]  # stored package -> its tree
    seed: Layer
    place_sources: Callable[[Package, Path], None]
    source_date_epoch: int
    jobs: int
    logs: dict[str, IO[bytes]]
    on_phase: Callable[[str, str], None]  # (package, text)
    log: Path  # where the runner writes its full log of the solve
    state: Path  # the runner's own directory in the store, held by this job alone
    scratch: Path  # an empty directory on the store's filesystem, removed after the job
    no_cache: bool = False


@dataclass
class GraphResult:
    """How a whole-graph build ended: on a non-zero `code` nothing is stored, `failed` names the culprits."""

    code: int
    log: Path  # the runner's full log of the solve (job.log)
    seconds: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    tail: str = ""


@runtime_checkable
class GraphRunner(Runner, Protocol):
    """A runner that builds the missing part of a graph at once; the scheduler locks, the builder stores."""

    def build_graph(self, job: GraphJob) -> GraphResult:
        """Build every package of `job.trees` into its tree; never touches the store itself."""
        ...
