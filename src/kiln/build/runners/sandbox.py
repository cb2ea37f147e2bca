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
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kiln.build.cancel import TOKEN, kill_group
from kiln.build.rootplan import BUILD_DIR, CAPABILITIES, Layer, RootPlan, base_env, overlay_order
from kiln.build.runners.base import Caches
from kiln.build.runners.mounter import encode, overlay_options
from kiln.core.errors import BuildError
from kiln.core.paths import spec_parts

__all__ = ["Layer", "OverlayRoot", "SandboxRoot", "SandboxRunner", "base_env", "bwrap_args"]

# The mount helper runs with the interpreter and the kiln package running now (PYTHONPATH,
# see _helper_env), no current directory on its path (-P), whatever the caller's directory
# holds, and no site packages (-S: it needs only the standard library; starts faster).
_KILN_PARENT = str(Path(__file__).resolve().parents[3])
# (-c with this constant, not -m: runpy alone costs a step about as much as the helper's work.)
_MOUNTER = [
    sys.executable,
    "-S",
    "-P",
    "-c",
    "import sys; from kiln.build.runners.mounter import main; sys.exit(main(sys.argv[1:]))",
]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if kiln is killed, so is the sandbox."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class OverlayRoot:
    """A package's root: layers (top first) under writable uppers kept in `work`."""

    work: Path
    layers: list[Layer]
    mounts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.work / "root"

    @property
    def build_dir(self) -> Path:
        """/tmp/build as seen from the host before mounting (it lives in the root's upper)."""
        return self.work / "upper0" / "tmp" / "build"

    def prepare(self) -> None:
        """Create uppers and short links to the layers (overlay's option string is capped at 4 KiB).

        Each layer's `at` is checked here and resolved inside the merged root only when
        mounted (by the mount helper), where the layers below it are visible.
        """
        ordered = overlay_order(
            (("/" + "/".join(spec_parts(layer.at, "dependency 'to'")), layer.tree) for layer in self.layers),
            with_root=True,
        )
        links = self.work / "l"
        links.mkdir(parents=True, exist_ok=True)
        empty = self.work / "empty"
        empty.mkdir(exist_ok=True)
        self.mounts = []
        counter = 0
        for index, (at, trees) in enumerate(ordered):
            names = []
            for tree in trees:
                link = links / str(counter)
                if not link.is_symlink():
                    link.symlink_to(tree)
                names.append(str(link))
                counter += 1
            if at == "/":
                names = names or [str(empty)]
            upper, work = self.work / f"upper{index}", self.work / f"work{index}"
            upper.mkdir(exist_ok=True)
            work.mkdir(exist_ok=True)
            self.mounts.append({"lowers": names, "upper": str(upper), "work": str(work), "at": at})
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.work / "upper0" / "tmp").chmod(0o1777)

    def plan(self, finalize: dict[str, Any] | None = None) -> list[str]:
        """The mount helper's arguments (kiln.build.runners.mounter.encode)."""
        return encode(str(self.root), str(self.work / "l"), self.mounts, finalize)

    def command(self, inner: Sequence[str]) -> list[str]:
        """`inner` run inside a private mount namespace with the overlays mounted.

        A root of `/` layers only (most packages) needs no path resolved: one mount with
        options built and checked here, by a constant script. Nested `to`s need the helper.
        """
        if len(self.mounts) == 1:
            top = self.mounts[0]
            options = overlay_options(top["lowers"], top["upper"], top["work"])
            return [*_NAMESPACE, "sh", "-c", _MOUNT_ROOT, "kiln-mount", options, str(self.root), *inner]
        return [*_NAMESPACE, *_MOUNTER, *self.plan(), *inner]

    def finalize_command(self, copies: list[tuple[str, str]], out: Path) -> list[str]:
        """The finalize copy run inside the namespace, over the merged root (no shell, no bwrap)."""
        return [*_NAMESPACE, *_MOUNTER, *self.plan({"copies": copies, "out": str(out)})]


_NAMESPACE = ["unshare", "--mount", "--propagation", "private"]
# Mounts one overlay ($1 options, $2 target: both Kiln's own paths), then execs the rest.
_MOUNT_ROOT = 'mkdir -p "$2" && mount -t overlay kiln -o "$1" "$2" && shift 2 && exec "$@"'


def bwrap_args(
    root: Path, env: dict[str, str], *, network: bool, interactive: bool = False, caches: Caches = ()
) -> list[str]:
    """The bubblewrap command for a process whose / is `root`, with the step's cache directories bound in."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--hostname", "kiln"]
    if network:
        args += ["--share-net"]
        if Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    if not interactive:
        args += ["--new-session"]
    args += ["--uid", "0", "--gid", "0", "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev"]
    for host, inside in caches:
        args += ["--bind", str(host), "/" + "/".join(spec_parts(inside, "cache path"))]
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

    def run(
        self, root: OverlayRoot, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()
    ) -> int:
        """Run one snippet with `set -eu` in /tmp/build, output to the log; returns its exit code."""
        inner = [*bwrap_args(root.root, env, network=network, caches=caches), "/bin/sh", "-euc", script, "kiln-step"]
        return _call(root.command(inner), log)

    def finalize(self, root: OverlayRoot, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        """Copy the finalize paths out of the merged root (outside bwrap, inside the mounts).

        The copy is kiln.core.treecopy, run by the mount helper: no shell, no host
        view of the root's symlinks; it exits FINALIZE_FAILED with the reason in the log.
        """
        return _call(root.finalize_command(copies, out), log)

    def shell(self, root: OverlayRoot, env: dict[str, str], command: list[str]) -> int:
        """An interactive process in the build root, attached to the caller's terminal."""
        inner = [*bwrap_args(root.root, env, network=False, interactive=True), *command]
        return subprocess.call(root.command(inner), preexec_fn=_die_with_parent, env=_helper_env())

    def open(self, plan: RootPlan, work: Path) -> SandboxRoot:
        """The Runner protocol: an overlay root of the plan's layers, prepared in `work`."""
        root = OverlayRoot(work, plan.layers)
        root.prepare()
        return SandboxRoot(self, root)


@dataclass
class SandboxRoot:
    """The BuildRoot protocol over an overlay root; nothing to release, the mounts die with each call."""

    runner: SandboxRunner
    overlay: OverlayRoot

    @property
    def build_dir(self) -> Path:
        return self.overlay.build_dir

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()) -> int:
        return self.runner.run(self.overlay, script, env, log, network=network, caches=caches)

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        return self.runner.finalize(self.overlay, copies, out, log)

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        return self.runner.shell(self.overlay, env, command)

    def close(self) -> None:
        pass


def _call(command: list[str], log: IO[bytes]) -> int:
    """Run a step's process in a group of its own, which a cancelled run kills (see kiln.build.cancel).

    Its own group: a terminal's Ctrl-C reaches kiln alone, which decides. Killing the group
    kills bwrap, and --die-with-parent takes the sandbox (in a session of its own) with it.
    """
    TOKEN.check("step")
    log.flush()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
        env=_helper_env(),
        process_group=0,
    )
    try:
        with TOKEN.stopper(kill_group(process.pid)):
            code = process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise
    TOKEN.check("step")  # killed by a cancel: not a step failure
    return code


def _helper_env() -> dict[str, str]:
    """The caller's environment with this kiln first on PYTHONPATH (bwrap clears it for steps)."""
    paths = [_KILN_PARENT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
