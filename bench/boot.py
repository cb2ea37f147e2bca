"""Benchmark: QEMU start to the ready line (TCG), Kiln's initramfs beside a busybox one on the same kernel.

The baseline boots Kiln's own vmlinuz with the same command line and a busybox initramfs (Debian's
busybox-static) whose /init prints a line and powers off: the floor for "this kernel and a tiny
userspace" on this machine, so the ratio measures Kiln's userspace alone (unpacking the bigger
initramfs, mounting the squashfs, machined's work up to ready). The two are booted alternately,
four times each; the medians and their ratio are printed (target: at most 1.2 x), with machined's
own account of where its part went (its `boot: ready ...` line) and the sizes of init, machined,
rootfs.sqsh and the initramfs (target: initramfs at most 12 MB; Talos's is about 56 MB).

Run: `.venv/bin/python bench/boot.py ARTIFACT_DIR [ARM64_DIR]` where ARTIFACT_DIR holds vmlinuz and
initramfs.zst from `kiln image --kind kernel,initramfs`; ARM64_DIR, the same from
`--platform linux/arm64`, adds the arm64 image booted in qemu-system-aarch64 (TCG, AAVMF) beside it.
Writes bench/results/boot.json.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.boot.arch import choose_arch
from kiln.boot.platforms import platform_for
from kiln.boot.qemu import Machine, boot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/boot.json"
BASELINE_LINE = "baseline ready"
RUNS = 4


def debian_package(name: str, dest: Path) -> Path:
    """Download and unpack one Debian package (the archive is the only thing reachable here)."""
    subprocess.run(["apt-get", "download", "-q", name], cwd=dest, check=True, capture_output=True)
    deb = next(dest.glob("*.deb"))
    unpacked = dest / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    deb.unlink()
    return unpacked


def baseline(work: Path, kernel: Path) -> Path:
    """Kiln's own kernel with a busybox initramfs that prints BASELINE_LINE and powers off."""
    (work / "b").mkdir()
    busybox_root = debian_package("busybox-static", work / "b")
    out = work / "baseline"
    tree = out / "tree"
    (tree / "bin").mkdir(parents=True)
    shutil.copy(busybox_root / "bin/busybox", tree / "bin/busybox")
    (tree / "init").write_text(f"#!/bin/busybox sh\n/bin/busybox echo {BASELINE_LINE}\n/bin/busybox poweroff -f\n")
    (tree / "init").chmod(0o755)
    shutil.copy(kernel, out / "vmlinuz")
    cpio = subprocess.run(
        "find . -mindepth 1 | sort | cpio -o -H newc --quiet | zstd -3 -q",
        shell=True,
        cwd=tree,
        capture_output=True,
        check=True,
    ).stdout
    (out / "initramfs.zst").write_bytes(cpio)
    return out


def timed(directory: Path, expect: str, log: Path) -> float:
    arch = choose_arch(directory).name  # a kernel+initramfs directory: its vmlinuz header decides
    machine = Machine(
        kernel=directory / "vmlinuz",
        initrd=directory / "initramfs.zst",
        cmdline=f"console={platform_for(arch).console} quiet kiln.test=poweroff",
        arch=arch,
    )
    result = boot(machine, expect, 120, log)
    if not result.ok:
        raise SystemExit(f"{directory}: {result.reason}\n" + "\n".join(result.tail))
    return result.seconds


def sizes(artifact: Path, work: Path) -> dict[str, int]:
    unpacked = work / "unpacked"
    unpacked.mkdir()
    raw = subprocess.run(["zstd", "-dc", str(artifact / "initramfs.zst")], capture_output=True, check=True).stdout
    subprocess.run(["cpio", "-id", "--quiet"], input=raw, cwd=unpacked, check=True)
    root = work / "rootfs"
    subprocess.run(
        ["unsquashfs", "-q", "-d", str(root), str(unpacked / "rootfs.sqsh")], check=True, capture_output=True
    )
    return {
        "init": (unpacked / "init").stat().st_size,
        "machined": (root / "usr/sbin/machined").stat().st_size,
        "rootfs.sqsh": (unpacked / "rootfs.sqsh").stat().st_size,
        "initramfs.zst": (artifact / "initramfs.zst").stat().st_size,
        "vmlinuz": (artifact / "vmlinuz").stat().st_size,
    }


def machined_account(log: Path) -> str:
    """machined's `boot: ready N s after the kernel started (phases)` line from a console log."""
    for line in log.read_text(errors="replace").splitlines():
        if "machined: boot: ready" in line:
            return line.split("machined: boot: ", 1)[1].strip()
    return "(no phase line: machined older than its boot timing)"


def main() -> int:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    artifact = Path(sys.argv[1])
    arm64 = Path(sys.argv[2]) if len(sys.argv) == 3 else None
    arm64_runs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-boot-") as tmp:
        work = Path(tmp)
        base = baseline(work, artifact / "vmlinuz")
        kiln_runs, base_runs = [], []
        for attempt in range(RUNS):  # alternating, so a busy moment of the host hits both
            kiln_runs.append(timed(artifact, "machined ready:", work / f"kiln{attempt}.log"))
            base_runs.append(timed(base, BASELINE_LINE, work / f"base{attempt}.log"))
            if arm64 is not None:
                arm64_runs.append(timed(arm64, "machined ready:", work / f"arm64-{attempt}.log"))
        account = machined_account(work / f"kiln{RUNS - 1}.log")
        found = sizes(artifact, work)
    kiln_s, base_s = statistics.median(kiln_runs), statistics.median(base_runs)
    ratio = kiln_s / base_s
    print(f"QEMU start to ready (TCG, same kernel and command line, median of {RUNS} alternating runs):")
    print(f"  Kiln (init, squashfs, machined) {kiln_s:.2f} s  {[round(r, 2) for r in kiln_runs]}")
    print(f"  busybox initramfs               {base_s:.2f} s  {[round(r, 2) for r in base_runs]}")
    print(f"  -> {ratio:.2f} x the busybox baseline; target <= 1.2 x")
    print(f"  machined's own account: {account}")
    extra: dict[str, float] = {}
    if arm64_runs:
        extra["arm64_ready_seconds"] = round(statistics.median(arm64_runs), 2)
        print(
            f"arm64 (qemu-system-aarch64 -M virt, cortex-a72, TCG, median of {RUNS}): "
            f"{extra['arm64_ready_seconds']:.2f} s -> {extra['arm64_ready_seconds'] / kiln_s:.2f} x amd64"
        )
    for name, size in found.items():
        print(f"  {name:14s} {size / 1048576:8.2f} MiB")
    print(f"initramfs {found['initramfs.zst'] / 1e6:.1f} MB; target <= 12 MB (Talos: about 56 MB)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "kiln_ready_seconds": round(kiln_s, 2),
                "baseline_ready_seconds": round(base_s, 2),
                "baseline": "Kiln's vmlinuz, same command line, busybox-static initramfs",
                "ratio": round(ratio, 3),
                "kiln_runs": [round(r, 2) for r in kiln_runs],
                "baseline_runs": [round(r, 2) for r in base_runs],
                "machined_account": account,
                **extra,
                "sizes": found,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
