"""The embedded runner: overlayfs build roots and bubblewrap namespaces, no daemon.

A build root is the variant's base plus every dependency output at its `to`,
stacked as read-only overlayfs lower layers with a per-build upper directory, so
a 1 GiB dependency costs one mount, not a copy, and the store is never written.
Mounts live in a private mount namespace (`unshare`), so they vanish with the
process even when it is killed. Each snippet then runs under `bwrap` with new
user, mount, pid, ipc, uts and network namespaces, a cleared environment and
Docker's default capability set.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kiln.build.runners.base import BUILD_DIR, CAPABILITIES, Layer, RootPlan, base_env, finalize_script
from kiln.errors import BuildError

__all__ = ["BuildRoot", "Layer", "SandboxRoot", "SandboxRunner", "base_env", "bwrap_args", "finalize_script"]

# Mounts overlays given as "lowers|upper|work|target" arguments up to "--", then execs the rest.
_MOUNT_SCRIPT = r"""
set -eu
while [ "$1" != "--" ]; do
    spec=$1
    lowers=${spec%%|*}; spec=${spec#*|}
    upper=${spec%%|*}; spec=${spec#*|}
    work=${spec%%|*}; target=${spec#*|}
    mkdir -p "$target"
    mount -t overlay kiln -o "lowerdir=$lowers,upperdir=$upper,workdir=$work" "$target"
    shift
done
shift
exec "$@"
"""

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if kiln is killed, so is the sandbox."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class BuildRoot:
    """A package's root: layers (top first) under writable uppers kept in `work`."""

    work: Path
    layers: list[Layer]
    mounts: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.work / "root"

    @property
    def build_dir(self) -> Path:
        """/tmp/build as seen from the host before mounting (it lives in the root's upper)."""
        return self.work / "upper0" / "tmp" / "build"

    def prepare(self) -> None:
        """Create uppers and short links to the layers (overlay's option string is capped at 4 KiB)."""
        groups: dict[str, list[Path]] = {"/": []}
        for layer in self.layers:
            groups.setdefault(os.path.normpath(layer.at), []).append(layer.tree)
        links = self.work / "l"
        links.mkdir(parents=True, exist_ok=True)
        empty = self.work / "empty"
        empty.mkdir(exist_ok=True)
        self.mounts = []
        counter = 0
        # "/" first, then deeper paths, so each nested overlay stacks on what is below it.
        ordered = sorted(groups, key=lambda p: (0 if p == "/" else p.count("/"), p))
        for index, at in enumerate(ordered):
            names = []
            for tree in groups[at]:
                link = links / str(counter)
                if not link.is_symlink():
                    link.symlink_to(tree)
                names.append(str(link))
                counter += 1
            target = self.root if at == "/" else self.root / at.lstrip("/")
            if at == "/":
                names = names or [str(empty)]
            else:
                # Keep what the layers below already had at this path.
                names.append(str(target))
            upper, work = self.work / f"upper{index}", self.work / f"work{index}"
            upper.mkdir(exist_ok=True)
            work.mkdir(exist_ok=True)
            self.mounts.append(f"{':'.join(names)}|{upper}|{work}|{target}")
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.work / "upper0" / "tmp").chmod(0o1777)

    def command(self, inner: Sequence[str]) -> list[str]:
        """`inner` run inside a private mount namespace with the overlays mounted."""
        return [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", _MOUNT_SCRIPT, "kiln-mount", *self.mounts, "--", *inner,
        ]


def bwrap_args(root: Path, env: dict[str, str], network: bool, interactive: bool = False) -> list[str]:
    """The bubblewrap command for a process whose / is `root`."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--hostname", "kiln"]
    if network:
        args += ["--share-net"]
        if Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    if not interactive:
        args += ["--new-session"]
    args += ["--uid", "0", "--gid", "0", "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev"]
    args += ["--cap-drop", "ALL"]
    for cap in CAPABILITIES:
        args += ["--cap-add", cap]
    args += ["--clearenv", "--chdir", BUILD_DIR]
    for name, value in sorted(env.items()):
        args += ["--setenv", name, value]
    return args


class SandboxRunner:
    """Runs a package's snippets and finalize in its build root."""

    name = "sandbox"

    def __init__(self) -> None:
        for tool in ("bwrap", "unshare", "mount"):
            if shutil.which(tool) is None:
                raise BuildError(f"the sandbox runner needs '{tool}': run scripts/setup-host.sh")

    def run(self, root: BuildRoot, script: str, env: dict[str, str], network: bool, log: IO[bytes]) -> int:
        """Run one snippet with `set -eu` in /tmp/build, output to the log; returns its exit code."""
        inner = [*bwrap_args(root.root, env, network), "/bin/sh", "-euc", script, "kiln-step"]
        return _call(root.command(inner), log)

    def finalize(self, root: BuildRoot, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        """Copy the finalize paths out of the merged root (outside bwrap, inside the mounts)."""
        return _call(root.command(["sh", "-c", finalize_script(root.root, copies, out)]), log)

    def shell(self, root: BuildRoot, env: dict[str, str], command: list[str]) -> int:
        """An interactive process in the build root, attached to the caller's terminal."""
        inner = [*bwrap_args(root.root, env, network=False, interactive=True), *command]
        return subprocess.call(root.command(inner), preexec_fn=_die_with_parent)

    def open(self, plan: RootPlan, work: Path) -> SandboxRoot:
        """The Runner protocol: an overlay root of the plan's layers, prepared in `work`."""
        root = BuildRoot(work, plan.layers)
        root.prepare()
        return SandboxRoot(self, root)


@dataclass
class SandboxRoot:
    """The BuildRoot protocol over an overlay root; nothing to release, the mounts die with each call."""

    runner: SandboxRunner
    overlay: BuildRoot

    @property
    def build_dir(self) -> Path:
        return self.overlay.build_dir

    def run(self, script: str, env: dict[str, str], network: bool, log: IO[bytes]) -> int:
        return self.runner.run(self.overlay, script, env, network, log)

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        return self.runner.finalize(self.overlay, copies, out, log)

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        return self.runner.shell(self.overlay, env, command)

    def close(self) -> None:
        pass


def _call(command: list[str], log: IO[bytes]) -> int:
    log.flush()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
    )
    try:
        return process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise
