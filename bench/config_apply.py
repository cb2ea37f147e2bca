"""Benchmark: a config change over machined's API to the machine showing it.

machined's Go test `TestConfigApplyLatency` (runtime/machined/api_config_bench_test.go) serves the API
with real mutual TLS on loopback in front of machined's config apply and resource runtime, and times
200 `POST /v1/config` (a new connection each, as `kiln node apply-config` makes) that change the
hostname and a static address: until the answer (the config is then kept on STATE, written beside,
fsynced and renamed), until `config/machine` holds the new version, and until `network/status` says
the network controller applied it. The same request with `mode=dry_run` (parsed and planned, nothing
written) is measured beside it, and the ratio says what keeping and applying add. The kernel's side
of the network (addresses on a real interface) is the e2e tests'. Run: `.venv/bin/python
bench/config_apply.py` (needs Go). Writes bench/results/config_apply.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINED = ROOT / "runtime/machined"
RESULTS = ROOT / "bench/results/config_apply.json"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kiln-config-bench-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "KILN_CONFIG_BENCH": str(out)}
        command = ["go", "test", "-count=1", "-run", "^TestConfigApplyLatency$", "."]
        done = subprocess.run(command, cwd=MACHINED, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"go test failed:\n{done.stdout}\n{done.stderr}")
        figures = json.loads(out.read_text())
    baseline = figures["dry_run_answered_ms"]["median"]
    figures["ratio_network_applied_to_dry_run"] = round(figures["network_applied_ms"]["median"] / baseline, 2)
    figures["cores"] = os.cpu_count()
    figures["load_average_1m"] = round(os.getloadavg()[0], 2)
    for name in ("dry_run_answered", "answered", "config_published", "network_applied"):
        ms = figures[f"{name}_ms"]
        print(f"{name:18s} median {ms['median']:7.2f} ms  p90 {ms['p90']:7.2f} ms")
    print(f"applied / dry run: {figures['ratio_network_applied_to_dry_run']:.2f} x")
    RESULTS.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
