"""Benchmark: one two-platform `kiln image` against the two single-platform runs one after the other.

Both from warm packages (every package of both platforms stored: run each once first), so what
is measured is loading the graphs, checking the store and writing the images. The runs alternate,
three of each, and the medians are compared.

Run: `.venv/bin/python bench/multiarch.py [PROFILE...]` (default: metal iso).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILN = [sys.executable, "-m", "kiln.cli"]
RESULTS = ROOT / "bench/results/multiarch.json"
BOTH = "linux/amd64,linux/arm64"


def timed(profiles: list[str], platform: str, out: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [*KILN, "image", *profiles, "--platform", platform, "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"kiln image --platform {platform} failed:\n{result.stderr[-3000:]}")
    return seconds


def main() -> int:
    profiles = sys.argv[1:] or ["metal", "iso"]
    together: list[float] = []
    apart: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-multiarch-") as tmp:
        work = Path(tmp)
        timed(profiles, BOTH, work / "warm")  # builds what is missing; not measured
        for attempt in range(3):
            together.append(timed(profiles, BOTH, work / f"both{attempt}"))
            amd64 = timed(profiles, "linux/amd64", work / f"amd64-{attempt}")
            arm64 = timed(profiles, "linux/arm64", work / f"arm64-{attempt}")
            apart.append(amd64 + arm64)
    both, single = statistics.median(together), statistics.median(apart)
    print(
        f"kiln image {' '.join(profiles)} (warm packages, median of 3): --platform {BOTH} {both:.1f} s; "
        f"amd64 then arm64 {single:.1f} s -> {both / single:.2f} x"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"profiles": profiles, "two_platform_seconds": round(both, 1), "two_single_runs_seconds": round(single, 1)},
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
