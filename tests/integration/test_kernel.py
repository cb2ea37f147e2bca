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


@pytest.fixture(scope="module")
def kproject(seed_store: Path, tmp_path_factory: pytest.TempPathFactory) -> KernelProject:
    base = tmp_path_factory.mktemp("kernel")
    root = base / "project"
    (root / "pkgs").mkdir(parents=True)
    for name in ("vars.yaml", "stage0.yaml"):
        shutil.copy(ROOT / "pkgs" / name, root / "pkgs" / name)
    for name in ("kernel", "toolchain-seed"):
        shutil.copytree(ROOT / "pkgs" / name, root / "pkgs" / name)
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
        for name, allowed in REQUIRED.items()
        if options.get(name, "n") not in allowed
    ]
    assert not wrong, f"resolved config-{arch} lacks: {wrong}"


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
