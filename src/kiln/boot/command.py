"""`kiln boot ARTIFACT`: boot it in QEMU and wait for the ready line (or --expect TEXT)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path

from kiln.boot.accel import BANNER, add_accel_option
from kiln.boot.accel import choose as choose_accel
from kiln.boot.arch import ARCHES, choose_arch
from kiln.boot.qemu import READY, BootResult, Machine, boot, machine_for
from kiln.boot.unpack import is_compressed, uncompressed
from kiln.core.console import say_line
from kiln.core.errors import BuildError, InputError
from kiln.core.paths import cache_dir
from kiln.core.renamed import Renamed
from kiln.core.verb import Context

# `--disk` names the target device in kiln install, so here the old spelling is only accepted
OLD_DISK = Renamed("boot", "--disk SIZE", "--blank-disk SIZE", "old_disk", "kiln install's --disk names a device")
OLD_KEEP = Renamed("boot", "--keep-running", "--keep", "old_keep")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "artifact",
        metavar="ARTIFACT",
        help="a directory with vmlinuz and initramfs.zst (or with boot.ipxe, for arm64 bootaa64.efi: PXE boot), "
        "an ISO, a disk image (also compressed: .raw.zst, .raw.xz, .raw.gz) or an EFI program (a UKI)",
    )
    parser.add_argument(
        "--arch",
        choices=ARCHES,
        help="the artifact's architecture (default: read from manifest.json or the artifact itself, else amd64)",
    )
    parser.add_argument(
        "--firmware",
        choices=("bios", "uefi"),
        help="bios (SeaBIOS, amd64 only) or uefi (OVMF on amd64, AAVMF on arm64); default: bios, uefi on arm64",
    )
    parser.add_argument(
        "--secure-boot",
        metavar="KEYS",
        type=Path,
        help="boot OVMF's Secure Boot build with the PK, KEK and db of key directory KEYS enrolled (amd64, UEFI)",
    )
    parser.add_argument(
        "--tpm",
        action="store_true",
        help="give the machine a TPM 2.0 (swtpm, fresh each boot): a UKI's sections are measured into PCR 11",
    )
    parser.add_argument("--blank-disk", metavar="SIZE", help="attach a blank virtio disk of SIZE (e.g. 4G)")
    OLD_DISK.add_to(parser, metavar="SIZE")
    parser.add_argument(
        "--disk-file", metavar="PATH", help="attach this qcow2 disk (created with --blank-disk SIZE if missing)"
    )
    parser.add_argument("--cmdline", default="", help="kernel command line (kernel+initramfs boots)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    parser.add_argument("--expect", default=READY, help=f"console text that means success (default {READY!r})")
    parser.add_argument(
        "--api",
        type=int,
        metavar="PORT",
        help="forward machined's API to 127.0.0.1:PORT; the machine then keeps running after the expected line",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the expected line, keep the machine running (its API forwarded with --api) until it powers "
        "off or Ctrl-C",
    )
    OLD_KEEP.add_to(parser, action="store_true")
    parser.add_argument("--memory", default="1024", help="guest memory in MiB (default 1024)")
    add_accel_option(parser)
    parser.add_argument("--log", metavar="PATH", help="console log (default: in the cache, printed at the end)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the console")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON on stdout (ok, seconds, line, reason, exit_code, log, tail); implies --quiet",
    )


def _shows_banner(machine: Machine, seconds: float) -> bool:
    """The accel probe: boot `machine` until the kernel's banner (or give up after `seconds`)."""
    with tempfile.TemporaryDirectory(prefix="kiln-accel-") as tmp:
        return boot(machine, BANNER, seconds, Path(tmp) / "console.log").ok


def blank_disk_size(args: argparse.Namespace) -> str | None:
    """--blank-disk SIZE, or the old --disk SIZE with a word on the new name."""
    size = OLD_DISK.value(args, args.blank_disk)
    return str(size) if size is not None else None


def run(ctx: Context[object]) -> int:
    args = ctx.args
    artifact = Path(args.artifact)
    arch = choose_arch(artifact, args.arch)
    say_line(f"kiln boot: booting as {arch.name} ({arch.why})")
    with tempfile.TemporaryDirectory(prefix="kiln-boot-") as work:
        if is_compressed(artifact):
            say_line(f"kiln boot: unpacking {artifact.name}")
        return _boot(args, uncompressed(artifact, Path(work)), arch.name)


def _boot(args: argparse.Namespace, artifact: Path, arch: str) -> int:
    machine = machine_for(artifact, arch)
    machine.cmdline = args.cmdline  # empty: the arch's serial console (ttyS0 on amd64, ttyAMA0 on arm64)
    machine.firmware = args.firmware or ""
    machine.secure_boot_keys = args.secure_boot
    machine.tpm = args.tpm
    machine.boot_firmware()  # --firmware bios on arm64 fails here, before a disk is made
    machine.memory = args.memory
    accel = choose_accel(args.accel, machine, _shows_banner)
    machine.accel = accel.accel
    say_line(f"kiln boot: {accel.accel} ({accel.why})")
    machine.api_port = args.api
    size = blank_disk_size(args)
    old_keep = bool(OLD_KEEP.value(args, None))  # both may be given: no clash
    keep = args.keep or old_keep or args.api is not None
    with tempfile.TemporaryDirectory(prefix="kiln-disk-") as tmp:
        if size or args.disk_file:
            disk = Path(args.disk_file) if args.disk_file else Path(tmp) / "disk.qcow2"
            if not disk.exists():
                if not size:
                    raise InputError(f"--disk-file {disk} does not exist: give --blank-disk SIZE to create it")
                made = subprocess.run(
                    ["qemu-img", "create", "-q", "-f", "qcow2", str(disk), size], capture_output=True, text=True
                )
                if made.returncode != 0:
                    raise InputError(f"--blank-disk {size}: {made.stderr.strip()}")
            machine.blank_disk = disk
        log = Path(args.log) if args.log else cache_dir() / "boot" / "last-console.log"
        echo = None if args.quiet or args.json else (lambda line: print(line, flush=True))

        def running(found: BootResult) -> None:
            api = f"; machined's API on https://127.0.0.1:{args.api}" if args.api is not None else ""
            say_line(
                f"kiln boot: {args.expect!r} after {found.seconds:.1f} s{api}; the machine runs until it powers "
                "off (Ctrl-C stops it)"
            )

        result = boot(
            machine,
            args.expect,
            args.timeout,
            log,
            echo,
            until_exit=keep,
            on_found=running if keep else None,
            exit_timeout=math.inf,
        )
    if args.json:
        fields: dict[str, object] = {"ok": result.ok, "seconds": round(result.seconds, 2), "line": result.line}
        fields["reason"] = result.reason
        fields |= {"exit_code": result.exit_code, "log": str(log), "tail": [] if result.ok else result.tail}
        print(json.dumps(fields, indent=2))
        return 0 if result.ok else 1
    if result.ok:
        what = "powered off" if keep else f"{args.expect!r} after {result.seconds:.1f} s"
        say_line(f"kiln boot: {what} (console log: {log})")
        return 0
    tail = "\n".join(result.tail)
    raise BuildError(f"boot failed: {result.reason}; last {len(result.tail)} console lines (full log: {log}):\n{tail}")
