"""A package's build root, as every runner and the Dockerfile export see it: layers, environment, overlay order.

The Builder describes a root as a `RootPlan`; the runners (kiln.build.runners) make it real
and the export (kiln.build.dockerfile) writes it as Dockerfile stages. Keeping the
environment, the capability set and the overlay order here, once, is what makes one package
give one output tree on every runner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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


def cache_name(path: str) -> str:
    """The name a step cache's directory gets outside the root, for a cache path inside it (the
    host directory of kiln.build.buildcache, BuildKit's cache mount id)."""
    return hashlib.sha256(path.encode()).hexdigest()[:16]
