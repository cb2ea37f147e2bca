"""Secure Boot outputs with the real tools: a UKI (systemd's stub, objcopy, osslsigncode) and the
signed chain on a disk (shim, GRUB with its SBAT, the slot's UKI), checked with sbverify against
the keys that signed them and against others. The kernel and initramfs are stand-ins: what is
tested here is what wraps and signs them; tests/e2e/test_secureboot.py boots the real ones."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pefile
import pytest

from kiln.image.assets import BootAssets, Loader
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.secureboot import GRUB_EFI_NAME, SBAT_GENERATION
from kiln.image.outputs.uki import build_uki, os_release
from kiln.signing.generate import generate
from kiln.signing.keyset import KeySet
from kiln.signing.pcr import MEASURED, SYSTEMD_MEASURE, policy_digest
from tests.integration.test_disk import EPOCH, SIZE, fake_assets, fat_file, partitions, sha

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeySet:
    return generate(tmp_path_factory.mktemp("keys") / "keys", common_name="Kiln test")


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> KeySet:
    return generate(tmp_path_factory.mktemp("other") / "keys", common_name="Someone else")


def secure_assets(root: Path, keys: KeySet, epoch: int = EPOCH) -> BootAssets:
    plain = fake_assets(root, epoch)
    loader = Loader.for_arch("amd64", ("uefi",))
    return BootAssets.make(plain.vmlinuz, plain.initramfs, plain.cmdline, plain.version, epoch, None, loader, keys)


def predicted_pcr11(uki: Path, work: Path) -> bytes:
    """PCR 11 after systemd-stub measured `uki`'s sections, as `systemd-measure calculate` predicts it."""
    argv = [str(SYSTEMD_MEASURE), "calculate", "--bank=sha256", "--phase="]
    for name in MEASURED:
        (work / name.lstrip(".")).write_bytes(section(uki, name))
        argv.append(f"--{name.lstrip('.')}={work / name.lstrip('.')}")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return bytes.fromhex(out.split("sha256=")[1].split()[0])


def verifies(efi: Path, cert: Path) -> bool:
    return subprocess.run(["sbverify", "--cert", str(cert), str(efi)], capture_output=True).returncode == 0


def section(efi: Path, name: str) -> bytes:
    image = pefile.PE(str(efi))
    try:
        [found] = [s for s in image.sections if s.Name.rstrip(b"\0") == name.encode()]
        return bytes(found.get_data()[: found.Misc_VirtualSize])
    finally:
        image.close()


def test_uki_holds_kernel_initramfs_cmdline_and_os_release_and_is_signed_by_db(
    tmp_path: Path, keys: KeySet, other_keys: KeySet
) -> None:
    assets = secure_assets(tmp_path / "assets", keys)
    uki = build_uki(assets, tmp_path / "kiln.efi", "console=ttyS0 kiln.slot=A", keys)
    assert section(uki, ".linux") == assets.vmlinuz.read_bytes()
    assert section(uki, ".initrd") == assets.initramfs.read_bytes()
    assert section(uki, ".cmdline") == b"console=ttyS0 kiln.slot=A"
    assert section(uki, ".osrel") == os_release("0.1.0").encode()
    # measured boot: the PCR key and the PCR 11 policy systemd-measure signed with it
    assert section(uki, ".pcrpkey") == keys.pcr_public.read_bytes()
    [policy] = json.loads(section(uki, ".pcrsig"))["sha256"]
    assert policy["pcrs"] == [11]
    expected = predicted_pcr11(uki, tmp_path)
    assert policy["pol"] == policy_digest(expected).hex(), "the signed policy allows another PCR 11 value"
    (tmp_path / "pol").write_bytes(bytes.fromhex(policy["pol"]))
    (tmp_path / "sig").write_bytes(base64.b64decode(policy["sig"]))
    check = ["openssl", "dgst", "-sha256", "-verify", str(keys.pcr_public), "-signature", str(tmp_path / "sig")]
    assert subprocess.run([*check, str(tmp_path / "pol")], capture_output=True).returncode == 0
    assert verifies(uki, keys.cert("db"))
    assert not verifies(uki, other_keys.cert("db")), "another db key must not verify it"
    unsigned = build_uki(assets, tmp_path / "unsigned.efi", "console=ttyS0")
    assert not verifies(unsigned, keys.cert("db"))


def test_uki_is_the_same_bytes_for_the_same_inputs_and_keys(tmp_path: Path, keys: KeySet) -> None:
    assets = secure_assets(tmp_path / "assets", keys)
    first = build_uki(assets, tmp_path / "1.efi", assets.cmdline, keys).read_bytes()
    second = build_uki(assets, tmp_path / "2.efi", assets.cmdline, keys).read_bytes()
    assert first == second
    later = secure_assets(tmp_path / "later", keys, EPOCH + 1)
    assert build_uki(later, tmp_path / "3.efi", assets.cmdline, keys).read_bytes() != first, "the epoch is in it"


def test_secure_boot_disk_holds_the_signed_chain_and_no_bare_kernel(
    tmp_path: Path, keys: KeySet, other_keys: KeySet
) -> None:
    assets = secure_assets(tmp_path / "assets", keys)
    image = build_raw(assets, tmp_path / "disk.raw", SIZE)
    parts = partitions(image)
    efi, boot = parts["EFI"]["start"], parts["BOOT"]["start"]
    shim = tmp_path / "shim.efi"
    fat_file(image, efi, "EFI/BOOT/BOOTX64.EFI", shim)
    grub = tmp_path / "grub.efi"
    fat_file(image, efi, f"EFI/BOOT/{GRUB_EFI_NAME}", grub)
    mok_manager = tmp_path / "mmx64.efi"
    fat_file(image, efi, "EFI/BOOT/mmx64.efi", mok_manager)
    uki = tmp_path / "slot.efi"
    fat_file(image, boot, "A/kiln.efi", uki)
    for signed in (shim, grub, mok_manager, uki):
        assert verifies(signed, keys.cert("db")), signed.name
        assert not verifies(signed, other_keys.cert("db")), signed.name
    assert f"grub,{SBAT_GENERATION},".encode() in section(grub, ".sbat")
    assert section(uki, ".cmdline").endswith(b" kiln.slot=A")
    assert fat_file(image, boot, "A/boot.cfg", tmp_path / "boot.cfg") == b"chainloader /A/kiln.efi\n"
    listing = subprocess.run(
        ["mdir", "-b", "-i", f"{image}@@{boot * 512}", "::/A"],
        capture_output=True,
        text=True,
        env={"MTOOLS_SKIP_CHECK": "1", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "vmlinuz" not in listing and "initramfs" not in listing, listing
    with image.open("rb") as disk:
        assert disk.read(440) == bytes(440), "no BIOS boot code: a Secure Boot disk boots UEFI only"


def test_secure_boot_disk_is_reproducible_and_depends_on_the_keys(
    tmp_path: Path, keys: KeySet, other_keys: KeySet
) -> None:
    first = sha(build_raw(secure_assets(tmp_path / "a", keys), tmp_path / "1.raw", SIZE))
    second = sha(build_raw(secure_assets(tmp_path / "b", keys), tmp_path / "2.raw", SIZE))
    assert first == second
    other = sha(build_raw(secure_assets(tmp_path / "c", other_keys), tmp_path / "3.raw", SIZE))
    assert other != first
