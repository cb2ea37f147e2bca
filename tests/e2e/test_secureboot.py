"""Secure Boot, proven in firmware: OVMF's Secure Boot build with the test keys enrolled (virt-fw-vars).

The real kernel and initramfs from the graph, in a signed metal disk (shim, GRUB, the slot's UKI)
and a signed UKI alone. The signed disk reaches ready and machined reports Secure Boot on from the
EFI variable, the kernel locked down and its modules, signed with the module key (a trusted
Machine Owner Key), loaded; the same disk with its modules left unsigned boots with every module
refused by the kernel, and so does the lone UKI, whose kernel has no MOK (no shim ran) to check
them with. A UKI with one byte changed (in its command line or its kernel), or signed with
another key, is refused by the firmware ("Access Denied"); a changed UKI in the disk's slot is
refused by shim when GRUB asks it ("bad shim signature"). Two builds with the same keys give the
same bytes, and `kiln verify` accepts the signed release and refuses a changed one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pefile
import pytest

from kiln.boot.qemu import READY, BootResult, Machine, boot
from kiln.cli import main
from kiln.signing.generate import generate
from kiln.signing.keyset import KeySet
from kiln.signing.modules import ModuleSigner
from kiln.signing.pcr import policy_digest
from tests.e2e.conftest import KILN, ROOT, kiln
from tests.e2e.test_platforms import eventually
from tests.e2e.test_system import client_context, console, free_port, make_ca, make_cert, request, wait_for_line
from tests.integration.test_secureboot_outputs import predicted_pcr11, section

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 240
REFUSED_TIMEOUT = 120
UNSIGNED_REFUSED = "Loading of unsigned module is rejected"  # the kernel's words (module.sig_enforce=1)
UNKNOWN_KEY_REFUSED = "Loading of module with unavailable key is rejected"
# a device whose driver is a module (virtio_balloon), so machined has one to load at boot
MODULE_DEVICE = ["-device", "virtio-balloon-pci"]
PROFILE = """\
name: {name}
platform: metal
keys: {{path: {keys}}}
secureboot: true
customization:
  kernel_args: ["console=ttyS0,115200n8"]
  machine_config: {config}
output:
  kind: image
  image: {{disk_size: 1GiB}}
"""
ISO_PROFILE = """\
name: sb-iso
platform: metal
keys: {{path: {keys}}}
secureboot: true
customization:
  kernel_args: ["console=ttyS0,115200n8"]
output: {{kind: iso}}
"""
SB_DISK = "metal-amd64-secureboot.raw"  # <platform>-<arch>-secureboot.<format>
UKI = "metal-amd64-uki.efi"
UKI_PROFILE = "name: uki\nplatform: metal\nkeys: {{path: {keys}}}\noutput: {{kind: uki}}\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, image_dir: Path) -> dict[str, Path]:
    """Keys, another key set, API certificates, and the signed disk and UKI (built twice)."""
    root = tmp_path_factory.mktemp("secureboot")
    generate(root / "keys", common_name="Kiln e2e")
    generate(root / "other", common_name="Someone else")
    pki = root / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_cert(pki, "ca", "machine", "subjectAltName=IP:127.0.0.1")
    make_cert(pki, "ca", "admin", "extendedKeyUsage=clientAuth", role="admin")
    config = {"api": {"cert": (pki / "machine.crt").read_text(), "key": (pki / "machine.key").read_text()}}
    config["api"]["ca"] = (pki / "ca.crt").read_text()
    (root / "sb-metal.yaml").write_text(PROFILE.format(name="sb-metal", keys=root / "keys", config=json.dumps(config)))
    (root / "uki.yaml").write_text(UKI_PROFILE.format(keys=root / "keys"))
    (root / "sb-iso.yaml").write_text(ISO_PROFILE.format(keys=root / "keys"))
    (root / "other-uki.yaml").write_text(UKI_PROFILE.format(keys=root / "other").replace("name: uki", "name: other"))
    profiles = [str(root / n) for n in ("sb-metal.yaml", "sb-iso.yaml", "uki.yaml", "other-uki.yaml")]
    kiln("image", *profiles, "--out", str(root / "out"))
    kiln("image", *profiles, "--out", str(root / "again"))
    return {"root": root, "keys": root / "keys", "pki": pki, "out": root / "out", "again": root / "again"}


def refused(efi: Path, keys: Path, expect: str, log: Path) -> BootResult:
    return boot(Machine(efi=efi, secure_boot_keys=keys), expect, REFUSED_TIMEOUT, log)


def flip_byte(efi: Path, section: str, out: Path) -> Path:
    """A copy of `efi` with one byte of `section` changed (its signature left as it was)."""
    image = pefile.PE(str(efi), fast_load=True)
    [found] = [s for s in image.sections if s.Name.rstrip(b"\0") == section.encode()]
    offset = found.PointerToRawData + 8
    image.close()
    data = bytearray(efi.read_bytes())
    data[offset] ^= 0x20
    out.write_bytes(data)
    return out


def test_the_signed_disk_boots_with_secure_boot_on(world: dict[str, Path], tmp_path: Path) -> None:
    disk = world["out"] / "sb-metal" / SB_DISK
    port, log = free_port(), tmp_path / "console.log"
    guest = Machine(disk=disk, secure_boot_keys=world["keys"], api_port=port, tpm=True, extra=MODULE_DEVICE)
    results: list[BootResult] = []
    thread = threading.Thread(target=lambda: results.append(boot(guest, READY, BOOT_TIMEOUT, log, until_exit=True)))
    thread.daemon = True
    thread.start()
    try:
        wait_for_line(log, READY, thread, BOOT_TIMEOUT)
        lines = console(log)
        assert any("machined: firmware: UEFI, Secure Boot on" in line for line in lines), lines[-40:]
        assert any("Secure boot enabled" in line for line in lines), "the kernel saw Secure Boot"
        context = client_context(world["pki"], "admin")
        status = eventually(
            lambda: json.loads(request(port, context, "GET", "/v1/status")[1]), lambda s: "firmware" in s
        )
        assert status["firmware"] == {"uefi": True, "secure_boot": True, "setup_mode": False}, status["firmware"]
        assert status["boot"]["slot"] == "A", status["boot"]
        # locked down, the module key trusted from the MOK list shim passed on, and modules loaded with it
        assert status["lockdown"] == "integrity", status
        assert any("Kiln e2e module" in line and "Loaded X.509 cert" in line for line in lines), lines[:80]
        assert "virtio_balloon" in status["modules"], status["modules"]
        assert not any("is rejected" in line for line in lines), [line for line in lines if "rejected" in line]
        # measured boot: systemd-stub extended the TPM's PCR 11 with the slot UKI's sections, to exactly
        # the value systemd-measure predicts, and the policy the UKI carries, signed with the PCR key,
        # allows that value and no other
        uki = tmp_path / "slot.efi"
        partition_file(disk, "A/kiln.efi", uki)
        measured = status["tpm"]["pcr11_sha256"]
        assert measured == predicted_pcr11(uki, tmp_path).hex(), status["tpm"]
        [policy] = json.loads(section(uki, ".pcrsig"))["sha256"]
        assert policy["pol"] == policy_digest(bytes.fromhex(measured)).hex()
        assert request(port, context, "POST", "/v1/poweroff")[0] == 202
    finally:
        thread.join(BOOT_TIMEOUT)
    assert results and results[0].exit_code == 0, "the guest did not power off"


def test_the_signed_iso_boots_with_secure_boot_on(world: dict[str, Path], tmp_path: Path) -> None:
    iso, log = world["out"] / "sb-iso" / "metal-amd64-secureboot.iso", tmp_path / "console.log"
    result = boot(Machine(cdrom=iso, secure_boot_keys=world["keys"]), READY, BOOT_TIMEOUT, log)
    assert result.ok, result.reason
    assert any("machined: firmware: UEFI, Secure Boot on" in line for line in console(log))


def test_the_signed_uki_boots_and_a_changed_or_foreign_one_is_refused(world: dict[str, Path], tmp_path: Path) -> None:
    uki, keys = world["out"] / "uki" / UKI, world["keys"]
    good = boot(
        Machine(efi=uki, secure_boot_keys=keys, extra=MODULE_DEVICE), READY, BOOT_TIMEOUT, tmp_path / "good.log"
    )
    assert good.ok, good.reason
    # no shim ran, so no MOK list reached the kernel: its modules' key is unknown to it and refused
    lines = console(tmp_path / "good.log")
    assert any(UNKNOWN_KEY_REFUSED in line for line in lines), lines[-60:]
    assert any("kernel: lockdown integrity; 0 modules loaded" in line for line in lines), lines[-60:]
    for name, efi in {
        "command line": flip_byte(uki, ".cmdline", tmp_path / "cmdline.efi"),
        "kernel": flip_byte(uki, ".linux", tmp_path / "kernel.efi"),
        "another key": world["out"] / "other" / UKI,
    }.items():
        result = refused(efi, keys, "Access Denied", tmp_path / f"{name.replace(' ', '-')}.log")
        assert result.ok, f"{name}: the firmware did not refuse it: {result.reason}"
        assert READY not in (tmp_path / f"{name.replace(' ', '-')}.log").read_text(errors="replace")


def test_unsigned_modules_are_refused_by_the_kernel(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stub: the disk is built in this process with ModuleSigner.sign_tree replaced by one that signs
    nothing, so its modules are left unsigned; the rest is the real signed chain, and the refusal is
    the real kernel's. The signed disk test above runs the real signing path."""
    monkeypatch.setattr(ModuleSigner, "sign_tree", lambda self, root: 0)
    monkeypatch.chdir(ROOT)
    assert main(["image", str(world["root"] / "sb-metal.yaml"), "--out", str(tmp_path / "out")]) == 0
    log = tmp_path / "console.log"
    guest = Machine(disk=tmp_path / "out" / "sb-metal" / SB_DISK, secure_boot_keys=world["keys"], extra=MODULE_DEVICE)
    result = boot(guest, READY, BOOT_TIMEOUT, log)
    assert result.ok, result.reason
    lines = console(log)
    assert any(UNSIGNED_REFUSED in line for line in lines), lines[-60:]
    assert any("kernel: lockdown integrity; 0 modules loaded" in line for line in lines), lines[-60:]


def partition_file(disk: Path, name: str, out: Path, *, put: bool = False, partition: str = "BOOT") -> Path:
    """Copy file `name` of the disk's FAT `partition` to `out` (or, with `put`, `out` onto it)."""
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True, text=True).stdout)
    [start] = [p["start"] for p in table["partitiontable"]["partitions"] if p["name"] == partition]
    env = {"MTOOLS_SKIP_CHECK": "1", "PATH": "/usr/bin:/bin"}
    image = f"{disk}@@{start * 512}"
    copy = (
        ["mcopy", "-o", "-i", image, str(out), f"::/{name}"]
        if put
        else ["mcopy", "-n", "-i", image, f"::/{name}", str(out)]
    )
    subprocess.run(copy, check=True, env=env)
    return out


def test_a_changed_slot_uki_on_the_disk_is_refused_by_shim(world: dict[str, Path], tmp_path: Path) -> None:
    disk = tmp_path / "disk.raw"
    shutil.copyfile(world["out"] / "sb-metal" / SB_DISK, disk)
    slot = partition_file(disk, "A/kiln.efi", tmp_path / "slot.efi")
    changed = flip_byte(slot, ".cmdline", tmp_path / "changed.efi")
    partition_file(disk, "A/kiln.efi", changed, put=True)
    log = tmp_path / "console.log"
    result = boot(Machine(disk=disk, secure_boot_keys=world["keys"]), "bad shim signature", REFUSED_TIMEOUT, log)
    assert result.ok, result.reason
    assert READY not in log.read_text(errors="replace")


def debian_signed_grub(work: Path) -> Path:
    """Debian's own signed GRUB (grub-efi-amd64-signed), which shim-unsigned's vendor certificate vouches for."""
    subprocess.run(["apt-get", "download", "-q", "grub-efi-amd64-signed"], cwd=work, check=True, capture_output=True)
    [deb] = work.glob("grub-efi-amd64-signed_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
    [grub] = (work / "root").glob("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed")
    return grub


def test_what_shims_vendor_signed_is_forbidden(world: dict[str, Path], tmp_path: Path) -> None:
    """shim-unsigned trusts Debian's CA besides db; with it in dbx (as kiln enrols the keys), Debian's
    signed GRUB put where Kiln's GRUB belongs is refused rather than started."""
    disk = tmp_path / "disk.raw"
    shutil.copyfile(world["out"] / "sb-metal" / SB_DISK, disk)
    partition_file(disk, "EFI/BOOT/grubx64.efi", debian_signed_grub(tmp_path), put=True, partition="EFI")
    log = tmp_path / "console.log"
    result = boot(Machine(disk=disk, secure_boot_keys=world["keys"]), "Binary is forbidden", REFUSED_TIMEOUT, log)
    assert result.ok, result.reason
    assert "GNU GRUB" not in log.read_text(errors="replace")


def test_same_keys_same_bytes_and_the_release_verifies(world: dict[str, Path], tmp_path: Path) -> None:
    for name in ("sb-metal", "sb-iso", "uki"):
        for file in ("SHA256SUMS", "SHA256SUMS.sig"):
            assert (world["out"] / name / file).read_bytes() == (world["again"] / name / file).read_bytes(), name
    release = KeySet(world["keys"]).release_public
    assert "verified" in kiln("verify", str(world["out"] / "uki"), "--key", str(release)).stdout
    copy = tmp_path / "uki"
    shutil.copytree(world["out"] / "uki", copy)
    flip_byte(copy / UKI, ".cmdline", copy / UKI)
    result = subprocess.run(
        [*KILN, "verify", str(copy), "--key", str(release)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 1 and f"{UKI}: checksum differs" in result.stderr + result.stdout, result
