"""Benchmarks for builds: no-op rebuild, sandbox overhead, build-root assembly, parallel efficiency.

Each figure is printed with the raw tool (or ideal) measured in the same run and
the ratio between them. Needs root, bubblewrap and a stage0 seed: the seed is
made once in $KILN_TEST_SEED (default ~/.cache/kiln-test-seed), like the tests do.

Run: `.venv/bin/python bench/build.py` (about 2 minutes with a seed present).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiln.build.cache_keys import stage0_key
from kiln.build.runners.sandbox import Layer, OverlayRoot, SandboxRunner, base_env
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[1]
STAGE0 = ROOT / "pkgs/stage0.yaml"
KILN = [sys.executable, "-m", "kiln.cli"]
RESULTS = ROOT / "bench/results/build.json"


def kiln(args: list[str], cache: Path, cwd: Path) -> float:
    """Wall seconds of one `kiln` run, as a user would see it (interpreter start included)."""
    env = {**os.environ, "KILN_CACHE": str(cache)}
    start = time.perf_counter()
    result = subprocess.run([*KILN, *args], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return elapsed


def project(base: Path, packages: dict[str, str]) -> Path:
    root = base / "project"
    (root / "pkgs").mkdir(parents=True)
    shutil.copy(STAGE0, root / "pkgs/stage0.yaml")
    for name, text in packages.items():
        (root / "pkgs" / name).mkdir()
        (root / "pkgs" / name / "pkg.yaml").write_text(text)
    return root


def seeded_cache(base: Path, seed: Path, pkgs: Path) -> tuple[Path, Path]:
    """A fresh store holding only the seed (hard links), and the seed's tree."""
    env = {**os.environ, "KILN_CACHE": str(seed)}
    subprocess.run([*KILN, "bootstrap", "--pkgs", str(pkgs)], env=env, check=True, capture_output=True)
    key = stage0_key(load_tree(pkgs, Platform.parse("linux/amd64")))
    cache = base / "cache"
    (cache / "store").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(seed / "store" / key), str(cache / "store" / key)], check=True)
    return cache, cache / "store" / key / "tree"


def generated_graph(count: int) -> dict[str, str]:
    rng = random.Random(7)
    packages = {}
    for i in range(count):
        needs = [i - 1] if i % 4 else sorted(rng.sample(range(i), min(i, 3)))
        deps = "".join(f"  - stage: g{n:03d}\n    to: /deps/g{n:03d}\n" for n in needs)
        packages[f"g{i:03d}"] = (
            f"name: g{i:03d}\nvariant: stage0\n"
            + (f"dependencies:\n{deps}" if deps else "")
            + f"steps:\n  - install:\n      - mkdir -p /out && echo {i} > /out/g{i:03d}\n"
            + "finalize: [{from: /out, to: /}]\n"
        )
    return packages


def bench_noop(base: Path, seed: Path) -> dict[str, float]:
    root = project(base / "noop", generated_graph(200))
    cache, _ = seeded_cache(base / "noop", seed, root / "pkgs")
    cold = kiln(["build", "--all", "--jobs", "2"], cache, root)
    runs = [kiln(["build", "--all"], cache, root) for _ in range(5)]
    validate = [kiln(["validate"], cache, root) for _ in range(3)]
    noop = statistics.median(runs)
    print(
        f"no-op rebuild, 200 packages: {noop:.3f} s median of 5 (cold build {cold:.1f} s); "
        f"`kiln validate` alone {statistics.median(validate):.3f} s; target 1.0 s -> {noop / 1.0:.2f} x target"
    )
    return {"noop_200_seconds": noop, "cold_200_seconds": cold, "validate_200_seconds": statistics.median(validate)}


def bench_overhead(base: Path, seed_tree: Path, runs: int = 100) -> dict[str, float]:
    runner = SandboxRunner()
    root = OverlayRoot(base / "overhead", [Layer(seed_tree)])
    root.prepare()
    env = base_env(1704067200, 2)
    with open(os.devnull, "wb") as log:
        start = time.perf_counter()
        for _ in range(runs):
            assert runner.run(root, "true", env, log, network=False) == 0
        sandboxed = (time.perf_counter() - start) / runs
        start = time.perf_counter()
        for _ in range(runs):
            subprocess.run(["sh", "-euc", "true"], stdout=log, check=True)
        direct = (time.perf_counter() - start) / runs
    print(
        f"sandbox overhead: {sandboxed * 1000:.1f} ms per step in the sandbox vs {direct * 1000:.1f} ms directly "
        f"(overhead {(sandboxed - direct) * 1000:.1f} ms, {sandboxed / direct:.1f} x; target <= 30 ms)"
    )
    return {"step_sandbox_ms": sandboxed * 1000, "step_direct_ms": direct * 1000}


def bench_assembly(base: Path, seed_tree: Path) -> dict[str, float]:
    big = base / "big"
    for d in range(16):
        (big / f"d{d}").mkdir(parents=True)
        for f in range(64):
            (big / f"d{d}" / f"f{f}").write_bytes(os.urandom(1 << 20))  # 16 x 64 x 1 MiB = 1 GiB
    runner = SandboxRunner()
    env = base_env(1704067200, 2)
    with open(os.devnull, "wb") as log:
        timings = []
        for attempt in range(3):
            start = time.perf_counter()
            root = OverlayRoot(base / f"assembly{attempt}", [Layer(big, "/big"), Layer(seed_tree)])
            root.prepare()
            assert runner.run(root, "test -s /big/d15/f63", env, log, network=False) == 0
            timings.append(time.perf_counter() - start)
        plain = OverlayRoot(base / "assembly-plain", [Layer(seed_tree)])
        start = time.perf_counter()
        plain.prepare()
        assert runner.run(plain, "true", env, log, network=False) == 0
        without = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(["cp", "-al", str(big), str(base / "farm")], check=True)
    farm = time.perf_counter() - start
    assembly = statistics.median(timings)
    print(
        f"build root with a 1 GiB dependency: {assembly:.3f} s to assemble and run one step "
        f"({without:.3f} s without it); a hard-link farm of the same tree (cp -al) takes {farm:.3f} s "
        f"-> {assembly / farm:.2f} x; target <= 0.5 s"
    )
    return {"assembly_1gib_seconds": assembly, "assembly_without_seconds": without, "cp_al_1gib_seconds": farm}


def bench_parallel(base: Path, seed: Path) -> dict[str, float]:
    packages = {
        f"sleep{i}": f"name: sleep{i}\nvariant: stage0\nsteps:\n  - build: ['sleep 5', 'mkdir -p /out']\n"
        "finalize: [{from: /out, to: /}]\n"
        for i in range(4)
    }
    root = project(base / "parallel", packages)
    cache, _ = seeded_cache(base / "parallel", seed, root / "pkgs")
    wall = kiln(["build", "--all", "--jobs", "2"], cache, root)
    ideal = 4 * 5 / 2
    print(
        f"parallel efficiency: 4 independent 5 s steps, --jobs 2: {wall:.2f} s vs ideal {ideal:.1f} s "
        f"-> {wall / ideal:.3f} x ideal; target <= 1.1 x"
    )
    return {"parallel_wall_seconds": wall, "parallel_ideal_seconds": ideal}


def main() -> int:
    seed = Path(os.environ.get("KILN_TEST_SEED", Path.home() / ".cache/kiln-test-seed"))
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        base = Path(tmp)
        (base / "seedref").mkdir()
        shutil.copy(STAGE0, base / "seedref/stage0.yaml")
        (base / "seedref/x").mkdir()
        (base / "seedref/x/pkg.yaml").write_text("name: x\nvariant: stage0\n")
        _, seed_tree = seeded_cache(base / "seedref", seed, base / "seedref")
        results |= bench_overhead(base, seed_tree)
        results |= bench_assembly(base, seed_tree)
        results |= bench_parallel(base, seed)
        results |= bench_noop(base, seed)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({k: round(v, 4) for k, v in results.items()}, indent=2) + "\n")
    print(f"results written to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
