"""Benchmark: an upgrade from the request to the ready line on the new version (QEMU, TCG).

It builds versions 1 and 2 of the installer profile and serves them from Debian's
docker-registry the way tests/e2e/test_upgrade.py does (the same helpers), installs version 1
on a disk, boots it once to make STATE and EPHEMERAL, then measures in one run:

- plain boot: QEMU start to the ready line on version 1 (the yardstick);
- the upgrade to version 2: pull and install (machined's own figures in /v1/status), reboot
  (from the end of the install until QEMU is gone: machined's shutdown; QEMU runs with
  -no-reboot, so the harness starts it again at once) and boot (QEMU start to the ready line
  on version 2, the trial slot marked good on the way);
- what was pulled against the whole installer image (the disk image layer is never pulled).

The target: the upgrade at most 2 x the plain boot plus the pull. Results go to
bench/results/upgrade.json. Run as root: `.venv/bin/python bench/upgrade.py`.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_system import console  # noqa: E402
from tests.e2e.test_upgrade import (  # noqa: E402
    REPO,
    V2,
    Session,
    blob_path,
    first_boot,
    fresh_disk,
    push,
    ready_version,
    upgrade_world,
)

from kiln.boot.qemu import READY  # noqa: E402

RESULTS = ROOT / "bench/results/upgrade.json"
INSTALLED = re.compile(r"on trial; rebooting \(pull (?P<pull>[0-9.]+) s, install (?P<install>[0-9.]+) s\)")


def image_bytes(layout: Path) -> tuple[int, int]:
    """All layers' bytes, and the bytes an upgrade pulls (every layer but the disk image)."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob_path(layout, index["manifests"][0]["digest"]).read_bytes())
    layers = manifest["layers"]
    pulled = sum(x["size"] for x in layers if x["annotations"]["dev.kiln.layer"] != "disk")
    return sum(x["size"] for x in layers), pulled


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-upgrade-") as tmp, upgrade_world(Path(tmp)) as world:
        push(world.v2.layout, world.registry, "stable")
        disk = fresh_disk(world, "bench.raw")
        first_boot(world, disk, "bios")

        start = time.monotonic()
        session = Session(disk, "bios", world.work / "plain.log")
        session.wait_for(READY)
        plain = time.monotonic() - start

        requested = time.monotonic()
        status = session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V2}"})
        upgrade = status.get("upgrade") or {}
        assert isinstance(upgrade, dict) and upgrade.get("state") in ("installing", "rebooting"), status
        session.end()
        gone = time.monotonic()
        # the API goes away with the services, so the install time comes from the console
        done = INSTALLED.search(session.log.read_text(errors="replace"))
        assert done, console(session.log)[-20:]
        again = Session(disk, "bios", world.work / "upgraded.log")
        again.wait_for(READY)
        ready = time.monotonic()
        assert ready_version(again.log) == V2, console(again.log)[-20:]
        pull, install = float(done["pull"]), float(done["install"])
        total = ready - requested
        reboot = gone - requested - pull - install
        boot = ready - gone
        whole, expected_pull = image_bytes(world.v2.layout)
        pulled = int(upgrade["pulled_bytes"])
        again.end()

    result = {
        "plain_boot_seconds": round(plain, 1),
        "upgrade_seconds": round(total, 1),
        "pull_seconds": round(pull, 1),
        "install_seconds": round(install, 1),
        "reboot_seconds": round(reboot, 1),
        "boot_seconds": round(boot, 1),
        "target_seconds": round(2 * plain + pull, 1),
        "ratio_to_target": round(total / (2 * plain + pull), 2),
        "pulled_mib": round(pulled / (1 << 20), 1),
        "image_mib": round(whole / (1 << 20), 1),
        "pulled_share": round(pulled / whole, 3),
        "pull_matches_layers": pulled == expected_pull,
    }
    print(
        f"plain boot {plain:.1f} s; upgrade {total:.1f} s = pull {pull:.1f} + install {install:.1f}"
        f" + reboot {reboot:.1f} + boot {boot:.1f}; target 2 x boot + pull = {2 * plain + pull:.1f} s"
        f" (ratio {result['ratio_to_target']}); pulled {result['pulled_mib']} of {result['image_mib']} MiB"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
