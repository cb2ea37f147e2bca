"""Measured boot: the PCR 11 value a UKI produces, signed at build time (systemd-measure).

systemd's EFI stub extends TPM PCR 11 with each of the UKI's sections (name, then content) before
it starts the kernel, so PCR 11 names exactly which kernel, initramfs, command line and os-release
booted. `systemd-measure sign` predicts that value and signs the TPM2 policy that allows it
(PolicyPCR on PCR 11) with the user's PCR key; the UKI carries the signature (.pcrsig) and the
public key (.pcrpkey), so a disk secret sealed against that key (PolicyAuthorize) opens under any
UKI the user signed, and under nothing else.

systemd 252's systemd-measure computes the policy digest in a TPM (a trial session, nothing is
stored), so signing runs a throwaway software TPM (swtpm) for the few milliseconds it takes. The
digest and the RSA PKCS#1 v1.5 signature are deterministic: same sections, same key, same bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.core import tools
from kiln.core.errors import BuildError
from kiln.signing.keyset import PCR, KeySet

SYSTEMD_MEASURE = Path("/usr/lib/systemd/systemd-measure")
SWTPM_TCTI = Path("/usr/lib/x86_64-linux-gnu/libtss2-tcti-swtpm.so.0")
TSS_LIBRARIES = (
    (SWTPM_TCTI.name, "libtss2-tcti-swtpm0"),
    ("libtss2-esys.so.0", "libtss2-esys-3.0.2-0"),
    ("libtss2-rc.so.0", "libtss2-rc0"),
    ("libtss2-mu.so.0", "libtss2-mu0"),
)
PCR_INDEX = 11
TPM_CC_POLICY_PCR = 0x0000017F
TPM_ALG_SHA256 = 0x000B
# the sections systemd-stub measures, in the order it measures them (what systemd-measure takes)
MEASURED = (".linux", ".osrel", ".cmdline", ".initrd", ".pcrpkey")
START_TIMEOUT = 10.0


def check_tools() -> None:
    """Say what to install when signing PCR policies cannot run here."""
    if not SYSTEMD_MEASURE.exists():
        raise BuildError(f"measured boot needs {SYSTEMD_MEASURE}: apt install systemd")
    if shutil.which("swtpm") is None:
        raise BuildError("measured boot needs swtpm (systemd-measure computes the policy in a TPM): apt install swtpm")
    # systemd-measure dlopens these; without one it fails with no word on stderr
    for library, package in TSS_LIBRARIES:
        if not (SWTPM_TCTI.parent / library).exists():
            raise BuildError(f"measured boot needs {library}: apt install {package}")


def sign_policy(sections: dict[str, Path], keys: KeySet) -> bytes:
    """The .pcrsig section (systemd's JSON) for a UKI made of `sections` (.linux, .osrel, .cmdline,
    .initrd and .pcrpkey, the PCR key's public half)."""
    check_tools()
    key, public = keys.require(keys.key(PCR), private=True), keys.require(keys.pcr_public)
    argv = [str(SYSTEMD_MEASURE), "sign", "--bank=sha256", "--phase=", f"--private-key={key}"]
    argv += [f"--public-key={public}", *(f"--{name.lstrip('.')}={sections[name]}" for name in MEASURED)]
    with tempfile.TemporaryDirectory(prefix="kiln-swtpm-") as tmp, software_tpm(Path(tmp), started=True) as sockets:
        result = tools.run([*argv, f"--tpm2-device=swtpm:path={sockets}"], what="systemd-measure sign")
    return result.stdout.strip() + b"\n"


@contextmanager
def software_tpm(state: Path, *, started: bool = False) -> Iterator[Path]:
    """A swtpm with its state in `state`; yields the path P of its sockets, stops it on exit.

    Its control socket is `P.ctrl`: what a QEMU TPM device connects to (it passes the data channel
    over it and powers the TPM on itself, as a machine's firmware does). `started`: it also serves
    commands on P with the TPM already started, for a TSS client (systemd-measure's
    `--tpm2-device=swtpm:path=P`, which finds the control socket at P.ctrl). `state` is made
    absolute: swtpm works from /.
    """
    state = state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    sockets = state / "tpm"
    ctrl = Path(f"{sockets}.ctrl")
    argv = ["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={state}", "--ctrl", f"type=unixio,path={ctrl}"]
    if started:
        argv += ["--server", f"type=unixio,path={sockets}", "--flags", "not-need-init,startup-clear"]
    waits = [ctrl, sockets] if started else [ctrl]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(path.exists() for path in waits):
            if process.poll() is not None or time.monotonic() > deadline:
                ended = process.poll() is not None and process.stderr is not None
                error = process.stderr.read().decode(errors="replace").strip() if ended and process.stderr else ""
                raise BuildError(f"swtpm did not start{': ' + error if error else ''}")
            time.sleep(0.01)
        yield sockets
    finally:
        process.terminate()
        process.communicate(timeout=START_TIMEOUT)


def policy_digest(pcr_value: bytes) -> bytes:
    """The TPM2 PolicyPCR digest allowing PCR 11 (sha256 bank) to hold `pcr_value`: what the
    "pol" field of .pcrsig names, computed here to check a measured value against it."""
    select = bytearray(3)
    select[PCR_INDEX // 8] |= 1 << (PCR_INDEX % 8)
    selection = struct.pack(">IHB", 1, TPM_ALG_SHA256, 3) + bytes(select)
    update = bytes(32) + struct.pack(">I", TPM_CC_POLICY_PCR) + selection + hashlib.sha256(pcr_value).digest()
    return hashlib.sha256(update).digest()
