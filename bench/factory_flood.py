"""Benchmark: the image factory under a connection flood, with no build (no package store needed).

The real `kiln factory serve` (default limits, plain HTTP on loopback) takes 500 connections from
one address (127.0.0.2), each holding an unfinished request head, as slow or hostile clients do.
Meanwhile another address (127.0.0.1) asks for the catalogue `--requests` times. Measured: the
process's threads at the peak (/proc), how the flood was answered (200 within its share of the
connections, 503 beyond), and the other client's latency and statuses during the flood.

Run: `nice .venv/bin/python bench/factory_flood.py`. Writes bench/results/factory_flood.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/factory_flood.json"
KILN = [sys.executable, "-m", "kiln.cli"]
TOKEN = "bench-factory-token-0123456789"
FLOOD_FROM = "127.0.0.2"  # loopback, but another client than 127.0.0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_factory(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    (root / "token").write_text(TOKEN)
    port = free_port()
    command = [*KILN, "factory", "serve", "--listen", f"127.0.0.1:{port}", "--root", str(root / "f")]
    log = (root / "factory.log").open("wb")
    process = subprocess.Popen([*command, "--token-file", str(root / "token")], cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if requests.get(f"{url}/v1/catalog", timeout=2).status_code == 200:
                return process, url
        except requests.ConnectionError:
            time.sleep(0.2)
    raise SystemExit(f"the factory did not start: {(root / 'factory.log').read_text()}")


def threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def status_of(sock: socket.socket) -> str:
    try:
        data = sock.recv(64)
    except OSError:
        data = b""
    finally:
        sock.close()
    return data[9:12].decode() if data.startswith(b"HTTP/") else "closed"


def flood(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(FLOOD_FROM, 0))
        sock.sendall(b"GET /v1/catalog HTTP/1.1\r\n")
        sockets.append(sock)
    return sockets


def other_client(url: str, count: int) -> dict[str, object]:
    times, statuses = [], []
    for _ in range(count):
        began = time.monotonic()
        statuses.append(requests.get(f"{url}/v1/catalog", timeout=30).status_code)
        times.append(time.monotonic() - began)
    times.sort()
    return {
        "requests": count,
        "ok": statuses.count(200),
        "p50_ms": round(statistics.median(times) * 1000, 1),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=500, help="the flood's connections")
    parser.add_argument("--requests", type=int, default=100, help="the other client's requests during it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-flood-") as tmp:
        process, url = start_factory(Path(tmp))
        try:
            idle = threads(process.pid)
            began = time.monotonic()
            sockets = flood(int(url.rsplit(":", 1)[1]), args.connections)
            opened = time.monotonic() - began
            peak = threads(process.pid)
            during = other_client(url, args.requests)  # well within the 15 s a request head may take
            peak = max(peak, threads(process.pid))
            for sock in sockets:
                with contextlib.suppress(OSError):  # one turned away is closed already
                    sock.sendall(b"Host: f\r\nConnection: close\r\n\r\n")
            answers = [status_of(sock) for sock in sockets]
        finally:
            process.terminate()
            process.wait(60)
    result = {
        "flood_connections": args.connections,
        "flood_open_seconds": round(opened, 2),
        "threads_idle": idle,
        "threads_peak": peak,
        "flood_answers": {status: answers.count(status) for status in sorted(set(answers))},
        "other_client_during_flood": during,
    }
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
