"""Real services for the runner, cache and upload tests: Docker engines, Debian's docker-registry, Azurite.

Where CI is set these tests must run, so a missing service fails them loudly; on a
developer's machine they skip with the command that starts the service.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests


def unavailable(what: str, hint: str) -> None:
    message = f"{what} is not available: {hint}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: scripts/ci-services.sh should have started it)")
    pytest.skip(message)


def engine_answers(host: str | None = None) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
        return True
    except Exception:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(check: object, what: str, log: Path, process: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"{what} did not come up in {seconds} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def second_dockerd() -> Iterator[str]:
    """A second engine on its own socket, data root, exec root and pidfile; yields its DOCKER_HOST."""
    if shutil.which("dockerd") is None:
        unavailable("dockerd", "apt-get install docker.io")
    if os.geteuid() != 0:
        unavailable("a second dockerd", "it needs root")
    # Short paths: containerd's socket lives under the exec root and unix socket paths are capped at 108.
    base = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
    sock = base / "d.sock"
    log = base / "dockerd.log"
    # Its own bridge: `--bridge none` would make this dockerd delete docker0 under the first engine.
    bridge = f"kiln-br{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "172.31.254.1/24", "dev", bridge], check=True)
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
    command = [
        "dockerd",
        "--host",
        f"unix://{sock}",
        "--data-root",
        str(base / "data"),
        "--exec-root",
        str(base / "x"),
        "--pidfile",
        str(base / "d.pid"),
        "--bridge",
        bridge,
        "--iptables=false",
        "--ip-masq=false",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    host = f"unix://{sock}"
    try:
        _wait(lambda: sock.exists() and engine_answers(host), "the second dockerd", log, process)
        yield host
    finally:
        _stop(process)
        subprocess.run(["ip", "link", "delete", bridge], check=False)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def registry() -> Iterator[tuple[str, Path]]:
    """Debian's docker-registry on a free loopback port with its own storage; yields (host:port, storage)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        unavailable("docker-registry", "apt-get install docker-registry")
    assert binary is not None
    base = Path(tempfile.mkdtemp(prefix="kiln-registry-"))
    port = free_port()
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {base / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = base / "registry.log"
    with log.open("wb") as out:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        _wait(up, "docker-registry", log, process)
        yield f"127.0.0.1:{port}", base / "data"
    finally:
        _stop(process)
        subprocess.run(["rm", "-rf", str(base)], check=False)


AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's one account and its key, as Microsoft publishes them for the emulator
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class Azurite:
    """A running Azurite's blob service: where it answers and how to reach its account."""

    port: int

    @property
    def account_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    def connection_string(self, key: str = AZURITE_KEY) -> str:
        account = f"AccountName={AZURITE_ACCOUNT};AccountKey={key}"
        return f"DefaultEndpointsProtocol=http;{account};BlobEndpoint={self.account_url};"

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())


def azurite(container: str) -> Iterator[Azurite]:
    """Azurite's blob service (scripts/setup-host.sh installs it from npm) on a free loopback port, its
    data in a temporary directory; up once a real request, making `container`, succeeds."""
    binary = shutil.which("azurite-blob")
    if binary is None:
        unavailable("azurite", "scripts/setup-host.sh installs it (npm install -g azurite)")
    assert binary is not None
    base = Path(tempfile.mkdtemp(prefix="kiln-azurite-"))
    log = base / "azurite.log"
    emulator = Azurite(free_port())
    command = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(emulator.port), "--location", str(base / "data")]
    # the SDK's newest API version may be newer than the pinned Azurite knows: the requests are the same
    command += ["--disableTelemetry", "--skipApiVersionCheck"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def ready() -> bool:
        try:
            emulator.service().create_container(container)
            return True
        except Exception:  # not listening yet, or not answering
            return False

    try:
        _wait(ready, "azurite", log, process)
        yield emulator
    finally:
        _stop(process)
        subprocess.run(["rm", "-rf", str(base)], check=False)


@contextmanager
def loop_device(backing: Path, size: int) -> Iterator[str]:
    """An empty `size`-byte file at `backing`, attached to a loop device (partition scanning on)."""
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        unavailable("loop devices", "run as root with util-linux's losetup")
    with backing.open("wb") as out:
        out.truncate(size)
    device = subprocess.run(
        ["losetup", "--find", "--show", "--partscan", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)
