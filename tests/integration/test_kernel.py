"""Kernel config work for real, without building the kernel (that takes 13+ minutes; CI does not).

In a project holding the real pkgs/kernel (and toolchain-seed, stage0.yaml, vars.yaml):

- `kiln kernel olddefconfig` runs in the kernel's build container and leaves the shipped
  config-amd64 and config-arm64 unchanged: they are fixed points of olddefconfig + savedefconfig,
  and the config Kconfig resolves from config-amd64 has every option Kiln requires;
- a fragment selected with `--set kernel_fragments=...` reaches the `.config` of a package build
  that runs the kernel package's own steps up to configuration (unpack, kconfig.sh) and stops;
  without fragments the same steps give the main config alone;
- kconfig.sh fails a configuration with a fragment whose option Kconfig drops, naming the option,
  and one with a fragment that does not exist.

Unpacking the kernel source (about 140 MB of xz, 1.3 GB of files) is most of each case's time, so
the configure build unpacks it once and runs kconfig.sh for all four selections, each into an
object directory of its own; each olddefconfig run unpacks it once too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kiln.kconfig import config as kconfig
from tests.integration.conftest import ROOT, seed_into
from tests.unit.test_kernel_config import REQUIRED

pytestmark = pytest.mark.integration

Y = ("y",)
M = ("m",)
N = ("n",)

# What each arch needs on top of REQUIRED, checked on the config Kconfig resolves (these are
# mostly defaults or selects, which the savedefconfig file does not show).
REQUIRED_ARCH: dict[str, dict[str, tuple[str, ...]]] = {
    "amd64": {},
    "arm64": {
        # QEMU virt: GIC, arch timer, PSCI, ECAM PCI, virtio-mmio, PL011 (ttyAMA0, also GCP and
        # Azure) with earlycon, PL031 clock
        "CONFIG_ARM_GIC_V3": Y,
        "CONFIG_ARM_GIC_V3_ITS": Y,
        "CONFIG_ARM_ARCH_TIMER": Y,
        "CONFIG_ARM_PSCI_FW": Y,
        "CONFIG_PCI_HOST_GENERIC": Y,
        "CONFIG_VIRTIO_MMIO": Y,
        "CONFIG_SERIAL_AMBA_PL011": Y,
        "CONFIG_SERIAL_AMBA_PL011_CONSOLE": Y,
        "CONFIG_SERIAL_EARLYCON": Y,
        "CONFIG_RTC_DRV_PL031": Y,
        # UEFI and ACPI clouds; AWS Graviton's ttyS0 is an ACPI 16550 (PNP0501)
        "CONFIG_EFI": Y,
        "CONFIG_EFI_STUB": Y,
        "CONFIG_EFIVAR_FS": Y,
        "CONFIG_RTC_DRV_EFI": Y,
        "CONFIG_ACPI": Y,
        "CONFIG_ACPI_SPCR_TABLE": Y,
        "CONFIG_SERIAL_8250_PNP": Y,
        # Azure (Hyper-V on arm64)
        "CONFIG_HYPERV": M,
        "CONFIG_HYPERV_NET": M,
        "CONFIG_HYPERV_STORAGE": M,
        "CONFIG_HYPERV_UTILS": M,
        # KSPP on arm64 (IA32_EMULATION's counterpart off)
        "CONFIG_RANDOMIZE_BASE": Y,
        "CONFIG_ARM64_SW_TTBR0_PAN": Y,
        "CONFIG_UNMAP_KERNEL_AT_EL0": Y,
        "CONFIG_COMPAT": N,
    },
}


def platforms_selected(full: str) -> list[str]:
    """The SoC platforms (arm64's "Platform selection" menu) the resolved config turns on."""
    section = full.split("# Platform selection\n", 1)[1].split("# end of Platform selection", 1)[0]
    return sorted(name for name, value in kconfig.parse(section).items() if value != kconfig.NOT_SET)


@dataclass
class KernelProject:
    root: Path
    cache: Path

    @property
    def kernel(self) -> Path:
        return self.root / "pkgs" / "kernel"

    def kiln(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KILN_CACHE": str(self.cache), "PYTHONUNBUFFERED": "1"}
        return subprocess.run(
            [sys.executable, "-m", "kiln.cli", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            stdin=subprocess.DEVNULL,
        )


def kernel_tree(root: Path) -> Path:
    """root/pkgs with what the kernel package needs of the real tree; returns that pkgs dir."""
    pkgs = root / "pkgs"
    pkgs.mkdir(parents=True)
    for name in ("vars.yaml", "stage0.yaml"):
        shutil.copy(ROOT / "pkgs" / name, pkgs / name)
    for name in ("kernel", "toolchain-seed"):
        shutil.copytree(ROOT / "pkgs" / name, pkgs / name)
    return pkgs


@pytest.fixture(scope="module")
def kproject(seed_store: Path, tmp_path_factory: pytest.TempPathFactory) -> KernelProject:
    base = tmp_path_factory.mktemp("kernel")
    root = base / "project"
    kernel_tree(root)
    cache = base / "cache"
    seed_into(seed_store, cache, root / "pkgs")
    return KernelProject(root, cache)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_olddefconfig_keeps_the_shipped_config(kproject: KernelProject, arch: str) -> None:
    config = kproject.kernel / f"config-{arch}"
    before = config.read_text()
    full = kproject.root / f"full-{arch}.config"
    result = kproject.kiln("kernel", "olddefconfig", "--arch", arch, "--output", str(full))
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "unchanged:" in result.stdout, result.stdout
    assert config.read_text() == before
    assert "kconfig: warning" not in result.stderr, result.stderr  # nothing of the config was dropped
    options = kconfig.parse_file(full)
    wrong = [
        f"{name}={options.get(name, 'n')}"
        for name, allowed in (REQUIRED | REQUIRED_ARCH[arch]).items()
        if options.get(name, "n") not in allowed
    ]
    assert not wrong, f"resolved config-{arch} lacks: {wrong}"
    if arch == "arm64":  # VMs and clouds only: no SoC's clocks, pinctrl and drivers to build
        assert platforms_selected(full.read_text()) == []


SENTINEL = "@KERNEL_FRAGMENTS@"
OBJ = "/tmp/build/obj"
# What the one configure build runs kconfig.sh for, besides the fragments --set selects: no
# fragment, a fragment whose option Kconfig drops, a fragment that does not exist. The last two
# must fail; their stderr is kept.
SELECTIONS = {"plain": "", "gvt": "gvt", "nosuch": "nosuch"}


def configure_only_package(kproject: KernelProject) -> None:
    """pkgs/kernel-configure: the kernel package's rendered steps up to kconfig.sh, then the .configs.

    Made from `kiln dump kernel` (so it runs exactly what the kernel package runs), renamed, with
    the compile, install and test snippets dropped, and `{{ kernel_fragments }}` put back where the
    kernel package has it, so `--set kernel_fragments=...` reaches it the same way. The kernel
    source is unpacked once (about a minute) and configured four times: as --set selects, then
    for each of SELECTIONS into an object directory of its own.
    """
    dumped = kproject.kiln("dump", "kernel", "--json", "--set", f"kernel_fragments={SENTINEL}")
    assert dumped.returncode == 0, dumped.stderr
    spec = {key: value for key, value in json.loads(dumped.stdout)["kernel"].items() if value is not None}
    step = spec["steps"][0]
    configure = [s for s in step["build"] if "kconfig.sh" in s]
    assert len(configure) == 1 and SENTINEL in configure[0] and f" {OBJ} " in configure[0], step["build"]
    build = [configure[0]]
    finalize = [{"from": f"{OBJ}/.config", "to": "/boot/config"}]
    for name, selection in SELECTIONS.items():
        command = configure[0].replace(f" {OBJ} ", f" {OBJ}-{name} ").replace(SENTINEL, selection)
        if name == "plain":
            build.append(command)
            finalize.append({"from": f"{OBJ}-{name}/.config", "to": f"/boot/config-{name}"})
        else:  # must fail: its exit code and stderr are kept
            build.append(
                f"mkdir -p /tmp/build/fail; {{ {command.strip()}; }} 2> /tmp/build/fail/{name}.err "
                f"&& echo 0 > /tmp/build/fail/{name}.code || echo $? > /tmp/build/fail/{name}.code"
            )
    finalize.append({"from": "/tmp/build/fail", "to": "/fail"})
    spec["name"] = "kernel-configure"
    # without the kept object tree: finalize copies the .configs from the root, where a step
    # cache is not mounted
    caches = [path for path in step.get("cache", []) if path != OBJ]
    spec["steps"] = [{**step, "build": build, "install": [], "test": [], "cache": caches}]
    spec["finalize"] = finalize
    text = yaml.safe_dump(spec, sort_keys=False)
    assert "{{" not in text and "{%" not in text and "{#" not in text  # rendered: no template syntax left
    (kproject.root / "pkgs" / "kernel-configure").mkdir(exist_ok=True)
    (kproject.root / "pkgs" / "kernel-configure" / "pkg.yaml").write_text(
        text.replace(SENTINEL, "{{ kernel_fragments }}")
    )


@pytest.fixture(scope="module")
def configured(kproject: KernelProject) -> Path:
    """The configure build's output, built with --set kernel_fragments=wireguard,debug."""
    configure_only_package(kproject)
    # GVT-g needs the i915 driver, which config-amd64 does not have: Kconfig drops the option.
    gvt = kproject.kernel / "fragments" / "gvt.config"
    gvt.write_text("CONFIG_DRM_I915_GVT=y\n")
    out = kproject.root / "_out"
    try:
        result = kproject.kiln(
            "build", "kernel-configure", "--set", "kernel_fragments=wireguard,debug", "--out", str(out)
        )
    finally:
        gvt.unlink()
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return out / "kernel-configure"


def test_fragment_reaches_the_built_config(configured: Path) -> None:
    options = kconfig.parse_file(configured / "boot" / "config")
    assert options["CONFIG_WIREGUARD"] == "m"  # not in config-amd64: only the fragment asks for it
    assert options["CONFIG_MAGIC_SYSRQ"] == "y"  # config-amd64 turns it off; the debug fragment wins
    assert options.get("CONFIG_PANIC_ON_OOPS", "n") == "n"
    # and without fragments, the same package's configuration gives the main config alone
    options = kconfig.parse_file(configured / "boot" / "config-plain")
    assert "CONFIG_WIREGUARD" not in options or options["CONFIG_WIREGUARD"] == "n"
    assert options.get("CONFIG_MAGIC_SYSRQ", "n") == "n"


def test_a_dropped_fragment_option_fails_the_build(configured: Path) -> None:
    fail = configured / "fail"
    assert (fail / "gvt.code").read_text().strip() == "1", (fail / "gvt.err").read_text()
    assert "CONFIG_DRM_I915_GVT asked for =y, the final .config has is not set" in (fail / "gvt.err").read_text()
    assert (fail / "nosuch.code").read_text().strip() == "2"
    missing = (fail / "nosuch.err").read_text()
    assert "no fragment 'nosuch'" in missing and "available: " in missing
