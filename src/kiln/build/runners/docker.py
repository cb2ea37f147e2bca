"""The docker runner: the same build roots on a Docker engine, driven through the docker SDK.

The seed is imported once per engine as the image `kiln/stage0:<key>` (and the seed
plus the toolchain output committed once as `kiln/base:<digest>`); each package then
gets a container from its base image with its dependency outputs written in at their
`to`, its sources at /tmp/build, the sandbox's environment, uid 0, Docker's default
capabilities (the sandbox's set) and no network unless a step declares it. Finalize
copies each path out with get_archive (which resolves it inside the container) into a
fresh directory of its own, then applies the same copy rules as the sandbox
(kiln.core.treecopy: no shell, no host view of symlinks), so the store sees
the tree the sandbox would give.

Everything crosses the engine API (no bind mounts), so a remote engine (`DOCKER_HOST`)
works the same as the local one.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from kiln.build.cancel import TOKEN
from kiln.build.rootplan import BUILD_DIR, CAPABILITIES, STEP_WRAPPER, Layer, RootPlan, overlay_order
from kiln.build.runners.base import Caches
from kiln.core.errors import BuildError
from kiln.core.hashing import CHUNK, json_sha256
from kiln.core.paths import join_inside, spec_parts
from kiln.core.treecopy import copy_path

STAGE0_REPO = "kiln/stage0"
BASE_REPO = "kiln/base"
SCRATCH_IMAGE = "kiln/scratch:empty"
LABEL = "io.kiln.build"

# Keeps a container alive between snippets; snippets run as execs beside it.
_IDLE = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]

# What Docker's init layer puts in every container's root (daemon/initlayer), and /dev, /proc and
# /sys, which runtimes mount over. None of it comes from the layers, so finalize takes these
# paths from the layers instead (or drops them), as the sandbox, which has no init layer, would.
_INIT_FILES = ("/.dockerenv", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/etc/mtab", "/dev/console")
_INIT_DIRS = ("/dev/pts", "/dev/shm", "/proc", "/sys", "/dev", "/etc")

_image_lock = threading.Lock()


def client() -> Any:
    """A docker SDK client for $DOCKER_HOST (or the local socket), with a clear error if none answers."""
    import docker

    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BuildError(
            f"no Docker engine answers at {where}: {exc}\n"
            "start one (`dockerd &` as root, see scripts/ci-services.sh) or set DOCKER_HOST"
        ) from None
    return engine


def stage0_tag(key: str) -> str:
    return f"{STAGE0_REPO}:{key}"


def tar_stream(tree: Path, members: str = ".") -> Iterator[bytes]:
    """A tar of `tree` (owners numeric, hard links kept) as chunks, made by GNU tar.

    Store trees never change, but hard-linking them into another store changes inode ctimes,
    which tar reports as "file changed as we read it" (exit 1): that is not an error here.
    """
    process = subprocess.Popen(
        ["tar", "-C", str(tree), "--numeric-owner", "--warning=no-file-changed", "-cf", "-", members],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        while chunk := process.stdout.read(CHUNK):
            yield chunk
    finally:
        process.stdout.close()
        err = process.stderr.read().decode(errors="replace") if process.stderr else ""
        if process.wait() not in (0, 1):
            raise BuildError(f"cannot archive {tree}: {err.strip()}")


def ensure_stage0_image(engine: Any, seed: Path, key: str) -> str:
    """`docker import` the stored seed once per engine, tagged by its key."""
    tag = stage0_tag(key)
    with _image_lock:
        if not _has_image(engine, tag):
            engine.api.import_image(src=tar_stream(seed), repository=STAGE0_REPO, tag=key, stream_src=True)
            if not _has_image(engine, tag):
                raise BuildError(f"importing the seed into the engine as {tag} failed")
    return tag


def _has_image(engine: Any, tag: str) -> bool:
    import docker.errors

    try:
        engine.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _empty_image(engine: Any) -> str:
    """An image with an empty root, for scratch packages."""
    with _image_lock:
        if not _has_image(engine, SCRATCH_IMAGE):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w"):
                pass
            repo, tag = SCRATCH_IMAGE.split(":")
            engine.api.import_image(src=buffer.getvalue(), repository=repo, tag=tag)
    return SCRATCH_IMAGE


def _dir_headers(paths: list[str]) -> bytes:
    """A tar of just directories (root-owned, 0755), to make the parents a layer is written into."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in paths:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 0, 0
            tar.addfile(info)
    return buffer.getvalue()


def _exists_in(layers: list[Layer], path: str) -> tuple[Layer, str] | None:
    """The topmost layer that has `path` (resolved inside the layer, never with the host's view), and
    the path relative to that layer's top; None if no layer has it."""
    for layer in layers:
        at = PurePosixPath("/", *spec_parts(layer.at, "dependency 'to'"))
        target = PurePosixPath(path)
        if target == at or at in target.parents:
            rel = str(target.relative_to(at))
            if os.path.lexists(join_inside(layer.tree, rel, follow_last=False)):
                return layer, rel
    return None


class DockerRunner:
    """Builds each package in a container of the engine at $DOCKER_HOST."""

    name = "docker"

    def __init__(self) -> None:
        self.engine = client()

    def open(self, plan: RootPlan, work: Path) -> DockerRoot:
        return DockerRoot(self, plan, work)

    def base_image(self, plan: RootPlan) -> str:
        """The image the package's container starts from: the seed, seed+toolchain, or an empty root."""
        if plan.seed is None:
            if plan.toolchain is not None:
                raise BuildError(f"package '{plan.name}': a toolchain without a seed is not a valid root")
            return _empty_image(self.engine)
        seed = ensure_stage0_image(self.engine, plan.seed.tree, plan.seed.key)
        if plan.toolchain is None:
            return seed
        tag = f"{BASE_REPO}:{json_sha256([plan.seed.key, plan.toolchain.key])}"
        with _image_lock:
            if not _has_image(self.engine, tag):
                container = self.engine.containers.create(seed, command=["/bin/true"], labels={LABEL: "base"})
                try:
                    container.put_archive("/", tar_stream(plan.toolchain.tree))
                    repo, _, name = tag.partition(":")
                    container.commit(repository=repo, tag=name)
                finally:
                    container.remove(force=True)
        return tag


@dataclass
class DockerRoot:
    """One package's container; created on the first snippet (or finalize), removed on close."""

    runner: DockerRunner
    plan: RootPlan
    work: Path
    container: Any = None
    network: bool | None = None
    images: list[str] = field(default_factory=list)  # intermediate commits, removed on close

    def __post_init__(self) -> None:
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.work / "context" / "tmp").chmod(0o1777)

    @property
    def build_dir(self) -> Path:
        return self.work / "context" / BUILD_DIR.lstrip("/")

    @property
    def engine(self) -> Any:
        return self.runner.engine

    def _create(self, image: str, *, network: bool, started: bool) -> Any:
        container = self.container = self.engine.containers.create(
            image,
            command=_IDLE,
            hostname="kiln",
            user="0:0",
            working_dir=BUILD_DIR,
            network_mode="bridge" if network else "none",
            cap_drop=["ALL"],
            cap_add=[c.removeprefix("CAP_") for c in CAPABILITIES],
            labels={LABEL: f"{self.plan.name}", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"},
        )
        self.network = network
        if started:
            container.start()
        return container

    def _populate(self) -> None:
        """Write dependency outputs (bottom first, shallow `to` first) and /tmp/build into the container."""
        placed = list(reversed(self.plan.base))
        for at, layers in overlay_order((os.path.normpath(layer.at), layer) for layer in self.plan.deps):
            if at != "/":
                missing = [str(p) for p in reversed(PurePosixPath(at).parents) if str(p) != "/"] + [at]
                missing = [p for p in missing if _exists_in(list(reversed(placed)), p) is None]
                if missing:
                    self.container.put_archive("/", _dir_headers(missing))
            for layer in reversed(layers):
                self.container.put_archive(at, tar_stream(layer.tree))
                placed.append(layer)
        self.container.put_archive("/", tar_stream(self.work / "context", "tmp"))

    def _start(self, *, network: bool, started: bool = True) -> None:
        if self.container is None:
            container = self._create(self.runner.base_image(self.plan), network=network, started=False)
            self._populate()
            if started:
                container.start()
        elif network != self.network:
            # Network mode is fixed per container: carry the root over to a new one.
            self.container.kill()
            image = self.container.commit()
            self.images.append(image.id)
            self.container.remove(force=True)
            self._create(image.id, network=network, started=started)

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()) -> int:
        """One snippet by `docker exec`; `caches` start empty (the engine may not share this host's disk)."""
        TOKEN.check("step")
        self._start(network=network)
        api = self.engine.api
        if caches:  # the directories exist, as where a runner binds them
            paths = ["/" + "/".join(spec_parts(inside, "cache path")) for _, inside in caches]
            self.container.exec_run(["mkdir", "-p", "--", *paths], user="0:0")
        exec_id = api.exec_create(
            self.container.id,
            ["/bin/sh", "-c", STEP_WRAPPER, "kiln-env", script],
            environment=env,
            workdir=BUILD_DIR,
            user="0:0",
        )["Id"]
        log.flush()
        with TOKEN.stopper(self.container.kill):  # a cancelled run kills the step with its container
            for chunk in api.exec_start(exec_id, stream=True):
                log.write(chunk)
        log.flush()
        TOKEN.check("step")  # killed by a cancel: not a step failure
        code = api.exec_inspect(exec_id)["ExitCode"]
        return int(code) if code is not None else 1

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        """Stop the container, copy each `from` out into a directory of its own, then the shared copy rules."""
        import docker.errors

        if self.container is None:
            self._start(network=False, started=False)
        else:
            with contextlib.suppress(docker.errors.APIError):
                self.container.kill()
        try:
            out.mkdir(parents=True, exist_ok=True)  # as finalize_tree does for the other runners
            for index, (source, to) in enumerate(copies):
                partial = self._copy_out(source, self.work / "final" / str(index), log)
                copy_path(partial, source, out, to)
        except BuildError as exc:
            log.write(f"kiln: {exc}\n".encode())
            return 3
        return 0

    def _copy_out(self, source: str, partial: Path, log: IO[bytes]) -> Path:
        """`source` of the container (if it exists) at the same path below `partial`, a fresh directory.

        A fresh directory per entry: an earlier entry's paths (a symlink among them) are never
        in the way of a later one's, and every directory made here is a plain one of ours.
        """
        import docker.errors

        parts = spec_parts(source, "finalize 'from'")
        dest = partial.joinpath(*parts[:-1])
        dest.mkdir(parents=True)
        try:
            stream, _ = self.container.get_archive("/" + "/".join(parts) if parts else "/.")
        except docker.errors.NotFound:
            return partial  # copy_path reports the missing path
        _untar(stream, dest, log)
        self._drop_init_layer(partial)
        return partial

    def _drop_init_layer(self, partial: Path) -> None:
        """Replace what Docker's init layer added with what the layers had there (or nothing).

        Paths are resolved inside `partial` and the layers, never with the host's view: a
        package may have made /etc a link to anywhere.
        """
        layers = self.plan.layers
        for path in _INIT_FILES:
            host = join_inside(partial, path, follow_last=False)
            if not os.path.lexists(host):
                continue
            _remove(host)
            origin = _exists_in(layers, path)
            if origin is not None:
                copy_path(origin[0].tree, origin[1], partial, path)
        for path in _INIT_DIRS:
            host = join_inside(partial, path, follow_last=False)
            if host.is_dir() and not host.is_symlink() and _exists_in(layers, path) is None and not any(host.iterdir()):
                host.rmdir()

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        """`docker exec -it` through the CLI (the SDK cannot attach a terminal); DOCKER_HOST applies."""
        self._start(network=False)
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise BuildError("kiln shell on the docker runner needs the docker CLI")
        terminal = ["-t"] if sys.stdin.isatty() else []
        args = [docker_cli, "exec", "-i", *terminal, "-u", "0:0", "-w", BUILD_DIR]
        for name, value in sorted(env.items()):
            args += ["-e", f"{name}={value}"]
        return subprocess.call([*args, self.container.id, *command])

    def close(self) -> None:
        import docker.errors

        if self.container is not None:
            with contextlib.suppress(docker.errors.APIError):
                self.container.remove(force=True)
            self.container = None
        for image in self.images:
            with contextlib.suppress(docker.errors.APIError):
                self.engine.images.remove(image, force=True)
        self.images.clear()


def _untar(stream: Iterator[bytes], dest: Path, log: IO[bytes]) -> None:
    """Unpack a get_archive stream with GNU tar (owners, modes, links as they were)."""
    process = subprocess.Popen(
        ["tar", "-xpf", "-", "--numeric-owner", "-C", str(dest)], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None
    try:
        for chunk in stream:
            process.stdin.write(chunk)
    finally:
        process.stdin.close()
        err = process.stderr.read() if process.stderr else b""
        if process.wait() != 0:
            log.write(err)
            raise BuildError(f"cannot unpack a finalize path copied out of the container: {err.decode().strip()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
