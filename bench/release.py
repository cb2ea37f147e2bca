"""Benchmark: a warm release (all 13 shipped profiles from stored packages) beside a plain shell script.

Kiln: `kiln image` with every profile of profiles/ (rootfs, initramfs, ten disks and their formats,
the ISO, PXE, the installer image, manifests, SBOMs and SHA256SUMS), every package already stored.
The script: the same tools with the same options in sequence and nothing around them (no checks,
hashes, manifests or SBOMs): one rootfs, initramfs and ISO (bench/image.py's floor), then for each
disk profile its own raw disk (its kernel command line differs) and its format: zstd -10 -T2 (metal,
aws), qemu-img vpc fixed (azure), gzip -n -6 (digital-ocean), GNU sparse tar + gzip (gcp), xz -0 -T2
in 16 MiB blocks (hcloud), qcow2 (openstack), streamOptimized vmdk in a tar (vmware's ova), raw
(nocloud, vultr); PXE's files and iPXE script; the installer's raw disk gzipped and its other files
as one gzipped tar layer. The compressors are the plain tools at the levels Kiln uses, reading the
whole disk; Kiln writes the same formats 4 MiB at a time around the disk's holes (kiln.image.chunked).
Timed alternately in one process, best of `--runs` (default 2). Target: Kiln at most 60 s on 2 cores
and faster than the script.

Run: `.venv/bin/python bench/release.py` after `make image` (or any build of the metal packages).
Writes bench/results/release.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from image import EPOCH, KILN_IMAGE, alternate, base_lines, disk_lines, trees  # bench/ is not a package

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/release.json"
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))
# disk profile -> the commands that turn <name>.raw into what it ships
FORMATS = {
    "aws": ["zstd -q -10 -T2 -f -o aws.raw.zst aws.raw && rm aws.raw"],
    "azure": ["qemu-img convert -f raw -O vpc -o subformat=fixed,force_size=on azure.raw azure.vhd && rm azure.raw"],
    "digital-ocean": ["gzip -n -6 -c digital-ocean.raw > digital-ocean.raw.gz && rm digital-ocean.raw"],
    "gcp": [
        "mkdir gcp && mv gcp.raw gcp/disk.raw",
        "tar --format=gnu --sparse --sort=name --mtime=@$SOURCE_DATE_EPOCH --owner=0 --group=0 --numeric-owner "
        "-C gcp -cf gcp.tar disk.raw && gzip -n -6 -c gcp.tar > gcp.raw.tar.gz && rm -r gcp gcp.tar",
    ],
    "hcloud": ["xz -0 -T2 --block-size=16MiB -c hcloud.raw > hcloud.raw.xz && rm hcloud.raw"],
    "metal": ["zstd -q -10 -T2 -f -o metal.raw.zst metal.raw && rm metal.raw"],
    "nocloud": [],
    "openstack": ["qemu-img convert -f raw -O qcow2 openstack.raw openstack.qcow2 && rm openstack.raw"],
    "vmware": [
        "qemu-img convert -f raw -O vmdk -o subformat=streamOptimized vmware.raw vmware.vmdk && rm vmware.raw",
        "printf '<Envelope/>\\n' > vmware.ovf && tar --format=ustar -cf vmware.ova vmware.ovf vmware.vmdk",
    ],
    "vultr": [],
}


def release_script(parts: dict[str, Path], work: Path, epoch: int) -> str:
    lines = base_lines(parts, work, epoch)
    for name, commands in FORMATS.items():
        cfg = f"grub-{name}.cfg"
        lines.append(
            f"printf 'linux /vmlinuz console=ttyS0 kiln.platform={name}\\ninitrd /initramfs.zst\\nboot\\n' > {cfg}"
        )
        lines += disk_lines(f"{name}.raw", cfg)
        lines += commands
    lines += [
        "mkdir pxe && cp vmlinuz initramfs.zst pxe/",
        "printf '#!ipxe\\nkernel vmlinuz initrd=initramfs.zst console=ttyS0\\ninitrd initramfs.zst\\nboot\\n' "
        "> pxe/boot.ipxe",
        # the installer carries a raw disk, gzipped (as its disk layer), beside kernel, initramfs and machined
        *disk_lines("installer.raw"),
        "gzip -n -6 -c installer.raw > installer.raw.gz && rm installer.raw",
        f"mkdir installer && cp vmlinuz initramfs.zst {shlex.quote(str(parts['machined']))}/usr/sbin/machined "
        "installer/",
        f"tar --sort=name --mtime=@{epoch} --owner=0 --group=0 --numeric-owner -C installer -cf - . "
        "| gzip -n -6 > installer-layer.tar.gz",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    parts = trees()
    times = alternate(
        args.runs,
        lambda work: release_script(parts, work, EPOCH),
        {"kiln": lambda work: [*KILN_IMAGE, *PROFILES, "--out", str(work / "kiln")]},
    )
    script_s, kiln_s = min(times["script"]), min(times["kiln"])
    result = {
        "profiles": PROFILES,
        "script_s": round(script_s, 2),
        "kiln_s": round(kiln_s, 2),
        "ratio": round(kiln_s / script_s, 2),
        "script_runs": [round(t, 2) for t in times["script"]],
        "kiln_runs": [round(t, 2) for t in times["kiln"]],
        "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(f"plain shell script, same tools, in sequence: {script_s:6.1f} s")
    print(f"kiln image (all {len(PROFILES)} profiles):          {kiln_s:6.1f} s  ({result['ratio']} x the script)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
