"""Benchmark: what Secure Boot costs, measured beside the same outputs without it, in one run.

1. Image time (warm store): `kiln image iso metal` against the same two profiles with
   `secureboot: true` and a generated key set: the difference is the UKIs, shim and GRUB signing
   and the SHA256SUMS signatures. Each pair is run alternately, three times.
2. Boot to the ready line (TCG): the metal disk under OVMF without Secure Boot against the signed
   disk under OVMF's Secure Boot build with the keys enrolled, alternately, three times each.

Run: `.venv/bin/python bench/secureboot.py` from the project root (the packages must be built:
`make image` or any `kiln image` run); writes bench/results/secureboot.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiln.boot.qemu import READY, Machine, boot
from kiln.boot.unpack import uncompressed
from kiln.signing.generate import generate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/secureboot.json"
ROUNDS = 3
BOOT_TIMEOUT = 300


def secure_copy(name: str, keys: Path, work: Path) -> Path:
    """profiles/<name>.yaml with `secureboot: true` and the bench's keys (same outputs otherwise)."""
    text = (ROOT / "profiles" / f"{name}.yaml").read_text()
    path = work / f"{name}.yaml"
    path.write_text(f"{text}\nkeys: {{path: {keys}}}\nsecureboot: true\n")
    return path


def image_seconds(profiles: list[str], out: Path) -> float:
    began = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "kiln.cli", "image", *profiles, "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


def ready_seconds(machine: Machine, log: Path) -> float:
    result = boot(machine, READY, BOOT_TIMEOUT, log)
    if not result.ok:
        raise SystemExit(f"boot failed: {result.reason} (log {log})")
    return result.seconds


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-sb-") as tmp:
        work = Path(tmp)
        keys = generate(work / "keys", common_name="Kiln bench").root
        secure = [str(secure_copy(name, keys, work)) for name in ("iso", "metal")]
        plain = ["iso", "metal"]
        image_seconds(plain, work / "warm")  # the packages and the assembled initramfs are warm after this
        times: dict[str, list[float]] = {"plain": [], "secureboot": []}
        for _ in range(ROUNDS):
            times["plain"].append(image_seconds(plain, work / "plain"))
            times["secureboot"].append(image_seconds(secure, work / "secure"))
        boots: dict[str, list[float]] = {"uefi": [], "uefi_secureboot": []}
        # the shipped metal disk is zstd-compressed; QEMU boots the raw one, as `kiln boot` does
        plain_raw = uncompressed(work / "plain/metal/metal-amd64.raw.zst", work / "plain")
        signed_raw = uncompressed(work / "secure/metal/metal-amd64-secureboot.raw.zst", work / "secure")
        for index in range(ROUNDS):
            plain_disk = Machine(disk=plain_raw, firmware="uefi")
            boots["uefi"].append(ready_seconds(plain_disk, work / f"plain-{index}.log"))
            signed_disk = Machine(disk=signed_raw, secure_boot_keys=keys)
            boots["uefi_secureboot"].append(ready_seconds(signed_disk, work / f"secure-{index}.log"))
    image = {k: round(statistics.median(v), 2) for k, v in times.items()}
    ready = {k: round(statistics.median(v), 2) for k, v in boots.items()}
    result = {
        "image_seconds": image,
        "signing_adds_seconds": round(image["secureboot"] - image["plain"], 2),
        "image_ratio": round(image["secureboot"] / image["plain"], 2),
        "ready_seconds": ready,
        "secureboot_boot_adds_seconds": round(ready["uefi_secureboot"] - ready["uefi"], 2),
        "boot_ratio": round(ready["uefi_secureboot"] / ready["uefi"], 2),
        "rounds": ROUNDS,
    }
    print(
        f"kiln image iso metal: {image['plain']:.1f} s; with secureboot: {image['secureboot']:.1f} s "
        f"(+{result['signing_adds_seconds']:.1f} s, x{result['image_ratio']})"
    )
    print(
        f"metal disk to ready (TCG): UEFI {ready['uefi']:.1f} s; UEFI + Secure Boot {ready['uefi_secureboot']:.1f} s "
        f"(x{result['boot_ratio']})"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
