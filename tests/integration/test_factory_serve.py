"""The real `kiln factory serve` (this project's tree and profiles, its own directory) in its own
process, over TLS with a certificate made here and plain HTTP beside it (--listen-http): its flags,
its refusals and its thread bound, measured in /proc. No stub and no build: nothing here asks for
an image (a build would need the package store); tests/unit/test_factory_limits.py covers the
build-side rules with a stub runner.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.integration.services import free_port
from tests.unit.test_factory_limits import PEM_KEY, self_signed

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "kiln.cli"]
TOKEN = "integration-factory-token-0123456789"
CONNECTIONS = 16


@dataclass
class Served:
    url: str
    port: int
    plain: str  # --listen-http: downloads for firmware without TLS
    cert: str  # the certificate file, as requests' verify= takes it
    process: subprocess.Popen[bytes]

    def threads(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))

    def post(self, body: str, token: str = TOKEN) -> requests.Response:
        auth = {"Authorization": f"Bearer {token}"}
        return requests.post(f"{self.url}/schematics", data=body.encode(), headers=auth, verify=self.cert, timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("factory")
    cert, key = self_signed(base)
    (base / "token").write_text(TOKEN + "\n")
    port, plain = free_port(), free_port()
    command = [*KILN, "factory", "serve", "--listen", f"127.0.0.1:{port}", "--root", str(base / "root")]
    command += ["--token-file", str(base / "token"), "--tls-cert", str(cert), "--tls-key", str(key)]
    command += ["--connections", str(CONNECTIONS), "--rate", "0", "--listen-http", f"127.0.0.1:{plain}"]
    with (base / "factory.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    served = Served(f"https://127.0.0.1:{port}", port, f"http://127.0.0.1:{plain}", str(cert), process)
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if requests.get(f"{served.url}/v1/catalog", verify=str(cert), timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        assert process.poll() is None, (base / "factory.log").read_text()
        assert f"https://127.0.0.1:{port}/ and http://127.0.0.1:{plain}/" in (base / "factory.log").read_text()
        yield served
    finally:
        process.terminate()
        process.wait(30)


def test_schematics_over_tls_and_what_is_refused(served: Served) -> None:
    made = served.post("kernel_args: [quiet]\n")
    assert made.status_code == 201
    stored = requests.get(f"{served.url}/schematics/{made.json()['id']}", verify=served.cert, timeout=30)
    assert stored.json() == {"kernel_args": ["quiet"]}
    assert served.post("kernel_args: [quiet]\n", token="wrong-token-0123456789").status_code == 401
    secret = served.post(json.dumps({"machine_config": {"api": {"key": PEM_KEY}}}))
    assert secret.status_code == 400 and "machine_config.api.key" in secret.json()["error"]
    inward = served.post("extensions: ['oci://localhost:5000/kiln/acpi-call:1.0']\n")
    assert inward.status_code == 400 and "not a public address" in inward.json()["error"]
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{served.port}/v1/catalog", timeout=30)
    plain = requests.get(f"{served.plain}/schematics/{made.json()['id']}", timeout=30)  # firmware's way in
    assert plain.json() == {"kernel_args": ["quiet"]}


def test_500_connections_leave_the_process_under_its_thread_bound(served: Served) -> None:
    """500 connections that never start their handshake: the process's threads (/proc) stay within
    --connections plus its own few, and it answers again once they are gone."""
    sockets = [socket.create_connection(("127.0.0.1", served.port), timeout=30) for _ in range(500)]
    try:
        time.sleep(1.0)
        peak = served.threads()
    finally:
        for sock in sockets:
            sock.close()
    assert peak <= CONNECTIONS + 4, peak
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the held threads end when their handshake times out or fails
        try:
            answer = requests.get(f"{served.url}/v1/catalog", verify=served.cert, timeout=30)
            if answer.status_code == 200:
                break
        except requests.ConnectionError:
            time.sleep(0.5)
    else:
        pytest.fail("the factory did not answer after the flood")
    assert served.threads() <= CONNECTIONS + 4
