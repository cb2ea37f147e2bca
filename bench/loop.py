"""Benchmark: the inner loop, an edit to "machined ready" in QEMU (TCG), timed by phase.

In a copy of the project (pkgs/ and runtime/, so the working tree is never touched), each run
makes an edit that changes a key and times `kiln dev boot --json`: what the edit changed rebuilt,
kernel + initramfs assembled, QEMU booted to the ready line. Median of `--runs` (default 3) after
one warm-up run (which fills the step caches). Three loops:

- default: a comment appended to machined's main.go (Go's build cache kept by its step cache).
  Target 20 s (mkosi documents about 40 s from a change to a VM).
- `--kernel`: a fragment that turns one more driver on (=y; a different one each run, and a unique
  DEFAULT_HOSTNAME so no run finds its config stored). The kernel rebuilds in its kept object tree.
- `--kernel-patch`: a patch to kernel/reboot.c that adds one object-changing line per run.
Kernel loops also report the kernel step's phases from its build log (unpack and patches, the
sources' mtimes set by content, configuration, the make of vmlinux + modules, install, test) and
ccache's counts (every compile, hit or miss). Target 90 s.

Run: `.venv/bin/python bench/loop.py [--kernel | --kernel-patch]` after `make image`. Writes its
loop's entry of bench/results/loop.json.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/loop.json"
KILN = [sys.executable, "-m", "kiln.cli"]
TARGETS = {"machined": 20, "kernel_fragment": 90, "kernel_patch": 90}
# Drivers config-amd64 leaves off that need nothing else; one more of them is =y in each run.
DRIVERS = ("CONFIG_DUMMY_IRQ", "CONFIG_ENCLOSURE_SERVICES", "CONFIG_SRAM")
PATCHED = "kernel/reboot.c"
STEP_TIME = re.compile(r"^==> kernel: step \d+ (prepare|build|install|test): ([0-9.]+) s$", re.M)
CCACHE = re.compile(r"^ccache: (\w+) (\d+)$", re.M)


def edit_machined(project: Path, run: int) -> list[str]:
    main = project / "runtime/machined/main.go"
    main.write_text(main.read_text() + f"\n// bench/loop.py run {run} {time.time_ns()}\n")
    return []


def edit_fragment(project: Path, run: int) -> list[str]:
    lines = [f"{DRIVERS[run % len(DRIVERS)]}=y", f'CONFIG_DEFAULT_HOSTNAME="bench-{time.time_ns()}"']
    (project / "pkgs/kernel/fragments/bench.config").write_text("\n".join(lines) + "\n")
    return ["--set", "kernel_fragments=bench"]


def original(project: Path, member: str) -> str:
    """One file of the kernel's source tarball (from the store's sources, fetched if missing)."""
    subprocess.run([*KILN, "fetch", "kernel"], cwd=project, check=True, capture_output=True)
    variables = yaml.safe_load((project / "pkgs/vars.yaml").read_text())
    cache = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache/kiln"))
    tarball = cache / "sources" / variables["kernel_sha256"]
    return subprocess.run(
        ["tar", "-xJOf", str(tarball), "--wildcards", f"*/{member}"], check=True, capture_output=True, text=True
    ).stdout


def edit_patch(project: Path, run: int, before: list[str]) -> list[str]:
    after = [*before, f'static const char kiln_bench_loop[] __used = "{run}-{time.time_ns()}";\n']
    diff = difflib.unified_diff(before, after, f"a/{PATCHED}", f"b/{PATCHED}")
    (project / "pkgs/kernel/patches/0001-bench-loop.patch").write_text("".join(diff))
    return []


def kernel_phases(project: Path) -> dict[str, float]:
    """The kernel step's seconds by phase, and ccache's counts, from its last build log."""
    log = subprocess.run([*KILN, "log", "kernel"], cwd=project, capture_output=True, text=True, check=True).stdout
    times = [(phase, float(seconds)) for phase, seconds in STEP_TIME.findall(log)]
    builds = [seconds for phase, seconds in times if phase == "build"]
    phases = {
        "unpack_patch": sum(seconds for phase, seconds in times if phase == "prepare"),
        "sync_sources": sum(builds[:1]),  # incremental.sh begin
        "configure": sum(builds[1:3]),
        "make_vmlinux_modules": sum(builds[3:]),
        "install": sum(seconds for phase, seconds in times if phase == "install"),
        "test": sum(seconds for phase, seconds in times if phase == "test"),
    }
    counts = {f"ccache_{name}": float(value) for name, value in CCACHE.findall(log)}
    return {name: round(value, 1) for name, value in phases.items()} | counts


def edit_and_boot(project: Path, loop: str, run: int, edit: Callable[[Path, int], list[str]]) -> dict[str, float]:
    settings = edit(project, run)
    began = time.monotonic()
    done = subprocess.run(
        [*KILN, *settings, "dev", "boot", "--json", "--quiet"], cwd=project, capture_output=True, text=True
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"kiln dev boot failed:\n{done.stdout}\n{done.stderr}")
    report = json.loads(done.stdout)
    expected = ["machined"] if loop == "machined" else ["kernel"]
    if report["rebuilt"] != expected:
        raise SystemExit(f"expected {expected} alone to be rebuilt, got {report['rebuilt']}")
    result = {**report["seconds"], "wall": wall}
    return result | (kernel_phases(project) if loop != "machined" else {})


def edits(loop: str, project: Path) -> Callable[[Path, int], list[str]]:
    if loop == "machined":
        return edit_machined
    if loop == "kernel_fragment":
        return edit_fragment
    before = original(project, PATCHED).splitlines(keepends=True)
    return lambda project, run: edit_patch(project, run, before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--kernel", action="store_true", help="edit a kernel fragment instead of machined")
    which.add_argument("--kernel-patch", action="store_true", help="edit a kernel patch instead of machined")
    args = parser.parse_args()
    loop = "kernel_fragment" if args.kernel else "kernel_patch" if args.kernel_patch else "machined"
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        project = Path(tmp)
        for part in ("pkgs", "runtime"):
            shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__", "_out"))
        edit = edits(loop, project)
        edit_and_boot(project, loop, 0, edit)  # warm-up: the step caches and the page cache
        runs = [edit_and_boot(project, loop, run, edit) for run in range(1, args.runs + 1)]
    median = {phase: round(statistics.median(r[phase] for r in runs), 2) for phase in runs[0]}
    target = TARGETS[loop]
    result = {
        "median_s": median,
        "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
        "target_s": target,
        "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(
        f"{loop} edit -> ready: {median['wall']:.1f} s wall (build {median['build']:.1f} s, "
        f"image {median['image']:.1f} s, boot {median['boot']:.1f} s; median of {args.runs}); "
        f"{median['wall'] / target:.2f} x the {target} s target"
    )
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored = stored if "median_s" not in stored else {"machined": stored}  # one loop per key
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(stored | {loop: result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
