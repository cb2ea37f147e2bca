"""Disk image formats made from the raw image: raw, qcow2, vhd (Azure), vmdk and ova.

Every conversion goes through `qemu-img convert`. qcow2 comes out reproducible as it is;
qemu-img stamps the VHD footer with the wall clock and a random UUID and gives a VMDK a
random content id (CID), so those fields are rewritten here from the assets' epoch and seed
(same length, in place; the VHD footer's checksum is recomputed). An OVA is a ustar archive
of an OVF 1.0 descriptor, a SHA256 manifest and the streamOptimized VMDK.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import struct
import tarfile
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from kiln.core import tools
from kiln.core.errors import BuildError, InputError
from kiln.core.hashing import file_sha256
from kiln.image.assets import BootAssets, derived_uuid

FORMATS = ("raw", "qcow2", "vhd", "vmdk", "ova")
MIB = 1 << 20
VHD_EPOCH = 946684800  # 2000-01-01T00:00:00Z, where VHD timestamps count from
VHD_FOOTER = 512
SECTOR = 512


def convert(raw: Path, fmt: str, out: Path, assets: BootAssets) -> Path:
    """Write `raw` as `fmt` to `out` and return it; the same raw image gives the same bytes."""
    if fmt not in FORMATS:
        raise InputError(f"unknown disk format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if not raw.is_file():
        raise BuildError(f"raw image {raw} does not exist")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written in a private directory under the final name (a VMDK names its own file inside),
    # then moved into place, so a failure leaves no half-written output.
    with tempfile.TemporaryDirectory(prefix=".kiln-format-", dir=out.parent) as tmp:
        work = Path(tmp)
        made = work / out.name
        if fmt == "raw":
            _qemu_img(["convert", "-f", "raw", "-O", "raw", str(raw), str(made)])
        elif fmt == "qcow2":
            _qemu_img(["convert", "-f", "raw", "-O", "qcow2", str(raw), str(made)])
        elif fmt == "vhd":
            _vhd(raw, made, assets, work)
        elif fmt == "vmdk":
            _vmdk(raw, made, assets)
        else:
            _ova(raw, made, assets, work)
        made.chmod(0o644)
        made.replace(out)
    return out


def _vhd(raw: Path, out: Path, assets: BootAssets, work: Path) -> None:
    """Fixed VHD whose size is a whole number of MiB (Azure refuses anything else)."""
    size = raw.stat().st_size
    if size % MIB:
        # Grow a copy to the next MiB and move the backup GPT to its new end.
        grown = work / "grown.raw"
        _qemu_img(["convert", "-f", "raw", "-O", "raw", str(raw), str(grown)])
        with grown.open("r+b") as stream:
            stream.truncate((size // MIB + 1) * MIB)
        tools.run(
            ["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "--relocate", "gpt-bak-std", str(grown)],
            what=f"sfdisk --relocate on {raw.name}",
        )
        raw = grown
    _qemu_img(["convert", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on", str(raw), str(out)])
    patch_vhd_footer(out, assets)
    _qemu_img(["info", "-f", "vpc", str(out)])  # qemu checks the footer's checksum on open


def patch_vhd_footer(vhd: Path, assets: BootAssets) -> None:
    """Set the footer's timestamp (from the epoch) and unique id (from the seed); fix its checksum."""
    with vhd.open("r+b") as stream:
        stream.seek(-VHD_FOOTER, 2)
        at = stream.tell()
        footer = bytearray(stream.read(VHD_FOOTER))
        if footer[:8] != b"conectix":
            raise BuildError(f"{vhd.name}: no VHD footer where qemu-img should have written it")
        footer[24:28] = max(assets.epoch - VHD_EPOCH, 0).to_bytes(4, "big")
        footer[68:84] = derived_uuid(assets.seed, "vhd").bytes
        footer[64:68] = vhd_checksum(footer).to_bytes(4, "big")
        stream.seek(at)
        stream.write(footer)


def vhd_checksum(footer: bytes | bytearray) -> int:
    """One's complement of the byte sum of the footer, its own checksum field counted as zero."""
    return ~(sum(footer) - sum(footer[64:68])) & 0xFFFFFFFF


def _vmdk(raw: Path, out: Path, assets: BootAssets) -> None:
    _qemu_img(["convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", str(raw), str(out)])
    patch_vmdk_cid(out, assets)
    _qemu_img(["check", "-f", "vmdk", str(out)])


def patch_vmdk_cid(vmdk: Path, assets: BootAssets) -> None:
    """Replace the descriptor's random CID with one derived from the seed.

    qemu-img prints the CID without leading zeros, so its length varies: the descriptor is
    rewritten whole inside its fixed, zero-padded area (offset and size from the header). It is
    read up to its NUL, as qemu reads it: when qemu-img rewrote it with a CID shorter than the one
    it was created with, the old descriptor's last byte is left after that NUL (now and then: seen
    once in CI, as an OVA whose VMDK differed from the same VMDK made alone), and it must not reach
    the image.
    """
    cid = derived_uuid(assets.seed, "vmdk-cid").hex[:8]
    if cid in ("ffffffff", "fffffffe"):  # values VMDK reserves (no parent, invalid)
        cid = "0" + cid[1:]
    with vmdk.open("r+b") as stream:
        header = stream.read(SECTOR)
        if header[:4] != b"KDMV":
            raise BuildError(f"{vmdk.name}: not a VMDK sparse extent")
        offset, size = struct.unpack_from("<QQ", header, 28)
        stream.seek(offset * SECTOR)
        area = stream.read(size * SECTOR)
        text = area.split(b"\0", 1)[0]
        patched, count = re.subn(rb"\nCID=[0-9a-fA-F]{1,8}\n", b"\nCID=" + cid.encode() + b"\n", text)
        if count != 1 or len(patched) > len(area):
            raise BuildError(f"{vmdk.name}: no VMDK descriptor with one CID where qemu-img should have written it")
        stream.seek(offset * SECTOR)
        stream.write(patched.ljust(len(area), b"\0"))


def _ova(raw: Path, out: Path, assets: BootAssets, work: Path) -> None:
    """ustar of <name>.ovf, <name>.mf, <name>.vmdk: the order OVF 1.x requires (descriptor, manifest, files)."""
    name = out.name.removesuffix(".ova")
    disk = work / "disk" / f"{name}.vmdk"
    disk.parent.mkdir()
    _vmdk(raw, disk, assets)
    ovf = ovf_descriptor(name, disk.name, disk.stat().st_size, raw.stat().st_size, assets).encode()
    manifest = (
        f"SHA256({name}.ovf)= {hashlib.sha256(ovf).hexdigest()}\nSHA256({disk.name})= {file_sha256(disk)}\n"
    ).encode()
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in ((f"{name}.ovf", ovf), (f"{name}.mf", manifest)):
            tar.addfile(_tar_info(member, len(data), assets.epoch), io.BytesIO(data))
        with disk.open("rb") as stream:
            tar.addfile(_tar_info(disk.name, disk.stat().st_size, assets.epoch), stream)


def _tar_info(name: str, size: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, epoch, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def ovf_descriptor(
    name: str, vmdk: str, vmdk_size: int, capacity: int, assets: BootAssets, cpus: int = 2, memory_mib: int = 2048
) -> str:
    """An OVF 1.0 envelope for one VM: BIOS firmware, an IDE disk (PIIX4) and an E1000 NIC.

    IDE and E1000 are the devices VirtualBox and VMware both import without translation, and
    the kernel drives both (ATA_PIIX built in, e1000 as a module).
    """
    title = escape(f"Kiln {assets.version}")
    items = _ovf_hardware(cpus, memory_mib)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"
          xmlns:cim="http://schemas.dmtf.org/wbem/wscim/1/common"
          xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"
          xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
          xmlns:vmw="http://www.vmware.com/schema/ovf"
          xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData"
          xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <References>
    <File ovf:href={quoteattr(vmdk)} ovf:id="file1" ovf:size="{vmdk_size}"/>
  </References>
  <DiskSection>
    <Info>Virtual disk information</Info>
    <Disk ovf:capacity="{capacity}" ovf:capacityAllocationUnits="byte" ovf:diskId="vmdisk1" ovf:fileRef="file1"
          ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
  </DiskSection>
  <NetworkSection>
    <Info>The list of logical networks</Info>
    <Network ovf:name="VM Network">
      <Description>The VM Network network</Description>
    </Network>
  </NetworkSection>
  <VirtualSystem ovf:id={quoteattr(name)}>
    <Info>A virtual machine</Info>
    <Name>{escape(name)}</Name>
    <AnnotationSection>
      <Info>A human-readable annotation</Info>
      <Annotation>{title}</Annotation>
    </AnnotationSection>
    <OperatingSystemSection ovf:id="101" vmw:osType="otherLinux64Guest">
      <Info>The kind of installed guest operating system</Info>
      <Description>Linux 64-bit</Description>
    </OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements</Info>
      <System>
        <vssd:ElementName>Virtual Hardware Family</vssd:ElementName>
        <vssd:InstanceID>0</vssd:InstanceID>
        <vssd:VirtualSystemIdentifier>{escape(name)}</vssd:VirtualSystemIdentifier>
        <vssd:VirtualSystemType>vmx-10</vssd:VirtualSystemType>
      </System>
{items.rstrip()}
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
"""


def _rasd_item(**values: str) -> str:
    """One <Item> of the virtual hardware; CIM's RASD schema is a sequence in alphabetical order, and
    VMware's importer checks it."""
    inner = "".join(f"        <rasd:{key}>{value}</rasd:{key}>\n" for key, value in sorted(values.items()))
    return f"      <Item>\n{inner}      </Item>\n"


def _ovf_hardware(cpus: int, memory_mib: int) -> str:
    """The VM's items: CPUs, memory, an IDE controller (PIIX4) with the disk on it, an E1000 NIC."""
    return "".join(
        (
            _rasd_item(
                AllocationUnits="hertz * 10^6",
                Description="Number of virtual CPUs",
                ElementName=f"{cpus} virtual CPU(s)",
                InstanceID="1",
                ResourceType="3",
                VirtualQuantity=str(cpus),
            ),
            _rasd_item(
                AllocationUnits="byte * 2^20",
                Description="Memory size",
                ElementName=f"{memory_mib} MB of memory",
                InstanceID="2",
                ResourceType="4",
                VirtualQuantity=str(memory_mib),
            ),
            _rasd_item(
                Address="0",
                Description="IDE Controller",
                ElementName="ideController0",
                InstanceID="3",
                ResourceSubType="PIIX4",
                ResourceType="5",
            ),
            _rasd_item(
                AddressOnParent="0",
                ElementName="disk0",
                HostResource="ovf:/disk/vmdisk1",
                InstanceID="4",
                Parent="3",
                ResourceType="17",
            ),
            _rasd_item(
                AddressOnParent="0",
                AutomaticAllocation="true",
                Connection="VM Network",
                Description="E1000 ethernet adapter",
                ElementName="ethernet0",
                InstanceID="5",
                ResourceSubType="E1000",
                ResourceType="10",
            ),
        )
    )


def _qemu_img(args: list[str]) -> None:
    if shutil.which("qemu-img") is None:
        raise BuildError("converting disk images needs qemu-img: apt install qemu-utils")
    tools.run(["qemu-img", *args], what=f"qemu-img {args[0]}")
