"""End-to-end: the shipped extensions, built from pkgs/ and booted in QEMU (TCG).

acpi-call is an out-of-tree module built against kernel-build: the kernel must accept it (same
vermagic and symbol CRCs) when machined loads it at boot. lldpd is a userland service: machined
must start it and it must put a real LLDP frame on the wire, which QEMU's filter-dump records
from the guest's NIC. One boot for both. The same module with another kernel's vermagic is
refused when the image is made.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.boot.qemu import READY, BootResult, boot, machine_for
from kiln.build.cache_keys import compute_keys
from kiln.build.store import Store
from kiln.core.errors import BuildError
from kiln.core.paths import cache_dir
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform
from kiln.rootfs.extension import check_kernel, manifest_for
from tests.e2e.conftest import ROOT, kiln
from tests.integration import services

pytestmark = pytest.mark.e2e

LLDP_ETHERTYPE = 0x88CC
FRAME_WAIT = 30.0  # lldpd sends its first frame as soon as it has seen the interface


@pytest.fixture(scope="module")
def extension_image(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base image with both shipped extensions (image_dir: the base packages are stored)."""
    out = tmp_path_factory.mktemp("extensions")
    kiln("image", "--kind", "kernel,initramfs", "--extension", "acpi-call", "--extension", "lldpd", "--out", str(out))
    return out


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


def test_extensions_from_a_registry_make_the_same_image(
    extension_image: Path, registry: tuple[str, Path], tmp_path: Path
) -> None:
    """Both shipped extensions pushed to a real registry, then named by reference: the initramfs is
    byte-identical to the one made from the tree, and a profile's manifest pins their digests."""
    host, _ = registry
    pinned = {}
    for name in ("acpi-call", "lldpd"):
        pushed = kiln("extension", "push", name, "--to", f"{host}/kiln/{name}:test")
        pinned[name] = pushed.stdout.strip().splitlines()[-1]
        assert pinned[name].startswith(f"oci://{host}/kiln/{name}:test@sha256:"), pushed.stdout
    refs = [f"oci://{host}/kiln/acpi-call:test", f"oci://{host}/kiln/lldpd:test"]
    out = tmp_path / "pulled"
    made = kiln("image", "--kind", "initramfs", *[a for r in refs for a in ("--extension", r)], "--out", str(out))
    assert f"extension {refs[0]}: {pinned['acpi-call']}" in made.stdout
    assert (out / "initramfs.zst").read_bytes() == (extension_image / "initramfs.zst").read_bytes()
    profile = tmp_path / "ext.yaml"
    for label, names in (("tree", ["acpi-call", "lldpd"]), ("registry", [refs[0], pinned["lldpd"]])):
        profile.write_text(json.dumps({"name": label, "platform": "metal", "output": {"kind": "initramfs"}}))
        kiln("image", str(profile), *[a for n in names for a in ("--extension", n)], "--out", str(tmp_path / "p"))
    tree_made, registry_made = (tmp_path / "p" / label / "initramfs-amd64.zst" for label in ("tree", "registry"))
    assert tree_made.read_bytes() == registry_made.read_bytes()
    inputs = json.loads((tmp_path / "p/registry/manifest.json").read_text())["inputs"]
    assert inputs["extensions"] == {refs[0]: pinned["acpi-call"], pinned["lldpd"]: pinned["lldpd"]}
    listed = {p["name"]: p for p in json.loads((tmp_path / "p/registry/sbom.spdx.json").read_text())["packages"]}
    for name in ("acpi-call", "lldpd"):  # in the SBOM by the reference they were pulled from
        ref = {"referenceCategory": "OTHER", "referenceType": "kiln-oci-reference", "referenceLocator": pinned[name]}
        assert ref in listed[name]["externalRefs"], listed[name]


def test_a_schematic_names_the_image_it_customises(image_dir: Path, tmp_path: Path) -> None:
    """A PXE profile made with a schematic (lldpd, a kernel argument that powers off after ready): its ID
    is in manifest.json, both SBOMs and the rootfs, and the machine, booted over PXE with the image's own
    command line, says it before ready, runs the schematic's extension and obeys its kernel argument."""
    schematic = tmp_path / "lab.yaml"
    schematic.write_text("extensions: [lldpd]\nkernel_args: [kiln.test=poweroff]\n")
    schematic_id = kiln("schematic", "id", str(schematic)).stdout.strip()
    profile = tmp_path / "lab-pxe.yaml"
    profile.write_text(json.dumps({"name": "lab-pxe", "platform": "metal", "output": {"kind": "pxe"}}))
    kiln("image", str(profile), "installer", "--schematic", str(schematic), "--out", str(tmp_path / "out"))
    assert "extensions/01-lldpd.sqsh" in installer_initramfs(tmp_path / "out/installer/installer-amd64", tmp_path)
    out = tmp_path / "out/lab-pxe"
    assert json.loads((out / "manifest.json").read_text())["profile"]["schematic"] == schematic_id
    for sbom in ("sbom.spdx.json", "sbom.cdx.json"):
        assert schematic_id in (out / sbom).read_text(), sbom
    assert "kiln.test=poweroff" in (out / "boot.ipxe").read_text()
    log = tmp_path / "console.log"
    result = boot(machine_for(out), READY, 240.0, log, until_exit=True)
    lines = log.read_text(errors="replace").splitlines()
    assert result.ok and result.exit_code == 0, "\n".join(result.tail)
    said = [i for i, line in enumerate(lines) if f"machined: schematic {schematic_id}" in line]
    ready = [i for i, line in enumerate(lines) if READY in line and "extensions=[lldpd]" in line]
    assert said and ready and said[0] < ready[0], "\n".join(lines[-40:])


def test_a_schematic_release_is_pushed_with_its_extension(
    image_dir: Path, registry: tuple[str, Path], tmp_path: Path
) -> None:
    """`kiln release push installer --schematic`: the installer profile built with the schematic, pushed
    to the schematic's own repository; what the registry serves is that layout, extension included."""
    from kiln.core.registry import Client, Ref

    host, _ = registry
    schematic = tmp_path / "lab.yaml"
    schematic.write_text("extensions: [lldpd]\n")
    schematic_id = kiln("schematic", "id", str(schematic)).stdout.strip()
    repo = f"{host}/factory/{schematic_id}/installer"
    out = tmp_path / "out"
    push = ["release", "push", "installer", "--schematic", str(schematic), "--to", repo, "--channel", "stable"]
    pushed = kiln(*push, "--out", str(out))
    assert f"schematic {schematic_id}" in pushed.stderr and f"pushed {repo}:" in pushed.stdout, pushed.stdout
    layout = out / "installer/installer-amd64"
    assert "extensions/01-lldpd.sqsh" in installer_initramfs(layout, tmp_path)
    assert json.loads((out / "installer/manifest.json").read_text())["profile"]["schematic"] == schematic_id
    tag = pushed.stdout.split(f"pushed {repo}:", 1)[1].split("@", 1)[0]
    served = Client(Ref.parse(repo)).get_manifest(tag)
    assert served is not None
    local = json.loads((layout / "blobs/sha256" / layout_manifest_digest(layout)[7:]).read_text())
    assert boot_layer(json.loads(served[0])) == boot_layer(local)  # the boot layer built with the schematic


def layout_manifest_digest(layout: Path) -> str:
    digest: str = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    return digest


def boot_layer(manifest: dict[str, Any]) -> dict[str, Any]:
    """The descriptor of an installer manifest's boot layer (kernel and initramfs)."""
    boots: list[dict[str, Any]] = [
        d for d in manifest["layers"] if d.get("annotations", {}).get("dev.kiln.layer") == "boot"
    ]
    (boot,) = boots
    return boot


def installer_initramfs(layout: Path, work: Path) -> list[str]:
    """The members of the initramfs in an installer image's boot layer: what an install or an upgrade
    writes into a slot, so a machine installed or upgraded from it keeps the schematic's extensions."""
    manifest = json.loads((layout / "blobs/sha256" / layout_manifest_digest(layout)[7:]).read_text())
    boot = boot_layer(manifest)
    with tarfile.open(layout / "blobs/sha256" / boot["digest"][7:]) as layer:
        member = next(m for m in layer.getmembers() if m.name.endswith("initramfs.zst"))
        extracted = layer.extractfile(member)
        assert extracted is not None
        (work / "boot-initramfs.zst").write_bytes(extracted.read())
    plain = subprocess.run(["zstd", "-dc", str(work / "boot-initramfs.zst")], capture_output=True, check=True).stdout
    listed = subprocess.run(["cpio", "-it", "--quiet"], input=plain, capture_output=True, check=True).stdout
    return listed.decode().split()


def frames(pcap: Path) -> list[bytes]:
    """The Ethernet frames of a libpcap file (as QEMU's filter-dump writes it)."""
    data = pcap.read_bytes() if pcap.exists() else b""
    found, offset = [], 24  # the global header
    while offset + 16 <= len(data):
        captured = struct.unpack_from("<I", data, offset + 8)[0]
        found.append(data[offset + 16 : offset + 16 + captured])
        offset += 16 + captured
    return found


def lldp_frames(pcap: Path) -> list[bytes]:
    return [f for f in frames(pcap) if len(f) > 14 and struct.unpack_from("!H", f, 12)[0] == LLDP_ETHERTYPE]


def tlvs(frame: bytes) -> dict[int, bytes]:
    """An LLDP frame's TLVs by type (the first of each), after the 14-byte Ethernet header."""
    found: dict[int, bytes] = {}
    offset = 14
    while offset + 2 <= len(frame):
        head = struct.unpack_from("!H", frame, offset)[0]
        kind, length = head >> 9, head & 0x1FF
        found.setdefault(kind, frame[offset + 2 : offset + 2 + length])
        offset += 2 + length
        if kind == 0:  # end of LLDPDU
            break
    return found


def test_the_module_loads_and_the_service_speaks_lldp(extension_image: Path, tmp_path: Path) -> None:
    pcap = tmp_path / "net.pcap"
    machine = machine_for(extension_image)
    machine.cmdline = "console=ttyS0"
    machine.extra = ["-object", f"filter-dump,id=dump0,netdev=net0,file={pcap}"]
    seen: list[bytes] = []

    def wait_for_lldp(_: BootResult) -> None:  # the machine runs until this returns
        deadline = time.monotonic() + FRAME_WAIT
        while not (found := lldp_frames(pcap)) and time.monotonic() < deadline:
            time.sleep(0.2)
        seen.extend(found)

    # ready comes after machined started its services: waiting for it (not for lldpd's start) leaves no
    # race between the frame being seen, which ends the boot, and the ready line being printed
    result = boot(machine, READY, 180.0, tmp_path / "console.log", on_found=wait_for_lldp)
    lines = (tmp_path / "console.log").read_text(errors="replace").splitlines()
    assert result.ok, "\n".join(result.tail)
    assert any(READY in line and "extensions=[acpi-call,lldpd]" in line for line in lines)
    assert "machined: extension modules: 1 of 1 loaded (acpi_call)" in lines
    assert any(re.search(r"machined: kernel: lockdown none; \d+ modules loaded: .*acpi_call", line) for line in lines)
    assert seen, f"no LLDP frame from the guest within {FRAME_WAIT} s of lldpd starting"
    frame = seen[0]
    assert frame[:6] == bytes.fromhex("0180c200000e")  # the nearest-bridge LLDP address
    fields = tlvs(frame)
    assert fields[4] == b"eth0"  # port description
    assert fields[6].startswith(b"Kiln ") and b"Linux 6.1." in fields[6]  # system description: os-release
    assert bytes([10, 0, 2, 15]) in fields[8]  # management address: the address DHCP gave the guest
    assert not any(re.search(r"service lldpd: .*restarting", line) for line in lines)


def test_a_module_with_another_kernels_vermagic_is_refused(image_dir: Path, tmp_path: Path) -> None:
    """The real acpi_call.ko with its vermagic's release changed, against the real kernel."""
    graph = Graph(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64")))
    keys = compute_keys(graph)
    store = Store(cache_dir())
    kiln("build", "acpi-call")
    kernel, built = store.tree(keys["kernel"]), store.tree(keys["acpi-call"])
    manifest = manifest_for(graph.tree.packages["acpi-call"])
    check_kernel(manifest, built, kernel)  # as built: accepted
    module = next(built.rglob("acpi_call.ko"))
    data = module.read_bytes()
    release = module.relative_to(built / "usr/lib/modules").parts[0]
    other = tmp_path / "acpi-call"
    target = other / module.relative_to(built)
    target.parent.mkdir(parents=True)
    wrong = release[:-1] + ("9" if release[-1] != "9" else "8")  # same length: the section keeps its size
    target.write_bytes(data.replace(f"vermagic={release} ".encode(), f"vermagic={wrong} ".encode()))
    with pytest.raises(BuildError, match=rf"was built for vermagic '{re.escape(wrong)} .*, this image's kernel has"):
        check_kernel(manifest, other, kernel)
