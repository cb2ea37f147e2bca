"""Benchmark: the imager from warm package outputs, beside a plain shell script calling the same tools.

Kiln: `kiln image iso metal openstack` (rootfs, initramfs, ISO, raw disk, qcow2 and their
manifests and SBOMs; every package already in the store). The floor: one shell script that runs
the same tools with the same options in sequence, with none of Kiln's work around them (no
checks, no stripping or pruning, no hashing, no manifest): cp -a of the package trees,
mksquashfs, cpio | zstd, grub-mkimage, mkfs.fat + mtools, xorriso, sfdisk, qemu-img. Both
runs are timed in the same process, alternately, best of `--runs` (default 2).

Run: `.venv/bin/python bench/image.py` after `make image` (or any build of the metal packages).
Writes bench/results/image.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kiln.build.cache_keys import compute_keys
from kiln.build.store import Store
from kiln.core.paths import cache_dir
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from kiln.rootfs.assemble import BASE_ROOTFS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/image.json"
GRUB = "/usr/lib/grub"
MODULES = "part_gpt fat search search_fs_uuid normal configfile linux serial terminal echo test"


def trees() -> dict[str, Path]:
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64")))
    keys = compute_keys(graph)
    store = Store(cache_dir())
    names = ["kernel", "init", *BASE_ROOTFS]
    missing = [n for n in names if not store.has(keys[n])]
    if missing:
        raise SystemExit(f"not in the store: {', '.join(missing)}; run `make image` first")
    return {name: store.tree(keys[name]) for name in names}


def base_lines(parts: dict[str, Path], work: Path, epoch: int) -> list[str]:
    """The rootfs, initramfs and ISO with the same tools and options as Kiln's imager, nothing else."""
    q = shlex.quote
    lines = ["set -eu", f"cd {q(str(work))}", "export TZ=UTC MTOOLS_SKIP_CHECK=1", "mkdir -p root initrd"]
    lines += [f"cp -a {q(str(parts[n]))}/. root/" for n in BASE_ROOTFS]
    lines.append(f"cp -a {q(str(parts['kernel']))}/usr/. root/usr/ && rm -rf root/boot")
    lines += [
        f"mksquashfs root initrd/rootfs.sqsh -noappend -no-progress -quiet -comp lz4 -all-root -no-xattrs "
        f"-mkfs-time {epoch} -all-time {epoch} -processors {os.cpu_count() or 1}",
        f"cp {q(str(parts['init']))}/init initrd/init",
        "(cd initrd && find . -mindepth 1 | sed 's|^./||' | sort | cpio --create --format=newc --reproducible "
        "--owner=0:0 --quiet) | zstd -3 -q --no-check -o initramfs.zst",
        f"cp {q(str(parts['kernel']))}/boot/vmlinuz vmlinuz",
        f"export SOURCE_DATE_EPOCH={epoch}",
        "printf 'search --no-floppy --set=root --fs-uuid 1234-5678\\nset prefix=($root)/grub\\n' > load.cfg",
        "printf 'linux /vmlinuz console=ttyS0\\ninitrd /initramfs.zst\\nboot\\n' > grub.cfg",
        # ISO
        f"grub-mkimage -O i386-pc-eltorito -d {GRUB}/i386-pc -p /boot/grub -c load.cfg -o eltorito.img "
        f"biosdisk {MODULES}",
        f"grub-mkimage -O x86_64-efi -d {GRUB}/x86_64-efi -p /boot/grub -c load.cfg -o BOOTX64.EFI efi_gop {MODULES}",
        "mkfs.fat -C --invariant -i 12345678 -n KILN_EFI efi.img 4096 >/dev/null",
        "mmd -i efi.img ::/EFI ::/EFI/BOOT && mcopy -m -i efi.img BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI",
        "xorriso -as mkisofs -graft-points -V KILN -b boot/grub/i386-pc/eltorito.img -no-emul-boot "
        "-boot-load-size 4 -boot-info-table --grub2-boot-info "
        f"--grub2-mbr {GRUB}/i386-pc/boot_hybrid.img --efi-boot efi.img -efi-boot-part --efi-boot-image "
        "--protective-msdos-label -r -o kiln.iso /boot/vmlinuz=vmlinuz /boot/initramfs.zst=initramfs.zst "
        "/boot/grub/grub.cfg=grub.cfg /boot/grub/i386-pc/eltorito.img=eltorito.img /efi.img=efi.img "
        "2>/dev/null",
    ]
    return lines


def disk_lines(disk: str, grub_cfg: str = "grub.cfg") -> list[str]:
    """A raw disk as the imager makes it: GPT, two FAT32 filesystems filled with mtools, GRUB for BIOS and UEFI."""
    return [
        f"truncate -s 1G {disk}",
        "printf 'label: gpt\\nstart=2048,size=204800,type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B,name=EFI\\n"
        "size=2048,type=21686148-6449-6E6F-744E-656564454649,name=BIOS\\n"
        "size=262144,type=0FC63DAF-8483-4772-8E79-3D69D8477DE4,name=BOOT\\n"
        "size=2048,type=0FC63DAF-8483-4772-8E79-3D69D8477DE4,name=META\\n' "
        f"| sfdisk --quiet --no-reread --no-tell-kernel {disk}",
        f"grub-mkimage -O i386-pc -d {GRUB}/i386-pc -p /grub -c load.cfg -o core.img biosdisk {MODULES}",
        f"grub-mkimage -O x86_64-efi -d {GRUB}/x86_64-efi -p /grub -c load.cfg -o BOOTX64.EFI efi_gop {MODULES}",
        f"mkfs.fat --invariant -i 12345678 -F 32 -s 1 -n EFI -h 2048 --offset=2048 {disk} 102400 >/dev/null",
        f"mmd -i {disk}@@1048576 ::/EFI ::/EFI/BOOT && mcopy -i {disk}@@1048576 BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI",
        f"mkfs.fat --invariant -i 12345679 -F 32 -s 1 -n BOOT -h 208896 --offset=208896 {disk} 131072 >/dev/null",
        f"mmd -i {disk}@@106954752 ::/grub",
        f"mcopy -i {disk}@@106954752 vmlinuz ::/vmlinuz && mcopy -i {disk}@@106954752 initramfs.zst "
        f"::/initramfs.zst && mcopy -i {disk}@@106954752 {grub_cfg} ::/grub/grub.cfg",
        f"dd if={GRUB}/i386-pc/boot.img of={disk} bs=440 count=1 conv=notrunc status=none",
        f"dd if=core.img of={disk} bs=512 seek=206848 conv=notrunc status=none",
    ]


def floor_script(parts: dict[str, Path], work: Path, epoch: int) -> str:
    """The same tools as Kiln's imager, in sequence, with their options and nothing else."""
    lines = base_lines(parts, work, epoch) + disk_lines("disk.raw")
    lines.append("qemu-img convert -O qcow2 disk.raw disk.qcow2")  # as the openstack profile does
    return "\n".join(lines) + "\n"


def timed(command: list[str], **kwargs: object) -> float:
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"{command[:3]} failed:\n{done.stdout}\n{done.stderr}")
    return time.monotonic() - began


EPOCH = 1704067200  # the scripts' SOURCE_DATE_EPOCH
KILN_IMAGE = [sys.executable, "-m", "kiln.cli", "image"]


def alternate(
    runs: int, script: Callable[[Path], str], kiln: dict[str, Callable[[Path], list[str]]]
) -> dict[str, list[float]]:
    """Time the shell script, then each Kiln command, `runs` times over, each run in a fresh
    directory: times["script"] and times[<name>] per run."""
    times: dict[str, list[float]] = {"script": [], **{name: [] for name in kiln}}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
            work = Path(tmp)
            (work / "script").mkdir()
            (work / "run.sh").write_text(script(work / "script"))
            times["script"].append(timed(["sh", str(work / "run.sh")]))
            for name, command in kiln.items():
                times[name].append(timed(command(work), cwd=ROOT))
    return times


def image_with_jobs(jobs: str, src: Path | None = None) -> Callable[[Path], list[str]]:
    """The Kiln command; with `src`, the kiln package from that source tree (an older checkout's src/)."""
    prefix = ["env", f"PYTHONPATH={src}"] if src else []
    name = f"kiln-j{jobs}" + ("-before" if src else "")

    def command(work: Path) -> list[str]:
        return [*prefix, *KILN_IMAGE, "iso", "metal", "openstack", "--jobs", jobs, "--out", str(work / name)]

    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--before",
        type=Path,
        metavar="SRC",
        help="also time the kiln package of this source tree (e.g. `git archive OLD src | tar -x -C DIR`, then "
        "DIR/src), alternately with this one, and report this one against it (`--label` names the comparison)",
    )
    parser.add_argument("--label", default="", help="what --before is, recorded with the figures")
    args = parser.parse_args()
    parts = trees()
    kiln = {f"jobs{jobs}": image_with_jobs(jobs) for jobs in ("2", "1")}
    if args.before:
        kiln["before_jobs2"] = image_with_jobs("2", args.before.resolve())
    times = alternate(args.runs, lambda work: floor_script(parts, work, EPOCH), kiln)
    best_floor, best_kiln, best_serial = min(times["script"]), min(times["jobs2"]), min(times["jobs1"])
    result = {
        "outputs": "rootfs, initramfs, iso, raw (metal), qcow2 (openstack)",
        "floor_script_s": round(best_floor, 2),
        "kiln_jobs2_s": round(best_kiln, 2),
        "kiln_jobs1_s": round(best_serial, 2),
        "ratio_jobs2": round(best_kiln / best_floor, 2),
        "ratio_jobs1": round(best_serial / best_floor, 2),
        "runs": args.runs,
        "load_average": os.getloadavg()[0],
    }
    if args.before:
        best_before = min(times["before_jobs2"])
        result["before"] = {
            "label": args.label,
            "kiln_jobs2_s": round(best_before, 2),
            "ratio_now_to_before_jobs2": round(best_kiln / best_before, 3),
        }
        print(f"the same with {args.label or args.before}: {best_before:6.1f} s  (now {best_kiln / best_before:.3f} x)")
    print(f"floor script (same tools, in sequence): {best_floor:6.1f} s")
    print(f"kiln image iso metal openstack --jobs 2: {best_kiln:6.1f} s  ({result['ratio_jobs2']} x the script)")
    print(f"kiln image iso metal openstack --jobs 1: {best_serial:6.1f} s  ({result['ratio_jobs1']} x the script)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
