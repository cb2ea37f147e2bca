"""End-to-end: A/B slots under real GRUB (SeaBIOS and OVMF) and the real machined.

Nothing is stubbed: the disk is build_raw's, with conftest's real kernel and initramfs in
slot A; the test writes slot B and the boot state into BOOT's FAT with mtools, as an upgrade
would, boots it in QEMU (TCG) on a disk that keeps what GRUB and machined write between
boots, and reads the boot state back after each boot. A trial slot that panics costs one try
per boot and GRUB falls back to slot A once the tries run out; a trial slot that reaches
ready is made the default by machined once its health has held for the grace period, and one
that reaches ready but fails a health check its config names never is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kiln import __version__
from kiln.boot.qemu import READY, BootResult, Machine, boot
from kiln.image.assets import BootAssets
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.grub import environment_block
from tests.e2e.config_drive import config_drive

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
EPOCH = 1704067200
SIZE = 1 << 30
MTOOLS_ENV = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
# a machine config whose health check nothing on the machine answers (the discard port), and whose
# service cannot start (no such program), so it crash-loops
UNHEALTHY = {
    "health": {"checks": [{"tcp": "127.0.0.1:9"}]},
    "services": [{"name": "crashy", "command": "/usr/bin/no-such-program", "restart": "always"}],
}


class Disk:
    """A raw disk whose BOOT partition the test reads and writes with mtools."""

    def __init__(self, path: Path) -> None:
        self.path = path
        table = json.loads(subprocess.run(["sfdisk", "-J", str(path)], check=True, capture_output=True).stdout)
        boot_part = next(p for p in table["partitiontable"]["partitions"] if p.get("name") == "BOOT")
        self.target = f"{path}@@{boot_part['start'] * 512}"

    def read(self, name: str) -> bytes:
        return subprocess.run(
            ["mtype", "-i", self.target, f"::/{name}"], check=True, capture_output=True, env=MTOOLS_ENV
        ).stdout

    def write(self, name: str, data: bytes, scratch: Path) -> None:
        scratch.write_bytes(data)
        subprocess.run(["mcopy", "-o", "-i", self.target, str(scratch), f"::/{name}"], check=True, env=MTOOLS_ENV)

    def mkdir(self, name: str) -> None:
        subprocess.run(["mmd", "-i", self.target, f"::/{name}"], check=True, env=MTOOLS_ENV)

    def state(self) -> dict[str, str]:
        """The boot state's variables, as GRUB and machined left them."""
        text = self.read("grub/grubenv").decode()
        return dict(line.split("=", 1) for line in text.splitlines()[1:] if line and not line.startswith("#"))


def slot_b(disk: Disk, tmp_path: Path, *, initramfs: bytes, cmdline: str) -> None:
    """Slot B with slot A's kernel, the given initramfs and command line."""
    disk.mkdir("B")
    disk.write("B/vmlinuz", disk.read("A/vmlinuz"), tmp_path / "vmlinuz")
    disk.write("B/initramfs.zst", initramfs, tmp_path / "initramfs.zst")
    cfg = f"linux /B/vmlinuz {cmdline} kiln.slot=B\ninitrd /B/initramfs.zst\n"
    disk.write("B/boot.cfg", cfg.encode(), tmp_path / "boot.cfg")


def boot_disk(
    disk: Disk, firmware: str, expect: str, log: Path, *, network: bool = True, cdrom: Path | None = None
) -> BootResult:
    """Boot the disk itself (no snapshot: what GRUB and machined write stays), stop at `expect`."""
    machine = Machine(
        firmware=firmware, extra=["-drive", f"file={disk.path},format=raw,if=virtio"], network=network, cdrom=cdrom
    )
    result = boot(machine, expect, BOOT_TIMEOUT, log)
    assert result.ok, f"{firmware}: waiting for {expect!r}: {result.reason}; console:\n" + "\n".join(result.tail)
    return result


def booted_slot(log: Path) -> str:
    found = re.findall(r"Command line: .*kiln\.slot=([AB])", log.read_text(errors="replace"))
    assert found, "no kernel command line naming a slot on the console"
    return str(found[0])


@pytest.fixture
def disk(image_dir: Path, tmp_path: Path) -> Disk:
    assets = BootAssets.make(image_dir / "vmlinuz", image_dir / "initramfs.zst", "console=ttyS0", __version__, EPOCH)
    return Disk(build_raw(assets, tmp_path / "disk.raw", SIZE))


@pytest.mark.parametrize("firmware", ["bios", "uefi"])
def test_a_trial_slot_that_panics_falls_back_after_its_tries(disk: Disk, tmp_path: Path, firmware: str) -> None:
    slot_b(disk, tmp_path, initramfs=b"not an initramfs\n" * 64, cmdline="console=ttyS0 panic=1")
    disk.write(
        "grub/grubenv",
        environment_block({"kiln_default": "A", "kiln_next": "B", "kiln_tries": "2", "kiln_version_A": __version__}),
        tmp_path / "env",
    )
    for left in ("1", "0"):
        log = tmp_path / f"{firmware}-try-{left}.log"
        boot_disk(disk, firmware, "Kernel panic", log)
        assert booted_slot(log) == "B"
        assert disk.state()["kiln_tries"] == left
    log = tmp_path / f"{firmware}-fallback.log"
    boot_disk(disk, firmware, READY, log)
    assert booted_slot(log) == "A"
    state = disk.state()
    assert state["kiln_default"] == "A" and state["kiln_next"] == "" and state["kiln_rollback"] == "B"


def test_a_trial_slot_that_reaches_ready_becomes_the_default(disk: Disk, tmp_path: Path) -> None:
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline="console=ttyS0 panic=1 kiln.trial_grace=3")
    disk.write(
        "grub/grubenv",
        environment_block({"kiln_default": "A", "kiln_next": "B", "kiln_tries": "3", "kiln_version_A": "0.0.1"}),
        tmp_path / "env",
    )
    log = tmp_path / "trial.log"
    made_default = "boot: slot B stayed healthy for 3s and is the default now"
    boot_disk(disk, "bios", made_default, log)
    assert booted_slot(log) == "B"
    text = log.read_text(errors="replace")
    assert "boot: slot B on trial (2 tries left after this one)" in text
    # ready first, then the grace period of health, and only then the default
    assert text.index("boot: slot B becomes the default once healthy for 3s") < text.index(READY)
    assert text.index(READY) < text.index(made_default)
    state = disk.state()
    assert state["kiln_default"] == "B" and "kiln_next" not in state and "kiln_tries" not in state
    assert state["kiln_version_B"] == __version__ and state["kiln_version_A"] == "0.0.1"
    log = tmp_path / "after.log"
    boot_disk(disk, "bios", READY, log)
    assert booted_slot(log) == "B"
    assert "boot: slot B (default)" in log.read_text(errors="replace")


def test_a_trial_slot_that_cannot_be_reached_falls_back(disk: Disk, tmp_path: Path) -> None:
    """A trial slot that reaches the point of ready but has no address (the machine's NIC is gone) is
    not made the default: machined says why and reboots without the ready line, and with no tries
    left GRUB falls back to slot A, marking B rolled back."""
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline="console=ttyS0 kiln.trial_network_wait=3")
    disk.write(
        "grub/grubenv",
        environment_block({"kiln_default": "A", "kiln_next": "B", "kiln_tries": "1", "kiln_version_A": __version__}),
        tmp_path / "env",
    )
    log = tmp_path / "trial.log"
    boot_disk(disk, "bios", "rebooting for the next try", log, network=False)
    assert booted_slot(log) == "B"
    text = log.read_text(errors="replace")
    assert "boot: slot B is on trial and not healthy: no interface has an address after 3s" in text
    assert READY not in text and "is the default now" not in text
    assert disk.state()["kiln_default"] == "A"
    log = tmp_path / "fallback.log"
    boot_disk(disk, "bios", READY, log)
    assert booted_slot(log) == "A"
    state = disk.state()
    assert state["kiln_default"] == "A" and state["kiln_rollback"] == "B", state


def test_a_trial_slot_that_is_unhealthy_after_ready_falls_back(disk: Disk, tmp_path: Path) -> None:
    """A trial slot that reaches ready but whose config's health check never answers (a TCP port
    nothing listens on) and whose service crash-loops is not made the default: the trial's deadline
    reboots it, naming both, and with no tries left GRUB falls back to slot A, marking B rolled back."""
    cmdline = "console=ttyS0 panic=1 kiln.trial_grace=3 kiln.trial_timeout=30 kiln.trial_network_wait=10"
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline=cmdline)
    one_try_of_b(disk, tmp_path)
    drive = config_drive(tmp_path / "health.iso", {"kiln.json": json.dumps(UNHEALTHY).encode()})
    log = tmp_path / "trial.log"
    boot_disk(disk, "bios", "rebooting for the next try", log, cdrom=drive)
    assert booted_slot(log) == "B"
    text = log.read_text(errors="replace")
    assert READY in text and "is the default now" not in text
    verdict = re.search(r"boot: slot B is on trial and not healthy: (.*); rebooting for the next try", text)
    assert verdict, text
    # in backoff, or caught running between two crashes (health counts a restarted service only
    # once it has run steadily)
    assert re.search(r"service crashy is (backoff|restarting)", verdict[1])
    assert re.search(r"check tcp 127\.0\.0\.1:9: .*refused", verdict[1])
    assert disk.state()["kiln_default"] == "A"
    assert_falls_back_to_a(disk, tmp_path, cdrom=drive)


def test_a_trial_machined_that_dies_within_the_grace_period_is_a_failed_try(disk: Disk, tmp_path: Path) -> None:
    """machined on a trial slot reaches ready, then exits (kiln.test=crash: PID 1 gone, the kernel
    panics) before the grace period is over: the slot was never made the default, so the boot
    counts as a failed try and GRUB falls back to slot A."""
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline="console=ttyS0 panic=1 kiln.test=crash")
    one_try_of_b(disk, tmp_path)
    log = tmp_path / "trial.log"
    boot_disk(disk, "bios", "Kernel panic", log)
    assert booted_slot(log) == "B"
    text = log.read_text(errors="replace")
    assert text.index(READY) < text.index("test: machined exits after ready") and "is the default now" not in text
    state = disk.state()
    assert state["kiln_default"] == "A" and state["kiln_next"] == "B" and state["kiln_tries"] == "0", state
    assert_falls_back_to_a(disk, tmp_path)


def one_try_of_b(disk: Disk, tmp_path: Path) -> None:
    """The boot state of an upgrade to slot B with one try left."""
    disk.write(
        "grub/grubenv",
        environment_block({"kiln_default": "A", "kiln_next": "B", "kiln_tries": "1", "kiln_version_A": __version__}),
        tmp_path / "env",
    )


def assert_falls_back_to_a(disk: Disk, tmp_path: Path, *, cdrom: Path | None = None) -> None:
    """The next boot is slot A's, ready, with B marked rolled back."""
    log = tmp_path / "fallback.log"
    boot_disk(disk, "bios", READY, log, cdrom=cdrom)
    assert booted_slot(log) == "A"
    state = disk.state()
    assert state["kiln_default"] == "A" and state["kiln_rollback"] == "B", state


def test_a_default_slot_that_will_not_load_falls_back_to_the_other(disk: Disk, tmp_path: Path) -> None:
    """Slot B is the default but its kernel is gone (a damaged BOOT): GRUB's fallback entry boots
    slot A, which machined reports as the other slot, and nothing in the boot state changes."""
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline="console=ttyS0")
    subprocess.run(["mdel", "-i", disk.target, "::/B/vmlinuz"], check=True, env=MTOOLS_ENV)
    before = {"kiln_default": "B", "kiln_version_A": __version__, "kiln_version_B": __version__}
    disk.write("grub/grubenv", environment_block(before), tmp_path / "env")
    log = tmp_path / "fallback.log"
    boot_disk(disk, "bios", READY, log)
    assert booted_slot(log) == "A"
    assert "boot: slot A (other)" in log.read_text(errors="replace")
    assert disk.state() == before


def partition_debugfs(disk: Disk, name: str, *commands: str) -> str:
    """Run debugfs commands (writable) on the ext4 partition `name` through a loop device over its extent,
    after e2fsck has replayed its journal."""
    table = json.loads(subprocess.run(["sfdisk", "-J", str(disk.path)], check=True, capture_output=True).stdout)
    part = next(p for p in table["partitiontable"]["partitions"] if p.get("name") == name)
    device = subprocess.run(
        ["losetup", "--find", "--show", "--offset", str(part["start"] * 512), "--sizelimit", str(part["size"] * 512),
         str(disk.path)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        # QEMU was stopped at the ready line, so the journal may hold what machined wrote: replay it
        # (debugfs reads the filesystem as it is on disk)
        fsck = subprocess.run(["e2fsck", "-fp", device], capture_output=True, text=True)
        assert fsck.returncode <= 1, fsck.stdout + fsck.stderr  # 1: corrected (the journal replayed)
        out = []
        for command in commands:
            done = subprocess.run(["debugfs", "-w", "-R", command, device], capture_output=True, text=True, check=True)
            out.append(done.stdout)
        return "".join(out)
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


def test_a_trial_slot_that_cannot_parse_the_kept_config_falls_back(disk: Disk, tmp_path: Path) -> None:
    """The machine booted once from a config drive, so its config is kept on STATE. The trial slot's
    machined cannot parse that kept config (it holds a field this release does not know, as a config
    an older release wrote may): it says so and does not use defaults as if all were well. The trial
    is not healthy, so it reboots without the ready line and GRUB falls back to slot A, marking B
    rolled back; /var (EPHEMERAL) keeps what it held."""
    drive = config_drive(tmp_path / "kept.iso", {"kiln.json": json.dumps({"hostname": "kept-config"}).encode()})
    boot_disk(disk, "bios", READY, tmp_path / "first.log", cdrom=drive)
    kept = json.loads(partition_debugfs(disk, "STATE", "cat config.json"))
    assert kept["hostname"] == "kept-config", kept
    unknown = tmp_path / "config.json"
    unknown.write_text(json.dumps({**kept, "retired_setting": True}))
    unknown.chmod(0o600)
    marker = tmp_path / "marker"
    marker.write_text("var survives the trial\n")
    partition_debugfs(disk, "STATE", "rm config.json", f"write {unknown} config.json")
    partition_debugfs(disk, "EPHEMERAL", f"write {marker} trial-marker")
    assert "retired_setting" in partition_debugfs(disk, "STATE", "cat config.json")

    cmdline = "console=ttyS0 panic=1 kiln.trial_grace=3 kiln.trial_network_wait=10"
    slot_b(disk, tmp_path, initramfs=disk.read("A/initramfs.zst"), cmdline=cmdline)
    one_try_of_b(disk, tmp_path)
    log = tmp_path / "trial.log"
    boot_disk(disk, "bios", "rebooting for the next try", log)
    assert booted_slot(log) == "B"
    text = log.read_text(errors="replace")
    verdict = re.search(r"boot: slot B is on trial and not healthy: (.*); rebooting for the next try", text)
    assert verdict, text
    assert "its config could not be used (kept config: " in verdict[1] and "retired_setting" in verdict[1], verdict[1]
    assert READY not in text and "is the default now" not in text
    assert disk.state()["kiln_default"] == "A"
    assert_falls_back_to_a(disk, tmp_path)
    assert "var survives the trial" in partition_debugfs(disk, "EPHEMERAL", "cat trial-marker")
