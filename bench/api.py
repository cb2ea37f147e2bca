"""Benchmark: machined's API status latency with idle connections held open, before and after its limits.

machined's own Go test `TestAPIStatusLatency` (runtime/machined/api_bench_test.go) serves the API two
ways on loopback with real mutual TLS: as it was before connection limits (TLS and a header timeout,
nothing else) and as it is (256 connections, 32 per source, the oldest unauthenticated evicted,
timeouts). For each it holds 0, 200 (10 source addresses x 20) and 2,000 (20 x 100) idle TCP
connections that never start a handshake, counts the descriptors the server side holds for them
(what PID 1 would spend), then times 500 sequential authenticated `GET /v1/status`: on a new
connection each (a handshake each, as `kiln node` does) and on one kept-alive connection.

The test runs `--rounds` times; each figure here is the median of the rounds' figures. The ratios are
after / before at 200 and 2,000 idle connections. Go benchmarks then time what the limits add alone:
counting a connection in and out (its handshake timer included; a net.Pipe made per operation) and
the role check per request. Run: `.venv/bin/python bench/api.py` (needs Go).
Writes bench/results/api.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MACHINED = ROOT / "runtime/machined"
RESULTS = ROOT / "bench/results/api.json"
KINDS = ("new_connection_ms", "kept_alive_ms")
CASES = [f"{server}_idle{idle}" for server in ("before", "after") for idle in (0, 200, 2000)]


def one_round(directory: Path, number: int) -> dict[str, Any]:
    """One run of the Go measurement; its figures as it wrote them."""
    out = directory / f"round{number}.json"
    env = {**os.environ, "KILN_API_BENCH": str(out)}
    command = ["go", "test", "-count=1", "-run", "^TestAPIStatusLatency$", "."]
    result = subprocess.run(command, cwd=MACHINED, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"go test failed:\n{result.stdout}\n{result.stderr}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def per_operation() -> dict[str, float]:
    """What the limits and the role check cost alone (Go benchmarks): nanoseconds per connection, per request."""
    wanted = "^(BenchmarkConnTrackerAdmitRelease|BenchmarkClientIdentity)$"
    command = ["go", "test", "-run", "^$", "-bench", wanted, "."]
    result = subprocess.run(command, cwd=MACHINED, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"go test -bench failed:\n{result.stdout}\n{result.stderr}")
    found = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if fields and fields[0].startswith("Benchmark") and "ns/op" in fields:
            name = fields[0].removeprefix("Benchmark").rsplit("-", 1)[0]
            found[f"{name}_ns"] = float(fields[fields.index("ns/op") - 1])
    return found


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case and kind, the median over the rounds of each statistic."""
    cases: dict[str, Any] = {}
    for case in CASES:
        cases[case] = {
            kind: {
                stat: round(statistics.median(r[case][kind][stat] for r in rounds), 2)
                for stat in ("p50", "p90", "p99", "max", "mean")
            }
            for kind in KINDS
        }
        cases[case]["server_descriptors"] = statistics.median(r[case]["server_descriptors"] for r in rounds)
    return cases


def ratios(cases: dict[str, Any]) -> dict[str, float]:
    found = {}
    for idle in (200, 2000):
        for kind in KINDS:
            for stat in ("p50", "p99"):
                before, after = cases[f"before_idle{idle}"][kind][stat], cases[f"after_idle{idle}"][kind][stat]
                found[f"idle{idle}_{kind.removesuffix('_ms')}_{stat}_after_over_before"] = round(after / before, 2)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of the Go measurement (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-api-") as tmp:
        rounds = [one_round(Path(tmp), n) for n in range(args.rounds)]
    cases = medians(rounds)
    results = {
        "requests_per_case": rounds[0]["requests_per_case"],
        "rounds": args.rounds,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cases": cases,
        "ratios": ratios(cases),
        "per_operation": per_operation(),
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for case in CASES:
        fresh, kept = cases[case]["new_connection_ms"], cases[case]["kept_alive_ms"]
        print(
            f"{case:18} new connection p50 {fresh['p50']:6.2f} ms p99 {fresh['p99']:6.2f} ms | "
            f"kept alive p50 {kept['p50']:5.2f} ms p99 {kept['p99']:5.2f} ms | "
            f"server descriptors {cases[case]['server_descriptors']:g}"
        )
    print(", ".join(f"{name} {ns:g}" for name, ns in results["per_operation"].items()))
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
