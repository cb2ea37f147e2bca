"""Making the seed root (stage0): debootstrap, or a user's tarball or OCI archive (kiln.build.seed_import).

The seed is stored like any package output, under the key of its definition, so
it is made once per definition and store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kiln.build.seed_import import import_tarball
from kiln.build.store import Entry, Store
from kiln.core.errors import BuildError
from kiln.pkg.stage0 import Stage0
from kiln.pkg.variables import Platform

STAGE0_NAME = "stage0"

# Emptied in the stored seed: caches that only make it bigger and vary between runs, and
# /dev, whose device nodes the store refuses (the sandbox mounts its own /dev).
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "dev")


def ensure_stage0(
    stage0: Stage0,
    key: str,
    platform: Platform,
    cross_to: str | None,
    store: Store,
    log_dir: Path,
    say: Callable[[str], None],
    source_date_epoch: int,
) -> Entry:
    """The seed's store entry, made now if it is missing (under the store lock).

    `platform` is what the seed runs as (the build machine's); `cross_to` the target arch
    of a cross build, whose compilers it adds (stage0.yaml's `cross`).
    """
    if store.has(key):
        return store.entry(key)
    with store.lock(key):
        if store.has(key):
            return store.entry(key)
        staging = store.staging(key)
        tree = staging / "tree"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{key}.log"
        start = time.monotonic()
        with store.hold_staging_lock(staging), log_path.open("wb") as log:
            if stage0.tarball is not None:
                say(f"stage0: importing {stage0.tarball}")
                import_tarball(stage0.tarball, tree, platform)
            else:
                packages = stage0.packages(cross_to)
                cross = f", cross-compiling for {cross_to}" if cross_to else ""
                say(f"stage0: debootstrap {stage0.suite} ({len(packages)} extra packages{cross}), about a minute")
                debootstrap(stage0, platform, packages, tree, log, log_path)
            for rel in _PRUNE:
                target = tree / rel
                if target.is_dir():
                    shutil.rmtree(target)
                    target.mkdir(parents=True)
            (tree / "tmp").mkdir(exist_ok=True)
            (tree / "tmp").chmod(0o1777)
            meta = {"stage0": stage0.identity(cross_to), "seconds": round(time.monotonic() - start, 1)}
            entry = store.commit(key, staging, STAGE0_NAME, meta, source_date_epoch)
        say(f"stage0: stored as {key[:12]} in {time.monotonic() - start:.0f} s")
        return entry


def debootstrap(
    stage0: Stage0, platform: Platform, packages: tuple[str, ...], tree: Path, log: object, log_path: Path
) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed: run scripts/setup-host.sh")
    if os.geteuid() != 0:
        raise BuildError("debootstrap needs root; or give a root tarball with --from-tar")
    # In a mount namespace of its own: the /proc debootstrap mounts in the tree dies with it, even
    # when it is killed (a /proc left mounted under the store's tmp/ turns a later cleanup of that
    # directory into an rm through /proc).
    command = ["unshare", "--mount", "--propagation", "private"]
    command += ["debootstrap", f"--variant={stage0.variant}", f"--arch={platform.arch}"]
    if packages:
        command.append("--include=" + ",".join(packages))
    command += [stage0.suite, str(tree), stage0.mirror]
    result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        raise BuildError(
            f"debootstrap failed (exit {result.returncode}); last lines of {log_path}:\n" + "\n".join(tail)
        )
