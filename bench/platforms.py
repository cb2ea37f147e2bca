"""Benchmark: boot to ready on each cloud profile against its fake cloud, beside the metal boot.

Every profile is built once (`kiln image`); each cloud image then boots in QEMU (TCG) against the
fake metadata service of tests/e2e/test_platforms.py (the same helpers, the same user data), and
the metal disk boots on the same network before and after them (its two times show the noise).
For each platform it prints QEMU start to the ready line, the difference to the metal boot, and
the platform layer's own time as machined reports it (`platform: NAME: ... (N ms)`: DHCP to the
metadata service and the fetch).

The target: the platform layer adds at most 1 s. Results go to bench/results/platforms.json.
Run as root: `.venv/bin/python bench/platforms.py [PLATFORM ...]`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_platforms import (  # noqa: E402
    PLATFORMS,
    bootable_disk,
    drive_for,
    fake_cloud,
    machine_config,
)
from tests.e2e.test_system import console, make_ca, make_cert  # noqa: E402

from kiln.boot.qemu import READY, Machine, boot  # noqa: E402

TIMEOUT = 300.0
LAYER = re.compile(r"machined: platform: (\S+): .*\((\d+) ms\)$")


def ready_seconds(machine: Machine, log: Path) -> float:
    result = boot(machine, READY, TIMEOUT, log)
    if not result.ok:
        raise SystemExit(f"{log.name}: {result.reason}\n" + "\n".join(result.tail))
    return result.seconds


def layer_ms(log: Path) -> int | None:
    for line in console(log):
        found = LAYER.search(line)
        if found:
            return int(found.group(2))
    return None


def main(names: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-platforms-") as tmp:
        work = Path(tmp)
        out = work / "out"
        profiles = ["metal", *names]
        subprocess.run([sys.executable, "-m", "kiln.cli", "image", *profiles, "--out", str(out)], cwd=ROOT, check=True)
        pki = work / "pki"
        pki.mkdir()
        make_ca(pki, "ca")
        make_cert(pki, "ca", "machine", "subjectAltName=IP:127.0.0.1")
        user_data = machine_config(pki)

        def metal(run: str) -> float:
            disk, fmt = bootable_disk(out, "metal", work)
            with fake_cloud("metal", user_data) as (_, options):
                return ready_seconds(
                    Machine(disk=disk, disk_format=fmt, net_options=options), work / f"metal-{run}.log"
                )

        rows: dict[str, dict[str, float | int | None]] = {}
        metal_before = metal("before")
        for name in names:
            disk, fmt = bootable_disk(out, name, work)
            log = work / f"{name}.log"
            with fake_cloud(name, user_data) as (_, options):
                guest = Machine(disk=disk, disk_format=fmt, net_options=options, cdrom=drive_for(name, user_data, work))
                seconds = ready_seconds(guest, log)
            rows[name] = {"ready_seconds": round(seconds, 2), "platform_ms": layer_ms(log)}
        metal_after = metal("after")
        yardstick = (metal_before + metal_after) / 2
        print(f"metal: {metal_before:.1f} s before, {metal_after:.1f} s after (mean {yardstick:.1f} s)")
        print(f"{'platform':15} {'ready':>8} {'vs metal':>9} {'layer':>8}")
        for name, row in rows.items():
            seconds = float(row["ready_seconds"] or 0)
            row["vs_metal_seconds"] = round(seconds - yardstick, 2)
            layer = row["platform_ms"]
            print(f"{name:15} {seconds:7.1f}s {seconds - yardstick:+8.1f}s {str(layer) + ' ms':>8}")
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        report = {"metal_seconds": [round(metal_before, 2), round(metal_after, 2)], "platforms": rows}
        (results / "platforms.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:] or PLATFORMS)
