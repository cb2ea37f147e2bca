"""`kiln boot --accel auto`: KVM where it boots Linux, TCG elsewhere.

/dev/kvm being there is not enough: on some hosts (nested virtualisation without the CPU features a
kernel wants) KVM starts a guest whose firmware and boot loader run, and then the kernel hangs
without a word. So auto asks the artifact itself, once per host: a first boot under KVM that must
show the kernel's banner within PROBE_SECONDS. The answer is kept in the cache, keyed by the host
kernel and QEMU's version, so later boots choose at once; TCG is the answer whenever KVM cannot be
used or did not prove itself (a guest of another arch, no /dev/kvm, no banner).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kiln.boot.qemu import Machine
from kiln.core.paths import cache_dir

ACCELS = ("auto", "tcg", "kvm")
ACCEL_HELP = (
    "auto (default: KVM when this host's KVM has booted Linux, found out once by a first boot and cached; else "
    "TCG), tcg or kvm"
)
PROBE_SECONDS = 10.0
BANNER = "Linux version"  # the kernel's first console line
KVM_DEVICE = Path("/dev/kvm")
_HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def add_accel_option(parser: argparse.ArgumentParser, help: str = ACCEL_HELP) -> None:
    """--accel of every verb that boots a machine (choose() resolves auto)."""
    parser.add_argument("--accel", choices=ACCELS, default="auto", help=help)


@dataclass(frozen=True)
class Choice:
    accel: str
    why: str


Prober = Callable[[Machine, float], bool]  # does this machine show the banner in time?


def host_key(machine: Machine) -> str:
    """What the probe's answer depends on: the host kernel and the QEMU binary's version."""
    qemu = machine.platform().qemu
    try:
        version = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        version = ""
    first = version.splitlines()[0] if version else "unknown"
    return f"{platform.release()} {qemu} {first}"


def _cache_file() -> Path:
    return cache_dir() / "boot" / "accel.json"


def _read_cache() -> dict[str, bool]:
    try:
        data = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, bool)} if isinstance(data, dict) else {}


def _write_cache(key: str, *, works: bool) -> None:
    data = _read_cache()
    data[key] = works
    path = _cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    partial.replace(path)


def choose(requested: str, machine: Machine, probe: Prober) -> Choice:
    """The accelerator to boot `machine` with: `requested` unless it is auto (see the module's docstring)."""
    if requested != "auto":
        return Choice(requested, f"--accel {requested}")
    if _HOST_ARCH.get(platform.machine()) != machine.arch:
        return Choice("tcg", f"a {machine.arch} guest on a {platform.machine()} host: emulated")
    if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return Choice("tcg", f"{KVM_DEVICE} is missing or not usable")
    key = host_key(machine)
    known = _read_cache().get(key)
    if known is None:
        known = probe(replace(machine, accel="kvm"), PROBE_SECONDS)
        _write_cache(key, works=known)
        found = "showed" if known else "did not show"
        return Choice("kvm" if known else "tcg", f"a first boot under KVM {found} the kernel's banner in time")
    if known:
        return Choice("kvm", f"KVM booted Linux on this host before ({_cache_file()})")
    return Choice("tcg", f"KVM hung before the kernel's banner on this host ({_cache_file()})")
