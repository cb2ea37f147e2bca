"""End-to-end: a Secure Boot machine upgrades to a signed release, and refuses an unsigned one.

Versions 1 and 2 are Secure Boot installer releases (shim, GRUB and a signed UKI per slot) signed
with the test's keys; the machine config trusts only releases signed with their release key
(`release_keys`). The disk boots under OVMF's Secure Boot build with the keys enrolled. Version 2
pushed without a signature is refused before anything is unpacked and the machine keeps running;
pushed with `kiln release push --sign`, the upgrade writes slot B's signed UKI, and the machine
comes back on version 2, still with Secure Boot on. The registry, GRUB, shim and firmware are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.boot.qemu import READY
from kiln.signing.generate import generate
from tests.e2e.conftest import kiln
from tests.e2e.test_upgrade import (
    REPO,
    V1,
    V2,
    Session,
    World,
    api,
    boot_state,
    fresh_disk,
    no_qemu_left,  # noqa: F401 (an autouse fixture)
    ready_version,
    upgrade_world,
)

pytestmark = pytest.mark.e2e

SECURE = "machined: firmware: UEFI, Secure Boot on"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("keys") / "keys", common_name="Kiln upgrade e2e").root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, keys: Path) -> Iterator[World]:
    with upgrade_world(tmp_path_factory.mktemp("sb-upgrade"), keys) as built:
        yield built


def test_a_secure_boot_machine_takes_only_a_signed_release(world: World, keys: Path) -> None:
    disk = fresh_disk(world, "secure.raw")
    log = world.work / "v1.log"
    session = Session(disk, "uefi", log, secure_boot_keys=keys)
    session.wait_for(READY)
    assert SECURE in log.read_text(errors="replace")
    assert ready_version(log) == V1

    kiln("release", "push", str(world.v2.layout), "--to", f"{world.registry}/{REPO}", "--channel", "stable")
    status = session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V2}"})
    upgrade = status["upgrade"]
    assert isinstance(upgrade, dict) and upgrade["state"] == "failed", status
    assert "no signature for sha256:" in str(upgrade["error"]), upgrade
    assert status["version"] == V1 and session.thread.is_alive()

    push = ["release", "push", str(world.v2.layout), "--to", f"{world.registry}/{REPO}", "--channel", "stable"]
    kiln(*push, "--sign", str(keys))
    session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V2}"})
    # machined prints it before it installs; the console reaches the log through a thread: wait for it
    session.wait_for("machined: upgrade: signature of sha256:")
    assert session.end().exit_code == 0, "the upgrade did not end in a reboot"

    log2 = world.work / "v2.log"
    session = Session(disk, "uefi", log2, secure_boot_keys=keys)
    session.wait_for(READY)
    text = log2.read_text(errors="replace")
    assert ready_version(log2) == V2 and SECURE in text
    assert boot_state(session.status(world.pki))["slot"] == "B"
    assert api(session.port, world.pki, "POST", "/v1/poweroff")[0] == 202
    assert session.end().exit_code == 0
