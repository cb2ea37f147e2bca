"""Benchmark: load + validate + key a generated 500-package tree (chains and fan-in).

Prints packages per second and the wall time of each phase. Target: at most 1 s in all
on this 2-core machine. Run: `.venv/bin/python bench/graph.py [--packages N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

SHA = "7d5b0b6062521e4627e099e4c9dc8248d32a30285e959b7eecaa780cf8cfd4a4"


def generate(root: Path, count: int, seed: int = 1) -> None:
    """Half the packages form chains of 10; the rest fan in from up to 8 earlier ones."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    (root / "vars.yaml").write_text("opt: -O2\n")
    (root / "toolchain").mkdir()
    (root / "toolchain/pkg.yaml").write_text("name: toolchain\nvariant: stage0\nfinalize: [{from: /t, to: /t}]\n")
    for i in range(count):
        chained = i % 2 == 0 and i % 20 != 0
        needs = [i - 2] if chained else sorted(rng.sample(range(i), min(i, rng.randint(0, 8))))
        deps = "".join(f"  - stage: p{n:04d}\n    runtime: {str(n % 3 == 0).lower()}\n" for n in needs)
        template = "{% if arch == 'amd64' %}\n" if i % 5 == 0 else ""
        end = "{% endif %}\n" if i % 5 == 0 else ""
        text = (
            f"name: p{i:04d}\nversion: '1.{i}'\n"
            + (f"dependencies:\n{deps}" if deps else "")
            + "steps:\n  - sources:\n"
            + f"      - url: https://example.org/p{i}-{{{{ arch }}}}.tar.gz\n"
            + f"        destination: src.tar.gz\n        sha256: {SHA}\n"
            + "    env:\n      CFLAGS: '{{ opt }}'\n"
            + "    build:\n      - make -j{{ jobs }} CC={{ target }}-gcc\n"
            + template
            + "      - echo only on amd64\n"
            + end
            + "    install:\n      - make install DESTDIR=/out\n"
            + "finalize:\n  - from: /out\n    to: /\n"
        )
        directory = root / f"p{i:04d}"
        directory.mkdir()
        (directory / "pkg.yaml").write_text(text)
        (directory / "patch.diff").write_text(f"--- a/{i}\n+++ b/{i}\n")


def measure(root: Path, cache: Path) -> dict[str, float]:
    """Time one load in a fresh interpreter, as `kiln validate` would run it."""
    code = (
        "import json, sys, time; from pathlib import Path;"
        "t0 = time.perf_counter();"
        "from kiln.build.cache_keys import compute_keys; from kiln.pkg.graph import Graph;"
        "from kiln.pkg.loader import load_tree; from kiln.pkg.variables import Platform;"
        "t1 = time.perf_counter(); tree = load_tree(Path(sys.argv[1]), Platform.parse('linux/amd64'));"
        "t2 = time.perf_counter(); graph = Graph(tree); keys = compute_keys(graph); t3 = time.perf_counter();"
        "print(json.dumps({'import': t1 - t0, 'load': t2 - t1, 'graph_keys': t3 - t2, 'count': len(keys)}))"
    )
    env = {**os.environ, "KILN_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", code, str(root)], env=env, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--packages", type=int, default=500)
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pkgs"
        generate(root, args.packages)
        cache = Path(tmp) / "cache"
        for label in ("first run", "warm", "warm"):
            r = measure(root, cache)
            total = r["load"] + r["graph_keys"]
            worst = max(worst, total) if label != "first run" else worst
            print(
                f"{label:28s} packages={int(r['count'])} load+validate={r['load']:.3f}s "
                f"graph+keys={r['graph_keys']:.3f}s total={total:.3f}s ({r['count'] / total:.0f} packages/s) "
                f"ratio to 1 s target={total:.2f}x  [imports {r['import']:.3f}s, not counted]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
