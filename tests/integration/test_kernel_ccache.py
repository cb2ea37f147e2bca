"""The kernel's kept object tree and compiler cache, for real: a one-option change compiles little,
and no cache can change what `--check` accepts.

`kernel-small` is the kernel package's own rendered steps (`kiln dump kernel`: unpack, patches,
ccache, incremental.sh, kconfig.sh, make, install) with a small config instead of config-amd64, so
it builds in a few minutes, and without the shipped kernel's test step (which checks for the NIC
modules a small config does not have). In a store of its own (stage0 and toolchain-seed linked in
from the default store when the e2e tier built them there):

1. the small config is built: both caches start empty, (nearly) every compile misses;
2. the same config plus a fragment that turns one driver on is built with the caches warm: kbuild
   compiles fewer than a tenth of what (1) compiled (ccache's counts of all compiles, hits or not,
   from the build log);
3. `kiln build --check` rebuilds (2) with empty caches in a fresh root: the same bytes;
4. garbage is written over a tenth of the kept objects and of ccache's stored results, and (2) is
   built again (`--no-cache`: the same key, the step caches kept). The kept objects are newer than
   their sources, so kbuild links the garbage: that build fails, and the store keeps (2), or it
   gives other bytes, and `--check` (a third cold build) must refuse them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kiln.build.cache_keys import compute_keys, stage0_key
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from tests.integration.conftest import Project, seed_into
from tests.integration.test_kernel import kernel_tree

pytestmark = pytest.mark.integration

SENTINEL = "@KERNEL_FRAGMENTS@"
# A small x86_64 kernel that still has modules (so `make modules`, modules_install and depmod run):
# the savedefconfig of `make allnoconfig` with 64BIT, MODULES, DUMMY_IRQ=m, PRINTK, TTY, the 8250
# serial console and ELF binaries forced on (KCONFIG_ALLCONFIG), about 440 options built in.
SMALL_CONFIG = """\
# CONFIG_LOCALVERSION_AUTO is not set
# CONFIG_CROSS_MEMORY_ATTACH is not set
# CONFIG_PREEMPT_DYNAMIC is not set
# CONFIG_UTS_NS is not set
# CONFIG_TIME_NS is not set
# CONFIG_PID_NS is not set
# CONFIG_X86_EXTENDED_PLATFORM is not set
# CONFIG_SCHED_OMIT_FRAME_POINTER is not set
# CONFIG_X86_MCE is not set
# CONFIG_PERF_EVENTS_AMD_UNCORE is not set
# CONFIG_X86_IOPL_IOPERM is not set
# CONFIG_MICROCODE is not set
# CONFIG_X86_5LEVEL is not set
# CONFIG_MTRR_SANITIZER is not set
# CONFIG_X86_INTEL_MEMORY_PROTECTION_KEYS is not set
# CONFIG_RELOCATABLE is not set
# CONFIG_CPU_MITIGATIONS is not set
# CONFIG_SUSPEND is not set
# CONFIG_ACPI is not set
# CONFIG_VIRTUALIZATION is not set
# CONFIG_SECCOMP is not set
# CONFIG_STACKPROTECTOR is not set
# CONFIG_VMAP_STACK is not set
CONFIG_MODULES=y
# CONFIG_BLOCK_LEGACY_AUTOLOAD is not set
# CONFIG_MQ_IOSCHED_DEADLINE is not set
# CONFIG_MQ_IOSCHED_KYBER is not set
# CONFIG_CORE_DUMP_DEFAULT_ELF_HEADERS is not set
# CONFIG_BINFMT_SCRIPT is not set
# CONFIG_SWAP is not set
# CONFIG_SLAB_MERGE_DEFAULT is not set
# CONFIG_COMPAT_BRK is not set
# CONFIG_SPARSEMEM_VMEMMAP is not set
# CONFIG_COMPACTION is not set
# CONFIG_STANDALONE is not set
# CONFIG_PREVENT_FIRMWARE_BUILD is not set
# CONFIG_DMIID is not set
# CONFIG_BLK_DEV is not set
CONFIG_DUMMY_IRQ=m
# CONFIG_INPUT_KEYBOARD is not set
# CONFIG_INPUT_MOUSE is not set
# CONFIG_SERIO is not set
# CONFIG_LEGACY_PTYS is not set
# CONFIG_LDISC_AUTOLOAD is not set
CONFIG_SERIAL_8250=y
# CONFIG_SERIAL_8250_DEPRECATED_OPTIONS is not set
CONFIG_SERIAL_8250_CONSOLE=y
# CONFIG_HW_RANDOM is not set
# CONFIG_DEVMEM is not set
# CONFIG_RANDOM_TRUST_CPU is not set
# CONFIG_RANDOM_TRUST_BOOTLOADER is not set
# CONFIG_HWMON is not set
# CONFIG_HID is not set
# CONFIG_USB_SUPPORT is not set
# CONFIG_VIRTIO_MENU is not set
# CONFIG_VHOST_MENU is not set
# CONFIG_SURFACE_PLATFORMS is not set
# CONFIG_X86_PLATFORM_DEVICES is not set
# CONFIG_IOMMU_SUPPORT is not set
# CONFIG_DNOTIFY is not set
# CONFIG_INOTIFY_USER is not set
# CONFIG_MISC_FILESYSTEMS is not set
# CONFIG_SYMBOLIC_ERRNAME is not set
# CONFIG_SECTION_MISMATCH_WARN_ONLY is not set
# CONFIG_X86_VERBOSE_BOOTUP is not set
# CONFIG_RUNTIME_TESTING_MENU is not set
"""
# one driver that no header reads (an option a header reads, RTC_CLASS say, recompiles every file including it)
FRAGMENT = "CONFIG_ENCLOSURE_SERVICES=y\n"


def default_store() -> Path:
    return Path(os.environ.get("KILN_CACHE", Path.home() / ".cache/kiln"))


def link_entry(source: Path, cache: Path, key: str) -> bool:
    """Hard-link a stored entry of another store into `cache`'s; False if that store lacks it."""
    entry = source / "store" / key
    if not entry.is_dir() or (cache / "store" / key).exists():
        return entry.is_dir()
    (cache / "store").mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(entry), str(cache / "store" / key)], check=True)
    return True


def small_kernel_package(project: Project) -> None:
    """pkgs/kernel-small: the kernel package's rendered spec with the small config and no test step."""
    dumped = project.kiln("dump", "kernel", "--json", "--set", f"kernel_fragments={SENTINEL}", check=True)
    spec = {key: value for key, value in json.loads(dumped.out)["kernel"].items() if value is not None}
    step = spec["steps"][0]
    for source in step["sources"]:
        if source.get("path") == "pkgs/kernel/config-amd64":
            source["path"] = "pkgs/kernel-small/config"
        elif source.get("path") == "pkgs/kernel/fragments":
            source["path"] = "pkgs/kernel-small/fragments"
    spec |= {"name": "kernel-small", "description": "a small kernel config, for the ccache test"}
    spec.pop("cpe", None)
    spec["steps"] = [{**step, "test": []}]
    directory = project.pkgs / "kernel-small"
    (directory / "fragments").mkdir(parents=True)
    (directory / "config").write_text(SMALL_CONFIG)
    (directory / "fragments" / "one.config").write_text(FRAGMENT)
    text = yaml.safe_dump(spec, sort_keys=False)
    assert "kernel-small/config" in text and "ccache" in text and SENTINEL in text
    (directory / "pkg.yaml").write_text(text.replace(SENTINEL, "{{ kernel_fragments }}"))


@pytest.fixture(scope="module")
def kproject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Project:
    base = tmp_path_factory.mktemp("kernel-ccache")
    root = base / "project"
    kernel_tree(root)
    cache = base / "cache"
    tree = load_tree(root / "pkgs", Platform.parse("linux/amd64"))
    # What the e2e tier built already is not built again: stage0 and toolchain-seed, same keys.
    if not link_entry(default_store(), cache, stage0_key(tree)):
        seed_into(request.getfixturevalue("seed_store"), cache, root / "pkgs")
    link_entry(default_store(), cache, compute_keys(Graph(tree))["toolchain-seed"])
    tarball = yaml.safe_load((root / "pkgs/vars.yaml").read_text())["kernel_sha256"]
    if (default_store() / "sources" / tarball).is_file():  # the kernel's 138 MB, not downloaded again
        (cache / "sources").mkdir(parents=True, exist_ok=True)
        os.link(default_store() / "sources" / tarball, cache / "sources" / tarball)
    project = Project(root, cache)
    small_kernel_package(project)
    return project


def compiles(log: str) -> tuple[int, int]:
    """(misses, all) of the compiler's runs through ccache, from the lines the kernel's build step logs
    (objects, and Kconfig's probes of what the compiler supports)."""
    counts = {name: int(value) for name, value in re.findall(r"^ccache: (\w+) (\d+)$", log, re.M)}
    assert set(counts) == {"cache_miss", "direct_cache_hit", "preprocessed_cache_hit"}, log[-3000:]
    return counts["cache_miss"], sum(counts.values())


def objects_compiled(log: str) -> int:
    """The objects kbuild compiled or assembled: its `  CC  path.o` and `  AS  path.o` lines."""
    return len(re.findall(r"^  (?:CC|AS)(?: \[M\])? +\S+\.o$", log, re.M))


def tree_digest(root: Path) -> dict[str, str]:
    """Every file's sha256 and every link's target below root, by relative path."""
    digest: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            digest[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            digest[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def poison(paths: list[Path], every: int = 10) -> int:
    """Overwrite every `every`-th file with garbage of the same size; how many."""
    for path in paths[::every]:
        path.write_bytes(b"\xde\xad" * (path.stat().st_size // 2 + 1))
    return len(paths[::every])


def stored(project: Project, tmp_path: Path, name: str) -> dict[str, str]:
    """The tree digest of what the store holds for kernel-small (exported with --out)."""
    out = tmp_path / name
    result = project.kiln("build", "kernel-small", "--set", "kernel_fragments=one", "--out", str(out), timeout=600)
    assert result.code == 0, result.out + result.err[-4000:]
    return tree_digest(out / "kernel-small")


def check(project: Project) -> bool:
    """Whether `kiln build --check` (empty caches, a fresh root) gives the stored bytes."""
    result = project.kiln("build", "kernel-small", "--set", "kernel_fragments=one", "--check", "--json", timeout=3000)
    assert result.code in (0, 1), result.out + result.err[-4000:]
    return bool(json.loads(result.out)["packages"]["kernel-small"]["reproducible"])


@pytest.mark.timeout(3600)
def test_a_one_option_change_compiles_little_and_no_cache_changes_what_check_accepts(
    kproject: Project, tmp_path: Path
) -> None:
    first = kproject.kiln("build", "kernel-small", "--json", timeout=3000)
    assert first.code == 0, first.out + first.err[-4000:]
    log = kproject.kiln("log", "kernel-small", check=True).out
    assert "incremental: object tree empty" in log
    cold_misses, cold_all = compiles(log)
    assert cold_all > 100 and cold_misses >= 0.95 * cold_all  # an empty ccache: (nearly) everything compiled
    cold_objects = objects_compiled(log)
    assert cold_objects > 300

    fragment = ("--set", "kernel_fragments=one")
    warm = kproject.kiln("build", "kernel-small", *fragment, "--out", str(tmp_path / "warm"), timeout=3000)
    assert warm.code == 0, warm.out + warm.err[-4000:]
    log = kproject.kiln("log", "kernel-small", check=True).out
    assert "incremental: object tree kept; 0 source files changed" in log
    objects, misses = objects_compiled(log), compiles(log)[0]
    print(f"one-option change: {objects} objects compiled of the cold build's {cold_objects} ({misses} ccache misses)")
    assert 0 < objects < cold_objects / 10  # the new driver and what the option reaches, nothing else
    assert "  CC      drivers/misc/enclosure.o" in log
    expected = tree_digest(tmp_path / "warm" / "kernel-small")
    assert "boot/vmlinuz" in expected

    assert check(kproject)  # a cold build of the changed config: the same bytes

    caches = kproject.cache / "build-caches/kernel-small/amd64"
    kept_objects = sorted(caches.rglob("*.o"))
    results = sorted(p for p in caches.rglob("*") if p.is_file() and p.name[-1:] in ("R", "M"))
    assert len(kept_objects) > 100 and results
    assert poison(kept_objects) > 10 and poison(results) > 0
    again = kproject.kiln(
        "build", "kernel-small", *fragment, "--no-cache", "--out", str(tmp_path / "poisoned"), timeout=3000
    )
    if again.code != 0:  # the garbage broke the build: the store keeps (2), which --check accepted
        assert stored(kproject, tmp_path, "after") == expected
    elif tree_digest(tmp_path / "poisoned" / "kernel-small") != expected:
        assert not check(kproject)  # garbage got into the output, and --check says so
