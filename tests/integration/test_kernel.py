"""Kernel config work for real, without building the kernel (that takes 13+ minutes; CI does not).

In a project holding the real pkgs/kernel (and toolchain-seed, stage0.yaml, vars.yaml):

- `kiln kernel olddefconfig` runs in the kernel's build container and leaves the shipped
  config-amd64 and config-arm64 unchanged: they are fixed points of olddefconfig + savedefconfig,
  and the config Kconfig resolves from config-amd64 has every option Kiln requires;
- a fragment selected with `--set kernel_fragments=...` reaches the `.config` of a package build
  that runs the kernel package's own steps up to configuration (unpack, kconfig.sh) and stops;
- a fragment whose option Kconfig drops fails that build, naming the option.

Each case unpacks the kernel source (about 140 MB of xz) once: about a minute each on 2 cores.
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

from kiln.kernel import config as kconfig
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


def configure_only_package(kproject: KernelProject) -> None:
    """pkgs/kernel-configure: the kernel package's rendered steps up to kconfig.sh, then the .config.

    Made from `kiln dump kernel` (so it runs exactly what the kernel package runs), renamed, with
    the compile, install and test snippets dropped, and `{{ kernel_fragments }}` put back where the
    kernel package has it, so `--set kernel_fragments=...` reaches it the same way.
    """
    dumped = kproject.kiln("dump", "kernel", "--json", "--set", f"kernel_fragments={SENTINEL}")
    assert dumped.returncode == 0, dumped.stderr
    spec = {key: value for key, value in json.loads(dumped.stdout)["kernel"].items() if value is not None}
    step = spec["steps"][0]
    configure = [s for s in step["build"] if "kconfig.sh" in s]
    assert len(configure) == 1 and SENTINEL in configure[0], step["build"]
    spec["name"] = "kernel-configure"
    spec["steps"] = [{**step, "build": configure, "install": [], "test": []}]
    spec["finalize"] = [{"from": "/tmp/build/obj/.config", "to": "/boot/config"}]
    text = yaml.safe_dump(spec, sort_keys=False)
    assert "{{" not in text and "{%" not in text and "{#" not in text  # rendered: no template syntax left
    (kproject.root / "pkgs" / "kernel-configure").mkdir(exist_ok=True)
    (kproject.root / "pkgs" / "kernel-configure" / "pkg.yaml").write_text(
        text.replace(SENTINEL, "{{ kernel_fragments }}")
    )


def test_fragment_reaches_the_built_config(kproject: KernelProject) -> None:
    configure_only_package(kproject)
    out = kproject.root / "_out"
    result = kproject.kiln("build", "kernel-configure", "--set", "kernel_fragments=wireguard,debug", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    options = kconfig.parse_file(out / "kernel-configure" / "boot" / "config")
    assert options["CONFIG_WIREGUARD"] == "m"  # not in config-amd64: only the fragment asks for it
    assert options["CONFIG_MAGIC_SYSRQ"] == "y"  # config-amd64 turns it off; the debug fragment wins
    assert options.get("CONFIG_PANIC_ON_OOPS", "n") == "n"
    # and without fragments, the same package gives the main config alone
    plain = kproject.kiln("build", "kernel-configure", "--out", str(out))
    assert plain.returncode == 0, plain.stderr[-4000:]
    options = kconfig.parse_file(out / "kernel-configure" / "boot" / "config")
    assert "CONFIG_WIREGUARD" not in options or options["CONFIG_WIREGUARD"] == "n"
    assert options.get("CONFIG_MAGIC_SYSRQ", "n") == "n"


def test_a_dropped_fragment_option_fails_the_build(kproject: KernelProject) -> None:
    configure_only_package(kproject)
    # GVT-g needs the i915 driver, which config-amd64 does not have: Kconfig drops the option.
    (kproject.kernel / "fragments" / "gvt.config").write_text("CONFIG_DRM_I915_GVT=y\n")
    try:
        result = kproject.kiln("build", "kernel-configure", "--set", "kernel_fragments=gvt")
        assert result.returncode == 1, result.stdout + result.stderr[-4000:]
        assert "CONFIG_DRM_I915_GVT asked for =y, the final .config has is not set" in result.stderr
        missing = kproject.kiln("build", "kernel-configure", "--set", "kernel_fragments=nosuch")
        assert missing.returncode == 1
        assert "no fragment 'nosuch'" in missing.stderr and "available: " in missing.stderr
    finally:
        (kproject.kernel / "fragments" / "gvt.config").unlink()
