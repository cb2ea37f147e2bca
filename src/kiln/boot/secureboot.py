"""Booting under Secure Boot in QEMU: OVMF's Secure Boot build with the user's keys enrolled.

The variable store is Debian's empty OVMF_VARS_4M.fd with PK, KEK and db set to the key
directory's certificates, shim's vendor certificate in dbx (kiln.signing.shim), the module
certificate as a Machine Owner Key (MokList) and Secure Boot on,
written by virt-fw-vars (virt-firmware, the tool QEMU's firmware maintainers keep for this).
The Secure Boot firmware only runs with SMM and its flash marked secure, which QEMU's q35
machine provides.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError, InputError
from kiln.signing.keyset import UEFI_KEYS, KeySet
from kiln.signing.shim import VENDOR_CERT, vendor_cert_pem

SECURE_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
SECURE_MACHINE = ("-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on")
ENROL_FLAGS = {"PK": "--set-pk", "KEK": "--add-kek", "db": "--add-db"}
ESP_SIZE = 64 << 20


def virt_fw_vars() -> str:
    """virt-fw-vars from Kiln's own environment (a dependency), else from PATH."""
    beside = Path(sys.executable).with_name("virt-fw-vars")
    found = str(beside) if beside.exists() else shutil.which("virt-fw-vars")
    if found is None:
        raise BuildError("enrolling Secure Boot keys needs virt-fw-vars: pip install virt-firmware")
    return found


def enrolled_vars(keys_dir: Path, template: Path, out: Path) -> Path:
    """`template` (an empty OVMF variable store) with the key directory's PK, KEK and db enrolled."""
    if not keys_dir.is_dir():
        raise InputError(f"--secure-boot {keys_dir}: no such key directory")
    if not SECURE_CODE.exists():
        raise BuildError(f"Secure Boot needs OVMF's Secure Boot build {SECURE_CODE}: apt install ovmf")
    keys = KeySet(keys_dir)
    owner = keys.owner_guid()
    argv = [virt_fw_vars(), "-i", str(template)]
    for name in UEFI_KEYS:
        argv += [ENROL_FLAGS[name], owner, str(keys.require(keys.cert(name)))]
    vendor_cert_pem()  # says what to install when it is missing
    argv += ["--add-dbx-cert", owner, str(VENDOR_CERT)]  # what shim would trust besides db (kiln.signing.shim)
    # The module key as a Machine Owner Key, what `mokutil --import module.der` arranges through
    # MokManager on a real machine. shim (15.6 and later) passes MOKs on as trusted for the
    # kernel's own use unless MokListTrusted exists (`mokutil --untrust-mok` creates it), so it is
    # left unset, and the kernel puts the key in its .machine keyring.
    argv += ["--add-mok", owner, str(keys.require(keys.cert("module")))]
    tools.run([*argv, "--sb", "-o", str(out)], what="virt-fw-vars (enrolling the keys)")
    return out


def esp_image(efi: Path, binary: str, out: Path) -> Path:
    """A FAT disk image holding `efi` as EFI/BOOT/<binary>: how QEMU boots a lone UKI or EFI program."""
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    with out.open("wb") as image:
        image.truncate(ESP_SIZE)
    tools.run(["mkfs.fat", "-F", "32", "-n", "ESP", str(out)], env=env)
    tools.run(["mmd", "-i", str(out), "::/EFI", "::/EFI/BOOT"], env=env)
    tools.run(["mcopy", "-i", str(out), str(efi), f"::/EFI/BOOT/{binary}"], env=env)
    return out
