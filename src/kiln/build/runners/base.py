"""What every runner shares: the shape of a build root, the step environment, finalize semantics.

The Builder describes a package's root as a `RootPlan` (runner-independent), asks a
runner to `open` it, places sources in the root's `build_dir`, then runs snippets and
finalize through the `BuildRoot` protocol. Keeping the environment and capability set
here, and the finalize copy rules in kiln.build.runners.finalize (which every runner
ends with), is what makes one package give one output tree on every runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, TypeVar

PATH = "/toolchain/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Docker's default capabilities: steps may chown, setuid and mknod in their own root,
# but not mount, load modules or touch the host's network configuration.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)

BUILD_DIR = "/tmp/build"

# Engines add variables of their own (Docker sets HOSTNAME); the wrapper drops them so a
# snippet sees exactly base_env + the step's env, as under bubblewrap's --clearenv.
STEP_WRAPPER = 'unset HOSTNAME; cd /tmp/build && exec /bin/sh -euc "$1" kiln-step'


def base_env(source_date_epoch: int, jobs: int) -> dict[str, str]:
    """What every step sees before its declared env."""
    return {
        "PATH": PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "SHELL": "/bin/sh",
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "KILN_JOBS": str(jobs),
    }


@dataclass(frozen=True)
class Layer:
    """A read-only tree (host path) that appears at `at` in the build root; `key` is its store entry."""

    tree: Path
    at: str = "/"
    key: str = ""


T = TypeVar("T")


def overlay_order(items: Iterable[tuple[str, T]], *, with_root: bool = False) -> list[tuple[str, list[T]]]:
    """Layers grouped by the (normalized) path they land at, in the order every runner stacks them.

    "/" first, then shallower paths before deeper ones, ties by path, so each nested group stacks
    on what is below it; a group keeps the plan's order (top layer first, as overlayfs' lowerdir
    lists it), and runners that copy instead of mounting apply it reversed. One rule for the
    sandbox, docker and the Dockerfile export is what keeps their outputs byte-identical.
    `with_root` keeps a "/" group even when no layer lands there.
    """
    groups: dict[str, list[T]] = {"/": []} if with_root else {}
    for at, item in items:
        groups.setdefault(at, []).append(item)
    return [(at, groups[at]) for at in sorted(groups, key=lambda p: (0 if p == "/" else p.count("/"), p))]


@dataclass(frozen=True)
class RootPlan:
    """A package's build root: the variant's base (seed, toolchain) under its dependency outputs."""

    name: str
    key: str
    variant: str
    deps: tuple[Layer, ...] = ()  # top first, as the overlay stacks them
    toolchain: Layer | None = None
    seed: Layer | None = None

    @property
    def layers(self) -> list[Layer]:
        """Every layer, top first: dependencies, then the toolchain, then the seed."""
        return [*self.deps, *([self.toolchain] if self.toolchain else []), *([self.seed] if self.seed else [])]

    @property
    def base(self) -> list[Layer]:
        """The layers every package of this variant shares (bottom first)."""
        return [*([self.seed] if self.seed else []), *([self.toolchain] if self.toolchain else [])]


class BuildRoot(Protocol):
    """One package's root on some runner, alive until `close`."""

    @property
    def build_dir(self) -> Path:
        """Host directory whose contents appear at /tmp/build; filled before the first `run`."""
        ...

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool) -> int:
        """Run one snippet with `set -eu` in /tmp/build, output to the log; returns its exit code."""
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
    """Where steps run: `sandbox` (bubblewrap) or `docker` (an engine through the SDK)."""

    name: str

    def open(self, plan: RootPlan, work: Path) -> BuildRoot:
        """A root for `plan` using `work` (an empty host dir) for its state."""
        ...
