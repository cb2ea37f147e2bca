"""Benchmark: the inner loop, an edit under runtime/machined to "machined ready" in QEMU (TCG).

In a copy of the project (pkgs/ and runtime/, so the working tree is never touched), each run
appends a comment to machined's main.go, which changes machined's key, and times `kiln dev boot
--json`: machined rebuilt (its Go build cache kept by its step cache), kernel + initramfs
assembled, QEMU booted to the ready line. The phases are Kiln's own report; the wall time is
measured here around the command. Median of `--runs` (default 3) after one warm-up run.
Target: at most 20 s on 2 cores (mkosi documents about 40 s from a change to a VM).

Run: `.venv/bin/python bench/loop.py` after `make image`. Writes bench/results/loop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/loop.json"
KILN = [sys.executable, "-m", "kiln.cli"]


def edit_and_boot(project: Path, run: int) -> dict[str, float]:
    main = project / "runtime/machined/main.go"
    main.write_text(main.read_text() + f"\n// bench/loop.py run {run} {time.time_ns()}\n")
    began = time.monotonic()
    done = subprocess.run(
        [*KILN, "dev", "boot", "--json", "--quiet"], cwd=project, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"kiln dev boot failed:\n{done.stdout}\n{done.stderr}")
    report = json.loads(done.stdout)
    if report["rebuilt"] != ["machined"]:
        raise SystemExit(f"expected machined alone to be rebuilt, got {report['rebuilt']}")
    return {**report["seconds"], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        project = Path(tmp)
        for part in ("pkgs", "runtime"):
            shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__", "_out"))
        edit_and_boot(project, 0)  # warm-up: the step cache and the page cache
        runs = [edit_and_boot(project, run) for run in range(1, args.runs + 1)]
    median = {phase: round(statistics.median(r[phase] for r in runs), 2) for phase in runs[0]}
    result = {
        "median_s": median,
        "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
        "target_s": 20,
        "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(
        f"edit machined -> ready: {median['wall']:.1f} s wall (build {median['build']:.1f} s, "
        f"image {median['image']:.1f} s, boot {median['boot']:.1f} s; median of {args.runs}); "
        f"{median['wall'] / 20:.2f} x the 20 s target"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
