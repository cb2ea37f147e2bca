"""Cold build time and output sizes of the real packages in pkgs/.

Builds the named packages (default: the rootfs userland, init, go and machined, with the
toolchain they need) in a fresh store that holds only the stage0 seed, one package at a time
(`--jobs 1`, so each package's seconds are its own), after fetching every source (not timed).
Records per package: cold build seconds, output bytes and files, and the size of each ELF
binary in the output (vmlinuz and modules for a kernel). Results are merged into
bench/results/pkgs.json by package, so measuring some packages keeps the others' entries.

Run: `.venv/bin/python bench/pkgs.py [PKG...]` (needs root, bubblewrap and the seed, made once in
$KILN_TEST_SEED like the tests do); `--table` prints the README's table from the results file.
`--platform linux/arm64` measures the cross build on this amd64 machine (its own cross seed);
those rows are stored as `NAME@arm64` beside the native ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kiln.build.cache_keys import stage0_key
from kiln.core.sizes import format_size
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[1]
PKGS = ROOT / "pkgs"
KILN = [sys.executable, "-m", "kiln.cli"]
RESULTS = ROOT / "bench/results/pkgs.json"
DEFAULT = ["fhs", "ca-certificates", "util-linux", "e2fsprogs", "dosfstools", "kmod", "init", "go", "machined"]


def kiln(args: list[str], cache: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_CACHE": str(cache)}
    result = subprocess.run([*KILN, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{result.stderr[-4000:]}")
    return result


def seeded_cache(base: Path, target: Platform) -> Path:
    """A fresh store holding only the seed (hard links from $KILN_TEST_SEED, made there once)."""
    if (base / "cache").exists():
        raise SystemExit(f"{base / 'cache'} exists: the store must start empty for cold figures")
    seed = Path(os.environ.get("KILN_TEST_SEED", Path.home() / ".cache/kiln-test-seed"))
    kiln(["bootstrap", "--platform", str(target)], seed)
    key = stage0_key(load_tree(PKGS, target))
    cache = base / "cache"
    (cache / "store").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(seed / "store" / key), str(cache / "store" / key)], check=True)
    return cache


def is_binary(path: Path, rel: str) -> bool:
    """An ELF executable or kernel module, or the kernel image."""
    if rel.startswith("boot/vmlinuz"):
        return True
    with path.open("rb") as handle:
        if handle.read(4) != b"\x7fELF":
            return False
    return rel.endswith(".ko") or bool(path.stat().st_mode & 0o111)


def measure_output(tree: Path) -> dict[str, Any]:
    total = files = 0
    binaries: dict[str, int] = {}
    for path in sorted(tree.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        size = path.stat().st_size
        total += size
        files += 1
        rel = path.relative_to(tree).as_posix()
        if is_binary(path, rel):
            binaries[rel] = size
    if len(binaries) > 40:  # a kernel's modules, a Go toolchain: the largest, and a count of the rest
        largest = dict(sorted(binaries.items(), key=lambda item: -item[1])[:10])
        largest[f"({len(binaries) - 10} more)"] = sum(binaries.values()) - sum(largest.values())
        binaries = largest
    return {"output_bytes": total, "files": files, "binaries": binaries}


def run(targets: list[str], keep: Path | None, target: Platform) -> dict[str, Any]:
    """Build `targets` cold; `keep` names a directory whose store is kept for reuse afterwards."""
    tree = load_tree(PKGS, target)
    graph = Graph(tree)
    closure = graph.closure(targets)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-pkgs-") as tmp:
        cache = seeded_cache(keep or Path(tmp), target)
        on = ["--platform", str(target)]
        kiln(["fetch", *closure, *on], cache)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        # a failed package must not lose the figures of those that built (a kernel is 20 minutes)
        result = kiln(["build", *closure, *on, "--jobs", "1", "--json"], cache, check=False)
        wall = time.perf_counter() - start
        # other work on the machine stretches every figure: keep the 1- and 15-minute load with them
        load = {"before_1min": round(load_before, 1), "after_15min": round(os.getloadavg()[2], 1)}
        try:
            outcomes = json.loads(result.stdout)["packages"]
        except (ValueError, KeyError):
            raise SystemExit(f"kiln build failed:\n{result.stderr[-4000:]}") from None
        packages: dict[str, Any] = {}
        failed = {name: outcome["status"] for name, outcome in outcomes.items() if outcome["status"] != "built"}
        for name in closure:
            outcome = outcomes[name]
            if outcome["status"] != "built":
                continue
            store_tree = cache / "store" / outcome["key"] / "tree"
            row = name if target.arch == "amd64" else f"{name}@{target.arch}"
            packages[row] = {
                "version": tree.packages[name].version,
                "key": outcome["key"],
                "seconds": round(outcome["seconds"], 1),
                **measure_output(store_tree),
            }
        if keep is None:
            shutil.rmtree(cache, ignore_errors=True)
    if failed:
        print(f"not measured: {failed}\n{result.stderr[-4000:]}", file=sys.stderr)
    return {"wall_seconds": round(wall, 1), "load_average": load, "packages": packages, "failed": failed}


def table(results: dict[str, Any]) -> str:
    lines = ["| package | version | cold build | output | binaries |", "|---|---|---|---|---|"]
    for name, info in results["packages"].items():
        binaries = {rel: size for rel, size in info["binaries"].items() if not rel.startswith("(")}
        ranked = sorted(binaries.items(), key=lambda item: -item[1])
        # measure_output folds all but the 10 largest of a long list into one "(N more)" entry
        count = len(binaries) + sum(int(rel[1:].split()[0]) for rel in info["binaries"] if rel.startswith("("))
        if count > 6:
            rel, size = ranked[0]
            shown = f"{count} binaries, largest `{Path(rel).name}` {format_size(size)}"
        else:
            shown = ", ".join(f"`{Path(rel).name}` {format_size(size)}" for rel, size in sorted(binaries.items()))
        lines.append(
            f"| {name} | {info['version']} | {info['seconds']:.0f} s | {format_size(info['output_bytes'])} "
            f"| {shown or '-'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", help=f"packages to build (default: {' '.join(DEFAULT)})")
    parser.add_argument("--platform", default="linux/amd64", help="target platform (linux/arm64: cross build)")
    parser.add_argument("--table", action="store_true", help="print the README table from the results file")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="build in DIR/cache and keep it (e.g. to reuse a cold-built toolchain)"
    )
    args = parser.parse_args()
    previous: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"packages": {}}
    if args.table:
        print(table(previous))
        return 0
    measured = run(args.packages or DEFAULT, args.keep, Platform.parse(args.platform))
    merged = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "toolchain": load_tree(PKGS, Platform.parse("linux/amd64")).toolchain,
        "packages": {**previous.get("packages", {}), **measured["packages"]},
        "last_run_wall_seconds": measured["wall_seconds"],
        "last_run_load_average": measured["load_average"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(merged, indent=2) + "\n")
    print(table(merged))
    return 1 if measured["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
