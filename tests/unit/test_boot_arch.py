"""`kiln boot` picks amd64 or arm64 from the artifact, and builds the matching QEMU command line.

Detection runs on small synthetic artifacts: kernel headers with the magic bytes at their offsets,
an ISO made by xorriso with an El Torito EFI image, a GPT raw disk (sfdisk) whose EFI system
partition is a FAT image made with mkfs.vfat and mtools. The QEMU argv is checked without QEMU:
`shutil.which` is faked, so these tests need neither emulator nor firmware installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.boot import command as boot_command
from kiln.boot import platforms, qemu
from kiln.boot.arch import Arch, choose_arch, detect, kernel_arch, pe_arch
from kiln.boot.qemu import BootResult, Machine, machine_for
from kiln.core.errors import BuildError, InputError
from kiln.core.project import Project
from kiln.core.verb import Context

MIB = 1024 * 1024
needs_iso_tools = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("xorriso", "mkfs.vfat", "mmd", "mcopy", "mdir")), reason="xorriso/mtools missing"
)
needs_disk_tools = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("sfdisk", "mkfs.vfat", "mmd", "mcopy", "mdir")), reason="sfdisk/mtools missing"
)


# --- synthetic artifacts ---------------------------------------------------------------------------------------


def pe_header(machine: int, size: int = 0x400, lfanew: int = 0x40) -> bytearray:
    """An MZ stub pointing at a PE signature and COFF header with `machine`."""
    head = bytearray(size)
    head[0:2] = b"MZ"
    head[0x3C:0x40] = lfanew.to_bytes(4, "little")
    head[lfanew : lfanew + 4] = b"PE\0\0"
    head[lfanew + 4 : lfanew + 6] = machine.to_bytes(2, "little")
    return head


def arm64_image() -> bytes:
    """An arm64 Linux `Image` with the EFI stub: PE header (arm64) and b"ARM\\x64" at 56."""
    head = pe_header(0xAA64, 0x1000)
    head[56:60] = b"ARM\x64"
    return bytes(head)


def x86_bzimage() -> bytes:
    """An x86 bzImage with the EFI stub: b"HdrS" at 0x202 and a PE header (x86-64) after it."""
    head = pe_header(0x8664, 0x1000, lfanew=0x240)
    head[0x202:0x206] = b"HdrS"
    return bytes(head)


def kernel_dir(path: Path, kernel: bytes) -> Path:
    path.mkdir()
    (path / "vmlinuz").write_bytes(kernel)
    (path / "initramfs.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    return path


def fat_image(path: Path, loader: str, size_mib: int = 2) -> Path:
    """A FAT image with EFI/BOOT/<loader> (a PE stub for the loader's arch)."""
    subprocess.run(["mkfs.vfat", "-C", str(path), str(size_mib * 1024)], check=True, capture_output=True)
    program = path.with_name(loader)
    program.write_bytes(bytes(pe_header(0xAA64 if "AA64" in loader else 0x8664)))
    subprocess.run(["mmd", "-i", str(path), "::/EFI", "::/EFI/BOOT"], check=True)
    subprocess.run(["mcopy", "-i", str(path), str(program), f"::/EFI/BOOT/{loader}"], check=True)
    return path


def gpt_disk(path: Path, parts: list[tuple[str, Path | None]], size_mib: int = 8) -> Path:
    """A GPT raw disk (sfdisk): partitions of `type` from 1 MiB on, each filled with its image, if any."""
    with path.open("wb") as out:
        out.truncate(size_mib * MIB)
    script = "label: gpt\n" + "".join(f"size=3MiB, type={kind}\n" for kind, _ in parts)
    subprocess.run(["sfdisk", "-q", str(path)], input=script, text=True, check=True, capture_output=True)
    table = json.loads(subprocess.run(["sfdisk", "--json", str(path)], capture_output=True, check=True).stdout)
    for part, (_, image) in zip(table["partitiontable"]["partitions"], parts, strict=True):
        if image is not None:
            with path.open("r+b") as out:
                out.seek(part["start"] * 512)
                out.write(image.read_bytes())
    return path


MKISOFS = ["xorriso", "-as", "mkisofs"]
ESP = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
BIOS_BOOT = "21686148-6449-6E6F-744E-656564454649"
LINUX = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"


# --- kernels and EFI programs ----------------------------------------------------------------------------------


def test_kernel_headers_name_their_arch(tmp_path: Path) -> None:
    cases = {
        "Image": (arm64_image(), "arm64"),
        "bzImage": (x86_bzimage(), "amd64"),
        # EFI zboot: a PE (MZ, "zimg") around a compressed Image: only the PE machine tells.
        "zboot-arm64": (bytes(pe_header(0xAA64)[:4] + b"zimg" + pe_header(0xAA64)[8:]), "arm64"),
        "zboot-x86": (bytes(pe_header(0x8664)), "amd64"),
        "Image.gz": (gzip.compress(arm64_image() + bytes(8192)), "arm64"),
        "riscv-pe": (bytes(pe_header(0x5064)), None),
        "garbage": (b"\x7fELF" + bytes(2000), None),
        "short": (b"MZ", None),
        "bad-gzip": (b"\x1f\x8b" + bytes(100), None),
    }
    for name, (data, arch) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert kernel_arch(tmp_path / name) == arch, name
    assert kernel_arch(tmp_path / "missing") is None


def test_a_pe_offset_past_the_header_is_no_answer() -> None:
    head = pe_header(0xAA64)
    head[0x3C:0x40] = (1 << 30).to_bytes(4, "little")
    assert pe_arch(bytes(head)) is None


def test_a_kernel_directory_boots_as_its_kernel_says(tmp_path: Path, fake_qemu: None) -> None:
    arm = kernel_dir(tmp_path / "arm", arm64_image())
    found = detect(arm)
    assert found is not None and found.name == "arm64" and "vmlinuz" in found.why
    machine = machine_for(arm)
    assert machine.arch == "arm64" and machine.kernel == arm / "vmlinuz" and machine.pxe is None
    x86 = kernel_dir(tmp_path / "x86", x86_bzimage())
    assert machine_for(x86).arch == "amd64"


# --- manifest.json ---------------------------------------------------------------------------------------------


def write_manifest(directory: Path, arch: str, names: list[str]) -> None:
    """The shape kiln.image.manifest.write_manifest gives it."""
    data = {
        "profile": {"name": "metal", "arch": arch, "platform": "metal", "version": "1", "kind": "image"},
        "artifacts": [{"path": n, "sha256": "0" * 64, "size": 1} for n in names],
        "inputs": {},
    }
    (directory / "manifest.json").write_text(json.dumps(data))


def test_the_manifest_beside_an_artifact_decides_for_formats_not_opened(tmp_path: Path) -> None:
    disk = tmp_path / "disk.qcow2"
    disk.write_bytes(b"QFI\xfb")
    write_manifest(tmp_path, "arm64", ["disk.qcow2", "sbom.spdx.json"])
    assert choose_arch(disk) == Arch("arm64", f"{tmp_path / 'manifest.json'} says arch arm64")


def test_a_manifest_that_does_not_list_the_artifact_or_is_not_kilns_is_ignored(tmp_path: Path) -> None:
    disk = tmp_path / "disk.vmdk"
    disk.write_bytes(b"KDMV")
    write_manifest(tmp_path, "arm64", ["other.qcow2"])
    assert detect(disk) is None
    (tmp_path / "manifest.json").write_text(json.dumps({"files": ["disk.vmdk"], "key": "x"}))  # a store entry's
    assert detect(disk) is None
    (tmp_path / "manifest.json").write_text("{not json")
    assert detect(disk) is None


def test_a_directory_manifest_needs_no_listing(tmp_path: Path) -> None:
    pxe = tmp_path / "pxe"
    pxe.mkdir()
    write_manifest(pxe, "arm64", [])
    found = detect(pxe)
    assert found is not None and found.name == "arm64"


def write_platforms_manifest(directory: Path, artifacts: dict[str, str | None]) -> None:
    """The shape of a profile built for several platforms: no profile.arch, an arch per artifact."""
    data = {
        "profile": {"name": "metal", "arches": ["amd64", "arm64"], "platform": "metal", "kind": "image"},
        "artifacts": [
            {"path": p, "sha256": "0" * 64, "size": 1, **({"arch": a} if a else {})} for p, a in artifacts.items()
        ],
        "inputs": {},
        "platforms": {"linux/amd64": {}, "linux/arm64": {}},
    }
    (directory / "manifest.json").write_text(json.dumps(data))


def test_a_multi_platform_manifest_gives_each_artifact_its_arch(tmp_path: Path) -> None:
    write_platforms_manifest(
        tmp_path,
        {
            "disk-amd64.qcow2": "amd64",
            "disk-arm64.qcow2": "arm64",
            "pxe-arm64/vmlinuz": "arm64",
            "pxe-arm64/grub.cfg": "arm64",
            "pxe-amd64/vmlinuz": "amd64",
            "installer-index.tar": None,
        },
    )
    manifest = tmp_path / "manifest.json"
    for name in ("disk-amd64.qcow2", "disk-arm64.qcow2", "installer-index.tar"):
        (tmp_path / name).write_bytes(b"QFI\xfb")
    assert choose_arch(tmp_path / "disk-arm64.qcow2") == Arch("arm64", f"{manifest} says arch arm64")
    assert choose_arch(tmp_path / "disk-amd64.qcow2") == Arch("amd64", f"{manifest} says arch amd64")
    assert detect(tmp_path / "installer-index.tar") is None  # serves every arch: the manifest does not decide
    for arch in ("amd64", "arm64"):
        (tmp_path / f"pxe-{arch}").mkdir()
        (tmp_path / f"pxe-{arch}/vmlinuz").write_bytes(b"not a kernel")
        assert detect(tmp_path / f"pxe-{arch}") == Arch(arch, f"{manifest} lists pxe-{arch}/ for arch {arch}")
        assert detect(tmp_path / f"pxe-{arch}/vmlinuz") == Arch(arch, f"{manifest} says arch {arch}")
    with pytest.raises(
        InputError, match=r"holds outputs for amd64 and arm64 .* boot one of them: .*/disk-amd64\.qcow2"
    ):
        choose_arch(tmp_path)


# --- ISOs and raw disks ----------------------------------------------------------------------------------------


@needs_iso_tools
def test_an_iso_with_an_el_torito_efi_image_is_read_through_it(tmp_path: Path) -> None:
    """Kiln's and grub-mkrescue's layout: the loader lives only inside efi.img, the El Torito EFI image."""
    for loader, arch in (("BOOTAA64.EFI", "arm64"), ("BOOTX64.EFI", "amd64")):
        tree = tmp_path / arch
        (tree / "boot").mkdir(parents=True)
        (tree / "boot" / "vmlinuz").write_bytes(b"k")
        fat_image(tree / "efi.img", loader)
        iso = tmp_path / f"{arch}.iso"
        subprocess.run(
            [*MKISOFS, "-o", str(iso), "--efi-boot", "efi.img", "-efi-boot-part", "--efi-boot-image", "-r", str(tree)],
            check=True,
            capture_output=True,
        )
        found = detect(iso)
        assert found is not None and found.name == arch and loader in found.why, found


@needs_iso_tools
def test_an_iso_with_the_loader_in_its_tree_is_read_from_the_tree(tmp_path: Path) -> None:
    """Debian-style ISOs carry EFI/boot/bootaa64.efi (lower case) as a plain file too."""
    (tmp_path / "tree/EFI/boot").mkdir(parents=True)
    (tmp_path / "tree/EFI/boot/bootaa64.efi").write_bytes(bytes(pe_header(0xAA64)))
    iso = tmp_path / "debian.iso"
    subprocess.run([*MKISOFS, "-o", str(iso), "-r", str(tmp_path / "tree")], check=True, capture_output=True)
    assert choose_arch(iso).name == "arm64"


@needs_disk_tools
def test_a_raw_disk_is_read_through_its_efi_system_partition(tmp_path: Path) -> None:
    arm = gpt_disk(tmp_path / "arm.raw", [(LINUX, None), (ESP, fat_image(tmp_path / "a.fat", "BOOTAA64.EFI"))])
    found = detect(arm)
    assert found is not None and found.name == "arm64" and "BOOTAA64.EFI" in found.why
    x86 = gpt_disk(tmp_path / "x86.img", [(BIOS_BOOT, None), (ESP, fat_image(tmp_path / "x.fat", "BOOTX64.EFI"))])
    assert choose_arch(x86).name == "amd64"
    bios_only = gpt_disk(tmp_path / "bios.raw", [(BIOS_BOOT, None), (LINUX, None)])
    found = detect(bios_only)
    assert found is not None and found.name == "amd64" and "BIOS boot" in found.why
    assert detect(gpt_disk(tmp_path / "blank.raw", [(LINUX, None)])) is None


def test_unreadable_artifacts_default_to_amd64_unless_named_arm64(tmp_path: Path) -> None:
    for name in ("empty.iso", "zeros.raw", "disk.qcow2"):
        (tmp_path / name).write_bytes(bytes(4096))
        chosen = choose_arch(tmp_path / name)
        assert chosen.name == "amd64" and "amd64 by default" in chosen.why
    armish = tmp_path / "metal-arm64"
    armish.mkdir()
    (armish / "disk.qcow2").write_bytes(bytes(4096))
    with pytest.raises(InputError, match="--arch"):
        choose_arch(armish / "disk.qcow2")
    assert choose_arch(armish / "disk.qcow2", "arm64") == Arch("arm64", "given by --arch")
    with pytest.raises(InputError, match="--arch riscv64"):
        choose_arch(armish / "disk.qcow2", "riscv64")


# --- QEMU command lines ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--accel auto remembers what it found in the cache: never the user's from a test."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def fake_qemu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every emulator `is installed` at /usr/bin/<name>: the argv is checked, QEMU never runs."""
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")


COMMON = ["-m", "1024", "-smp", "2", "-nographic", "-no-reboot", "-serial", "stdio", "-monitor", "none", "-nodefaults"]
NET = ["-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0", "-device", "virtio-rng-pci"]


def test_amd64_command_lines_are_unchanged(fake_qemu: None) -> None:
    """What every e2e test and the benchmarks boot with: byte for byte the argv from before arm64."""
    x86 = ["/usr/bin/qemu-system-x86_64", "-accel", "tcg", *COMMON]
    kernel = Machine(kernel=Path("k"), initrd=Path("i"))
    assert kernel.command() == [*x86, "-kernel", "k", "-initrd", "i", "-append", "console=ttyS0", *NET]
    uefi = Machine(cdrom=Path("a.iso"), disk=Path("d.qcow2"), disk_format="qcow2", firmware="uefi")
    assert uefi.command(Path("/t/VARS.fd")) == [
        *x86,
        "-machine",
        "q35",
        "-drive",
        "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
        "-drive",
        "if=pflash,format=raw,unit=1,file=/t/VARS.fd",
        "-drive",
        "file=a.iso,media=cdrom,readonly=on,if=ide,index=1",
        "-drive",
        "file=d.qcow2,format=qcow2,if=virtio,snapshot=on",
        *NET,
    ]
    pxe = Machine(pxe=Path("/srv/pxe"), blank_disk=Path("b.qcow2"), api_port=5555, extra=["-x"])
    assert pxe.command() == [
        *x86,
        "-drive",
        "file=b.qcow2,format=qcow2,if=virtio",
        "-netdev",
        "user,id=net0,hostfwd=tcp:127.0.0.1:5555-:50000,tftp=/srv/pxe,bootfile=boot.ipxe",
        "-device",
        "virtio-net-pci,netdev=net0,bootindex=0",
        "-device",
        "virtio-rng-pci",
        "-x",
    ]
    assert Machine().boot_firmware() == "bios"
    unplugged = Machine(kernel=Path("k"), initrd=Path("i"), network=False)
    assert unplugged.command()[-5:] == ["console=ttyS0", "-nic", "none", "-device", "virtio-rng-pci"]


def test_a_tpm_is_swtpms_control_socket_on_a_tis_device(fake_qemu: None) -> None:
    tpm = ["-chardev", "socket,id=chrtpm,path=/t/tpm.ctrl", "-tpmdev", "emulator,id=tpm0,chardev=chrtpm"]
    amd64 = Machine(kernel=Path("k"), tpm=True, tpm_socket=Path("/t/tpm.ctrl"), extra=["-x"]).command()
    assert amd64[-7:] == [*tpm, "-device", "tpm-tis,tpmdev=tpm0", "-x"]
    arm64 = Machine(kernel=Path("k"), arch="arm64", tpm=True, tpm_socket=Path("/t/tpm.ctrl"))
    assert arm64.command(Path("/t/VARS.fd"))[-6:] == [*tpm, "-device", "tpm-tis-device,tpmdev=tpm0"]
    with pytest.raises(BuildError, match="swtpm started first"):
        Machine(kernel=Path("k"), tpm=True).command()


def test_arm64_boots_the_virt_machine_with_aavmf(fake_qemu: None) -> None:
    machine = Machine(kernel=Path("k"), initrd=Path("i"), arch="arm64", api_port=5555, net_options="net=10.9.0.0/24")
    assert machine.boot_firmware() == "uefi"
    argv = machine.command(Path("/t/AAVMF_VARS.fd"))
    assert argv[:3] == ["/usr/bin/qemu-system-aarch64", "-accel", "tcg"]
    joined = " ".join(argv)
    assert "-machine virt -cpu cortex-a72" in joined
    assert "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd" in argv
    assert "if=pflash,format=raw,unit=1,file=/t/AAVMF_VARS.fd" in argv
    assert argv[argv.index("-append") + 1] == "console=ttyAMA0"
    assert "user,id=net0,hostfwd=tcp:127.0.0.1:5555-:50000,net=10.9.0.0/24" in argv
    assert "virtio-net-pci,netdev=net0,romfile=" in argv
    assert "q35" not in joined and "ide" not in joined
    with pytest.raises(BuildError, match="AAVMF_VARS"):
        machine.command()
    machine.cmdline = "console=ttyAMA0 quiet"
    assert "console=ttyAMA0 quiet" in machine.command(Path("v"))


def test_arm64_cd_and_disk_hang_off_virtio_not_ide(fake_qemu: None) -> None:
    argv = Machine(cdrom=Path("a.iso"), disk=Path("d.raw"), blank_disk=Path("b.qcow2"), arch="arm64").command(Path("v"))
    joined = " ".join(argv)
    assert "if=ide" not in joined and "-kernel" not in argv
    assert "file=a.iso,format=raw,media=cdrom,readonly=on,if=none,id=cd0" in argv
    assert "virtio-scsi-pci,id=scsi0" in argv and "scsi-cd,drive=cd0,bus=scsi0.0,bootindex=0" in argv
    assert (
        "file=d.raw,format=raw,if=none,id=disk0,snapshot=on" in argv
        and "virtio-blk-pci,drive=disk0,bootindex=1" in argv
    )
    assert "file=b.qcow2,format=qcow2,if=virtio" in argv


def test_arm64_pxe_serves_a_grub_efi_image(tmp_path: Path, fake_qemu: None) -> None:
    pxe = tmp_path / "pxe"
    pxe.mkdir()
    (pxe / "bootaa64.efi").write_bytes(bytes(pe_header(0xAA64)))
    (pxe / "grub.cfg").write_text("linux vmlinuz console=ttyAMA0\ninitrd initramfs.zst\nboot\n")
    machine = machine_for(pxe)
    assert machine.arch == "arm64" and machine.pxe == pxe.resolve() and machine.pxe_bootfile == "bootaa64.efi"
    argv = machine.command(Path("v"))
    assert f"user,id=net0,tftp={pxe.resolve()},bootfile=bootaa64.efi" in argv
    assert "virtio-net-pci,netdev=net0,romfile=,bootindex=0" in argv
    custom = Machine(pxe=pxe, arch="arm64", pxe_bootfile="grubnetaa64.efi").command(Path("v"))
    assert f"user,id=net0,tftp={pxe},bootfile=grubnetaa64.efi" in custom


def test_an_ipxe_directory_is_no_arm64_pxe_directory(tmp_path: Path) -> None:
    pxe = kernel_dir(tmp_path / "pxe", arm64_image())
    (pxe / "boot.ipxe").write_text("#!ipxe\n")
    with pytest.raises(InputError, match=r"bootaa64\.efi"):
        machine_for(pxe)
    assert machine_for(pxe, "amd64").pxe_bootfile == "boot.ipxe"


def test_arm64_boots_uefi_only(fake_qemu: None) -> None:
    with pytest.raises(InputError, match="arm64 boots with UEFI only"):
        Machine(kernel=Path("k"), arch="arm64", firmware="bios").command(Path("v"))
    with pytest.raises(InputError, match="arch sparc"):
        Machine(arch="sparc").command()


def test_missing_emulator_and_firmware_name_their_debian_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="apt install qemu-system-arm"):
        Machine(arch="arm64").command(Path("v"))
    arm = dataclasses.replace(platforms.PLATFORMS["arm64"], code=tmp_path / "none.fd")
    monkeypatch.setitem(platforms.PLATFORMS, "arm64", arm)
    with pytest.raises(BuildError, match="apt install qemu-efi-aarch64"):
        qemu._prepare(Machine(arch="arm64"), tmp_path)


def test_the_variables_copy_is_a_full_64_mib_flash_bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, variables = tmp_path / "CODE.fd", tmp_path / "VARS.fd"
    with code.open("wb") as out:
        out.truncate(64 * MIB)
    variables.write_bytes(b"vars" * 1024)
    monkeypatch.setitem(
        platforms.PLATFORMS, "arm64", dataclasses.replace(platforms.PLATFORMS["arm64"], code=code, vars=variables)
    )
    work = tmp_path / "work"
    work.mkdir()
    copy = qemu._prepare(Machine(arch="arm64"), work)
    assert copy is not None and copy.parent == work and copy.stat().st_size == 64 * MIB
    assert copy.read_bytes()[:8] == b"varsvars" and variables.stat().st_size == 4096
    with code.open("r+b") as out:
        out.truncate(2 * MIB)
    with pytest.raises(BuildError, match="64 MiB"):
        qemu._prepare(Machine(arch="arm64"), work)


# --- kiln boot -------------------------------------------------------------------------------------------------


def context(args: argparse.Namespace) -> Context[object]:
    """What kiln.cli hands the verb's run: these options, no project file, no package tree."""
    return Context(args, Project(Path.cwd()), lambda platform: None, argparse.ArgumentParser())


def run_kiln_boot(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> list[Machine]:
    parser = argparse.ArgumentParser()
    boot_command.add_arguments(parser)
    booted: list[Machine] = []

    def fake_boot(machine: Machine, expect: str, timeout: float, log: Path, echo: object, **_: object) -> BootResult:
        booted.append(machine)
        return BootResult(True, 1.0, expect, [], "found")

    monkeypatch.setattr(boot_command, "boot", fake_boot)
    assert boot_command.run(context(parser.parse_args(argv))) == 0
    return booted


def test_kiln_boot_says_which_arch_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fake_qemu: None
) -> None:
    arm = kernel_dir(tmp_path / "arm", arm64_image())
    log = str(tmp_path / "log")
    (machine,) = run_kiln_boot([str(arm), "--log", log, "--quiet", "--memory", "512"], monkeypatch)
    assert machine.arch == "arm64" and machine.boot_firmware() == "uefi" and machine.memory == "512"
    assert "console=ttyAMA0" in machine.command(Path("v"))
    assert "kiln boot: booting as arm64 (" in capsys.readouterr().err
    (forced,) = run_kiln_boot([str(arm), "--arch", "amd64", "--log", log, "--quiet", "--accel", "tcg"], monkeypatch)
    assert forced.arch == "amd64" and forced.boot_firmware() == "bios" and "console=ttyS0" in forced.command()
    assert "booting as amd64 (given by --arch)" in capsys.readouterr().err
    with pytest.raises(InputError, match="UEFI only"):
        run_kiln_boot([str(arm), "--firmware", "bios", "--log", log], monkeypatch)


def test_kiln_boot_keeps_the_machine_running_with_api_or_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_qemu: None
) -> None:
    """Stub: boot() is replaced, to see what kiln boot asks of it; tests/unit/test_console_watch.py
    runs the real wait with a stand-in guest."""
    parser = argparse.ArgumentParser()
    boot_command.add_arguments(parser)
    asked: list[dict[str, object]] = []

    def fake_boot(machine: Machine, expect: str, timeout: float, log: Path, echo: object, **kw: object) -> BootResult:
        asked.append(kw)
        return BootResult(True, 1.0, expect, [], "found")

    monkeypatch.setattr(boot_command, "boot", fake_boot)
    kernel = kernel_dir(tmp_path / "k", arm64_image())
    for extra in ([], ["--api", "50001"], ["--keep"], ["--keep-running"]):
        assert (
            boot_command.run(context(parser.parse_args([str(kernel), "--log", str(tmp_path / "l"), "--quiet", *extra])))
            == 0
        )
    assert [kw["until_exit"] for kw in asked] == [False, True, True, True]


def test_kiln_boot_json_prints_the_result_and_fails_with_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fake_qemu: None
) -> None:
    """Stub: boot() is replaced by canned results; the console judge itself is tested in test_console_watch."""
    parser = argparse.ArgumentParser()
    boot_command.add_arguments(parser)
    results = [
        BootResult(True, 4.321, "machined ready: v1", ["machined ready: v1"], "found"),
        BootResult(False, 9.0, "Kernel panic - x", ["a", "Kernel panic - x"], "kernel panic"),
    ]
    monkeypatch.setattr(boot_command, "boot", lambda *a, **kw: results.pop(0))
    kernel = kernel_dir(tmp_path / "k", arm64_image())
    argv = [str(kernel), "--log", str(tmp_path / "l"), "--json"]
    assert boot_command.run(context(parser.parse_args(argv))) == 0
    good = json.loads(capsys.readouterr().out)
    assert good == {
        "ok": True,
        "seconds": 4.32,
        "line": "machined ready: v1",
        "reason": "found",
        "exit_code": None,
        "log": str(tmp_path / "l"),
        "tail": [],
    }
    assert boot_command.run(context(parser.parse_args(argv))) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["ok"] is False and bad["reason"] == "kernel panic" and bad["tail"] == ["a", "Kernel panic - x"]
