"""Runner benchmark: cold build and no-op rebuild on sandbox, docker and buildkit (one run each).

Graphs: the test fixture (tests/fixtures/buildgraph) and a generated 50-package graph on the
same seed (each package reads up to two earlier ones at /deps/<name> and writes a digest).
Every store starts with only the seed, hard-linked from KILN_TEST_SEED (made by the
integration tests' fixture, or by this script). The docker runner's one-time seed import
into the engine is done, and timed, before the cold builds, as the seed is already in the
store for the sandbox; BuildKit's cache is pruned before its cold build.

No-op: `kiln build` again with everything stored (a store lookup, whatever the runner) as a
CLI run and in process (the same call without the interpreter's start and imports, which
are most of a CLI no-op), and
BuildKit's own no-op: the same `docker build` run again with BuildKit's cache warm, which is
what a BuildKit-native pipeline pays on every run.

Goals: sandbox no-op >= 10 x faster than BuildKit's no-op; sandbox cold within
1.2 x of BuildKit's cold.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/buildgraph"
KILN = [sys.executable, "-m", "kiln.cli"]
RESULTS = ROOT / "bench/results/runners.json"
RUNNERS = ("sandbox", "docker", "buildkit")


def generated(root: Path, count: int = 50) -> list[str]:
    """A layered DAG of `count` small packages; returns the names of those nothing depends on."""
    pkgs = root / "pkgs"
    pkgs.mkdir(parents=True)
    for name in ("stage0.yaml", "vars.yaml"):
        shutil.copy(FIXTURE / "pkgs" / name, pkgs / name)
    needed: set[str] = set()
    for i in range(count):
        name = f"gen-{i:02d}"
        deps = [f"gen-{j:02d}" for j in (i - 1, i // 2) if 0 <= j < i]
        deps = list(dict.fromkeys(deps))
        needed.update(deps)
        dep_yaml = "".join(f"\n  - stage: {d}\n    to: /deps/{d}" for d in deps)
        (pkgs / name).mkdir()
        (pkgs / name / "pkg.yaml").write_text(
            f"name: {name}\nvariant: stage0\n"
            + (f"dependencies:{dep_yaml}\n" if deps else "")
            + "steps:\n  - build:\n"
            + "      - mkdir -p /out\n"
            + f"      - (cat /deps/*/digest 2>/dev/null || true; echo {name}) | sha256sum > /out/digest\n"
            + "finalize:\n  - from: /out\n    to: /\n"
        )
    return [f"gen-{i:02d}" for i in range(count) if f"gen-{i:02d}" not in needed]


def kiln(project: Path, cache: Path, *args: str) -> float:
    env = {**os.environ, "KILN_CACHE": str(cache)}
    start = time.monotonic()
    result = subprocess.run([*KILN, *args], cwd=project, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return seconds


def noop_in_process(project: Path, cache: Path, targets: list[str], runner: str) -> float:
    """The no-op without interpreter start and imports: load, key, look every package up in the store."""
    import io

    from kiln.build.progress import PlainProgress
    from kiln.build.session import Session
    from kiln.pkg.graph import Graph
    from kiln.pkg.loader import load_tree
    from kiln.pkg.variables import Platform

    os.environ["KILN_CACHE"] = str(cache)
    try:
        start = time.monotonic()
        graph = Graph(load_tree(project / "pkgs", Platform.parse("linux/amd64")))
        session = Session.open(graph, runner)
        outcomes = session.build(targets, 2, PlainProgress(io.StringIO()), no_cache=False, keep_going=False)
        seconds = time.monotonic() - start
    finally:
        del os.environ["KILN_CACHE"]
    assert all(o.status == "cached" for o in outcomes.values()), outcomes
    return seconds


def fresh_store(seed_store: Path, seed_key: str, where: Path) -> Path:
    cache = where / "cache"
    if cache.exists():
        shutil.rmtree(cache)
    (cache / "store").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(seed_store / "store" / seed_key), str(cache / "store" / seed_key)], check=True)
    return cache


def buildkit_noop(cache: Path) -> float:
    """Run the last BuildKit build again, as recorded in its log, with BuildKit's cache warm."""
    from kiln.build.runners.buildkit import find_client

    first = (cache / "logs/_buildkit/last.log").read_text().splitlines()[0]
    argv = shlex.split(first.removeprefix("$ "))
    with tempfile.TemporaryDirectory(dir=cache / "tmp") as out:
        argv = [a if not a.startswith("type=local,dest=") else f"type=local,dest={out}" for a in argv]
        start = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, env=find_client().environ())
        seconds = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"BuildKit no-op failed:\n{result.stdout[-3000:]}")
    return seconds


def main() -> int:
    from kiln.build.cache_keys import stage0_key
    from kiln.build.runners.docker import client, ensure_stage0_image
    from kiln.build.store import Store
    from kiln.pkg.loader import load_tree
    from kiln.pkg.variables import Platform

    seed_store = Path(os.environ.get("KILN_TEST_SEED", Path.home() / ".cache/kiln-test-seed"))
    seed_key = stage0_key(load_tree(FIXTURE / "pkgs", Platform.parse("linux/amd64")))
    if not Store(seed_store).has(seed_key):
        print("making the seed (debootstrap, a few minutes) ...", flush=True)
        kiln(ROOT, seed_store, "bootstrap", "--pkgs", str(FIXTURE / "pkgs"))
    engine = client()
    start = time.monotonic()
    had_image = bool(engine.images.list(name=f"kiln/stage0:{seed_key}"))
    ensure_stage0_image(engine, Store(seed_store).tree(seed_key), seed_key)
    import_seconds = 0.0 if had_image else time.monotonic() - start

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-runners-") as tmp:
        base = Path(tmp)
        fixture = base / "fixture"
        shutil.copytree(FIXTURE, fixture)
        gen = base / "gen50"
        graphs = {"fixture": (fixture, ["greet-test"]), "gen50": (gen, generated(gen))}
        for graph, (project, targets) in graphs.items():
            for runner in RUNNERS:
                cache = fresh_store(seed_store, seed_key, base / f"{graph}-{runner}")
                if runner == "buildkit":
                    subprocess.run(["/usr/bin/docker", "builder", "prune", "-af"], capture_output=True, check=False)
                args = ["build", *targets, "--runner", runner, "-j", "2"]
                cold = kiln(project, cache, *args)
                noop = kiln(project, cache, *args)
                inproc = noop_in_process(project, cache, targets, runner)
                row = {"cold": round(cold, 2), "noop": round(noop, 2), "noop_in_process": round(inproc, 3)}
                if runner == "buildkit":
                    row["buildkit_noop"] = round(buildkit_noop(cache), 2)
                results[f"{graph}/{runner}"] = row
                print(
                    f"{graph:8} {runner:8} cold {cold:7.2f} s   no-op {noop:5.2f} s (in process {inproc:.3f} s)"
                    + (f"   BuildKit's own no-op {row['buildkit_noop']:5.2f} s" if runner == "buildkit" else ""),
                    flush=True,
                )
    print(
        f"seed import into the engine (docker, buildkit; once per engine): {import_seconds:.1f} s"
        + (" (already imported)" if had_image else "")
    )
    summary = {}
    for graph in ("fixture", "gen50"):
        sandbox, bk, dk = (results[f"{graph}/{r}"] for r in ("sandbox", "buildkit", "docker"))
        noop_ratio = bk["buildkit_noop"] / sandbox["noop"]
        inproc_ratio = bk["buildkit_noop"] / sandbox["noop_in_process"]
        cold_ratio = sandbox["cold"] / bk["cold"]
        summary[graph] = {
            "noop_speedup_vs_buildkit": round(noop_ratio, 1),
            "noop_in_process_speedup_vs_buildkit": round(inproc_ratio, 1),
            "cold_vs_buildkit": round(cold_ratio, 2),
            "docker_cold_vs_sandbox": round(dk["cold"] / sandbox["cold"], 2),
        }
        print(
            f"{graph}: sandbox no-op is {noop_ratio:.1f} x faster than BuildKit's no-op as a CLI run "
            f"({inproc_ratio:.0f} x without Python's start-up and imports; goal >= 10); "
            f"sandbox cold is {cold_ratio:.2f} x BuildKit's cold (goal <= 1.2); "
            f"docker cold is {dk['cold'] / sandbox['cold']:.2f} x sandbox cold"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "runs": results,
                "ratios": summary,
                "seed_import_seconds": round(import_seconds, 1),
                "cores": os.cpu_count(),
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
