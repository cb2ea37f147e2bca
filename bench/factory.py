"""Benchmark: the image factory over a warm release.

1. A new schematic that adds one extension (lldpd) to a warm release (every package stored): the
   time from POST /schematics to the end of the `metal` disk's download, beside `kiln image metal`
   run directly from the same warm store (the factory's floor: it runs that command). Target: at
   most 60 s for the metal disk. `--cold DIR` also times a cold `kiln image metal` into an empty
   store at DIR (an hour on 2 cores: the whole graph, kernel and toolchain-seed included).
2. Served from cache: the latency to the first byte of a download (the response's headers and first
   chunk) under 20 concurrent clients on loopback, p50 and p99 over `--requests` requests.

Run: `.venv/bin/python bench/factory.py` after `make image` (or the e2e tier) has stored the
release's packages and lldpd. Writes bench/results/factory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/factory.json"
KILN = [sys.executable, "-m", "kiln.cli"]
TOKEN = "bench-factory-token-0123456789"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_factory(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    (root / "token").write_text(TOKEN)
    port = free_port()
    command = [*KILN, "factory", "serve", "--listen", f"127.0.0.1:{port}", "--root", str(root / "f")]
    # One address makes every request here: without these its per-client share (a quarter of the
    # connections, 20 requests a second) would refuse the clients this measures, not serve them.
    command += ["--rate", "0", "--connections", "128"]
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


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    began = time.monotonic()
    subprocess.run(command, cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def new_schematic(url: str, marker: str) -> tuple[float, str]:
    """POST a schematic with lldpd (unique by a kernel argument), download metal; seconds and ID."""
    began = time.monotonic()
    body = json.dumps({"extensions": ["lldpd"], "kernel_args": [f"kiln.bench={marker}"]})
    sid = requests.post(f"{url}/schematics", data=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    schematic_id = sid.json()["id"]
    version = requests.get(f"{url}/v1/catalog", timeout=30).json()["version"]
    with requests.get(f"{url}/image/{schematic_id}/{version}/metal.raw.zst", stream=True, timeout=3600) as answer:
        answer.raise_for_status()
        for _ in answer.iter_content(1 << 20):
            pass
    return time.monotonic() - began, schematic_id


def first_byte(url: str) -> float:
    began = time.monotonic()
    with requests.get(url, stream=True, timeout=60) as answer:
        answer.raise_for_status()
        next(answer.iter_content(64 << 10))
        return time.monotonic() - began


def latency(url: str, clients: int, count: int) -> dict[str, float]:
    with ThreadPoolExecutor(clients) as pool:
        times = sorted(pool.map(lambda _: first_byte(url), range(count)))
    return {
        "p50_ms": round(statistics.median(times) * 1000, 1),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1),
        "max_ms": round(times[-1] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--cold", type=Path, metavar="DIR", help="also time a cold kiln image metal into DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-factory-") as tmp:
        work = Path(tmp)
        direct = timed([*KILN, "image", "metal", "--extension", "lldpd", "--out", str(work / "direct")])
        process, url = start_factory(work)
        try:
            seconds, schematic_id = new_schematic(url, str(time.time_ns()))
            version = requests.get(f"{url}/v1/catalog", timeout=30).json()["version"]
            served = latency(f"{url}/image/{schematic_id}/{version}/metal.raw.zst", args.clients, args.requests)
        finally:
            process.terminate()
            process.wait(30)
        cold = None
        if args.cold is not None:
            env = {**os.environ, "KILN_CACHE": str(args.cold)}
            cold = timed([*KILN, "image", "metal", "--extension", "lldpd", "--out", str(work / "cold")], env)
    result = {
        "new_schematic_metal_seconds": round(seconds, 1),
        "direct_kiln_image_metal_seconds": round(direct, 1),
        "ratio_factory_to_direct": round(seconds / direct, 2),
        "cold_kiln_image_metal_seconds": None if cold is None else round(cold, 1),
        "cached_download_first_byte": {"clients": args.clients, "requests": args.requests, **served},
    }
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
