"""The shipped kernel configs support what Kiln promises; the config helpers work.

pkgs/kernel/config-<arch> is in `make savedefconfig` form: an option at its Kconfig default is
left out. So an option Kiln needs is either set in the file, or its default (or a `select` from
an option the file sets) turns it on; IMPLIED records each such case with the Kconfig fact
(Linux 6.1) and the options it relies on, which must themselves be on. The integration test
(tests/integration/test_kernel.py) checks the same list against the config Kconfig resolves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.core.errors import InputError
from kiln.kconfig import config as kconfig
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

AMD64 = Platform.parse("linux/amd64")

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "pkgs" / "kernel"

Y = ("y",)
YM = ("y", "m")
M = ("m",)

# What the kernel must support. Boot-path pieces are built in: the initramfs has no
# modules, so its /init can only use what the kernel has (squashfs, loop, overlayfs, consoles).
REQUIRED: dict[str, tuple[str, ...]] = {
    # virtio
    "CONFIG_VIRTIO_PCI": Y,
    "CONFIG_VIRTIO_BLK": YM,
    "CONFIG_VIRTIO_NET": Y,  # built in: kernel IP autoconfiguration needs its NIC before init
    "CONFIG_SCSI_VIRTIO": YM,
    "CONFIG_VIRTIO_CONSOLE": Y,
    "CONFIG_HW_RANDOM_VIRTIO": YM,
    # storage
    "CONFIG_BLK_DEV_NVME": YM,
    "CONFIG_SATA_AHCI": YM,
    "CONFIG_USB_STORAGE": YM,
    # NICs, as modules
    "CONFIG_E1000": M,
    "CONFIG_E1000E": M,
    "CONFIG_IGB": M,
    "CONFIG_IXGBE": M,
    "CONFIG_VMXNET3": M,
    "CONFIG_ENA_ETHERNET": M,
    "CONFIG_GVE": M,
    # EFI
    "CONFIG_EFI": Y,
    "CONFIG_EFI_STUB": Y,
    "CONFIG_FB_EFI": Y,
    # consoles: ttyS0, hvc0
    "CONFIG_SERIAL_8250": Y,
    "CONFIG_SERIAL_8250_CONSOLE": Y,
    "CONFIG_HVC_DRIVER": Y,
    # filesystems
    "CONFIG_SQUASHFS": Y,
    "CONFIG_SQUASHFS_ZSTD": Y,
    "CONFIG_SQUASHFS_XZ": Y,
    "CONFIG_OVERLAY_FS": Y,
    "CONFIG_BLK_DEV_LOOP": Y,
    "CONFIG_EXT4_FS": YM,
    "CONFIG_XFS_FS": YM,
    "CONFIG_VFAT_FS": YM,
    "CONFIG_ISO9660_FS": YM,
    # cgroup v2, namespaces, seccomp
    "CONFIG_CGROUPS": Y,
    "CONFIG_MEMCG": Y,
    "CONFIG_CGROUP_PIDS": Y,
    "CONFIG_CGROUP_BPF": Y,
    "CONFIG_CPUSETS": Y,
    "CONFIG_NAMESPACES": Y,
    "CONFIG_UTS_NS": Y,
    "CONFIG_IPC_NS": Y,
    "CONFIG_USER_NS": Y,
    "CONFIG_PID_NS": Y,
    "CONFIG_NET_NS": Y,
    "CONFIG_SECCOMP": Y,
    "CONFIG_SECCOMP_FILTER": Y,
    # netfilter for containers
    "CONFIG_NETFILTER": Y,
    "CONFIG_NF_CONNTRACK": YM,
    "CONFIG_NF_NAT": YM,
    "CONFIG_NF_TABLES": YM,
    "CONFIG_NFT_NAT": YM,
    "CONFIG_NFT_MASQ": YM,
    "CONFIG_IP_NF_IPTABLES": YM,
    "CONFIG_IP_NF_NAT": YM,
    "CONFIG_NETFILTER_XT_MATCH_ADDRTYPE": YM,
    "CONFIG_NETFILTER_XT_TARGET_MASQUERADE": YM,
    "CONFIG_BRIDGE": YM,
    "CONFIG_BRIDGE_NETFILTER": YM,
    "CONFIG_VETH": YM,
    # kernel IP autoconfiguration, zstd initramfs
    "CONFIG_IP_PNP": Y,
    "CONFIG_IP_PNP_DHCP": Y,
    "CONFIG_BLK_DEV_INITRD": Y,
    "CONFIG_RD_ZSTD": Y,
}

# option -> (the Kconfig fact that turns it on, options that fact needs on)
Implied = dict[str, tuple[str, tuple[str, ...]]]
IMPLIED_COMMON: Implied = {
    "CONFIG_HVC_DRIVER": ("selected by VIRTIO_CONSOLE", ("CONFIG_VIRTIO_CONSOLE",)),
    "CONFIG_UTS_NS": ("default y, depends on NAMESPACES", ("CONFIG_NAMESPACES",)),
    "CONFIG_PID_NS": ("default y, depends on NAMESPACES", ("CONFIG_NAMESPACES",)),
    "CONFIG_IPC_NS": ("default y, depends on NAMESPACES && SYSVIPC", ("CONFIG_NAMESPACES", "CONFIG_SYSVIPC")),
    "CONFIG_NET_NS": ("default y, depends on NAMESPACES && NET", ("CONFIG_NAMESPACES", "CONFIG_NET")),
    "CONFIG_SECCOMP": ("def_bool y on arches with HAVE_ARCH_SECCOMP (x86, arm64)", ()),
    "CONFIG_SECCOMP_FILTER": ("def_bool y with SECCOMP && NET", ("CONFIG_SECCOMP", "CONFIG_NET")),
    "CONFIG_NF_NAT": ("selected by NFT_NAT and IP_NF_NAT", ("CONFIG_IP_NF_NAT",)),
    "CONFIG_NETFILTER_XT_TARGET_MASQUERADE": (
        "selected by IP_NF_TARGET_MASQUERADE",
        ("CONFIG_IP_NF_TARGET_MASQUERADE",),
    ),
    "CONFIG_RD_ZSTD": ("default y, depends on BLK_DEV_INITRD", ("CONFIG_BLK_DEV_INITRD",)),
}
IMPLIED: dict[str, Implied] = {
    "amd64": IMPLIED_COMMON,
    "arm64": {
        **IMPLIED_COMMON,
        "CONFIG_EFI": ("default y on arm64", ()),
        "CONFIG_EFI_STUB": ("selected by EFI on arm64", ("CONFIG_EFI",)),
        "CONFIG_EXT4_FS": ("selected by EXT3_FS", ("CONFIG_EXT3_FS",)),
        "CONFIG_CGROUPS": ("selected by SCHED_AUTOGROUP", ("CONFIG_SCHED_AUTOGROUP",)),
    },
}


def effective(options: dict[str, str], name: str, implied: Implied, seen: frozenset[str] = frozenset()) -> str:
    """The option's value as the savedefconfig file implies it ('n' when nothing turns it on)."""
    if name in options:
        return options[name]
    if name in implied and name not in seen:
        _, needs = implied[name]
        if all(effective(options, need, implied, seen | {name}) in YM for need in needs):
            return "y"
    return kconfig.NOT_SET


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_config_has_every_required_option(arch: str) -> None:
    options = kconfig.parse_file(KERNEL / f"config-{arch}")
    wrong = []
    for name, allowed in REQUIRED.items():
        value = effective(options, name, IMPLIED[arch])
        if value not in allowed:
            wrong.append(f"{name}={value} (want {'/'.join(allowed)})")
    assert not wrong, f"config-{arch}: " + ", ".join(wrong)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_implied_options_are_really_left_to_kconfig(arch: str) -> None:
    """An IMPLIED entry for an option the file sets is stale: the file is the truth then."""
    options = kconfig.parse_file(KERNEL / f"config-{arch}")
    stale = [name for name in IMPLIED[arch] if name in options and name in REQUIRED]
    assert not stale, f"config-{arch} sets {stale} itself: drop them from IMPLIED"


def test_hardening_amd64() -> None:
    """A sample of the KSPP options applied (docs/custom-kernel.md lists them and the ones left off)."""
    options = kconfig.parse_file(KERNEL / "config-amd64")
    for name in (
        "CONFIG_INIT_ON_ALLOC_DEFAULT_ON",
        "CONFIG_INIT_ON_FREE_DEFAULT_ON",
        "CONFIG_SLAB_FREELIST_HARDENED",
        "CONFIG_HARDENED_USERCOPY",
        "CONFIG_FORTIFY_SOURCE",
        "CONFIG_SECURITY_YAMA",
        "CONFIG_SECURITY_LANDLOCK",
        "CONFIG_BUG_ON_DATA_CORRUPTION",
        "CONFIG_X86_KERNEL_IBT",
        "CONFIG_ZERO_CALL_USED_REGS",
        "CONFIG_UBSAN_TRAP",
        "CONFIG_DEBUG_WX",
    ):
        assert options.get(name) == "y", name
    # off: "is not set", or left out where the default is off (x86_64_defconfig had them on)
    for name in (
        "CONFIG_DEVMEM",
        "CONFIG_KEXEC",
        "CONFIG_HIBERNATION",
        "CONFIG_IA32_EMULATION",
        "CONFIG_MODIFY_LDT_SYSCALL",
        "CONFIG_X86_VSYSCALL_EMULATION",
        "CONFIG_PROC_KCORE",
        "CONFIG_MAGIC_SYSRQ",
        "CONFIG_BINFMT_MISC",
    ):
        assert options.get(name, kconfig.NOT_SET) == kconfig.NOT_SET, name
    # left off on purpose (reproducible builds, out-of-tree modules): see docs/custom-kernel.md
    assert options.get("CONFIG_MODULE_SIG", kconfig.NOT_SET) == kconfig.NOT_SET


def test_configs_keep_their_header() -> None:
    for arch in ("amd64", "arm64"):
        text = (KERNEL / f"config-{arch}").read_text()
        assert kconfig.header(text).startswith(f"# Kiln kernel config for {arch}")
        assert "docs/custom-kernel.md" in kconfig.header(text)


def test_fragments_are_config_lines_only() -> None:
    fragments = sorted((KERNEL / "fragments").glob("*.config"))
    assert fragments, "ship at least one example fragment"
    for fragment in fragments:
        kconfig.fragment_names(fragment.stem)  # a valid name
        for line in fragment.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                assert kconfig.parse(line), f"{fragment.name}: not a config line: {line!r}"
        assert kconfig.parse_file(fragment), f"{fragment.name} sets nothing"


def test_parse_and_dropped() -> None:
    text = '# comment\nCONFIG_A=y\nCONFIG_B=m\n# CONFIG_C is not set\nCONFIG_S="x y"\nCONFIG_N=32\n'
    options = kconfig.parse(text)
    assert options == {"CONFIG_A": "y", "CONFIG_B": "m", "CONFIG_C": "n", "CONFIG_S": '"x y"', "CONFIG_N": "32"}
    wanted = kconfig.merge([options, {"CONFIG_B": "y", "CONFIG_D": "y"}])
    final = {"CONFIG_A": "y", "CONFIG_B": "m", "CONFIG_S": '"x y"', "CONFIG_N": "32"}
    got = [str(d) for d in kconfig.dropped(wanted, final)]
    assert got == [
        "CONFIG_B: asked for =y, final .config has =m",
        "CONFIG_D: asked for =y, final .config has is not set",
    ]


def test_header_stops_at_the_first_option() -> None:
    text = "# title\n# more\n\n# CONFIG_X is not set\nCONFIG_Y=y\n# later comment\n"
    assert kconfig.header(text) == "# title\n# more\n\n"
    assert kconfig.header("CONFIG_Y=y\n") == ""


def test_fragment_names() -> None:
    assert kconfig.fragment_names("") == []
    assert kconfig.fragment_names(" debug, wireguard ,,") == ["debug", "wireguard"]
    with pytest.raises(InputError):
        kconfig.fragment_names("../etc/passwd")
    with pytest.raises(InputError):
        kconfig.fragment_names("a b")


def test_kernel_package_renders_fragments_and_arch() -> None:
    tree = load_tree(ROOT / "pkgs", Platform.parse("linux/amd64"), {"kernel_fragments": "debug,wireguard"})
    kernel = tree.packages["kernel"]
    build = "\n".join(kernel.steps[0].build)
    assert "kconfig.sh" in build and '"debug,wireguard"' in build
    assert any(s.path == "pkgs/kernel/config-amd64" for s in kernel.steps[0].sources)
    arm = load_tree(ROOT / "pkgs", Platform.parse("linux/arm64")).packages["kernel"]
    assert any(s.path == "pkgs/kernel/config-arm64" for s in arm.steps[0].sources)
    assert "arch/arm64/boot/Image" in "\n".join(arm.steps[0].install)
    remote = [s for s in kernel.steps[0].sources if not s.is_local]
    assert len(remote) == 1 and remote[0].debian == f"linux={tree.variables['kernel_debian_version']}"


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_kernel_compiler_follows_the_toolchain_variable(platform: str) -> None:
    """A release (full toolchain) kernel is built by Kiln's gcc; the seed's by the build root's gcc.

    On an amd64 build machine an arm64 seed kernel uses the build root's cross gcc (Debian's).
    """
    full = load_tree(ROOT / "pkgs", Platform.parse(platform), {"toolchain": "toolchain"}, build=AMD64)
    seed = load_tree(ROOT / "pkgs", Platform.parse(platform), {"toolchain": "toolchain-seed"}, build=AMD64)
    triple = full.variables["target"]
    assert triple.endswith("-kiln-linux-musl")
    for name in ("kernel", "kernel-build"):
        assert ("CROSS_COMPILE", f"{triple}-") in full.packages[name].steps[0].env, name
        seed_env = dict(seed.packages[name].steps[0].env)
        if platform == "linux/amd64":
            assert "CROSS_COMPILE" not in seed_env, name
        else:
            assert seed_env["CROSS_COMPILE"] == "aarch64-linux-gnu-", name
