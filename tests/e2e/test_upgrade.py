"""End-to-end: upgrades through the installer image, from a real registry, under real GRUB.

Nothing is stubbed. Version 1 is the installer profile built through the graph (`kiln image`),
its disk image written onto a disk file by the same `machined install` that `kiln install`
runs; version 2 is the same profile built with `--set kiln_version=0.2.0`, so its machined,
init and rootfs are rebuilt; both are pushed with `kiln release push` to Debian's
docker-registry on the host, which the guest reaches through QEMU's user network. Version 3 is
deliberately broken: version 2's kernel with an initramfs the kernel cannot unpack, so every
boot of it panics (and `panic=1` reboots); version 0.2.5 is version 2 with its installer cut
short, so the upgrade to it fails after the services are stopped and the disk is released. The
machine takes its config (API certificates, the registries it may reach over plain http) from a
URL pinned by its sha256.

Each QEMU run is one boot (`-no-reboot`: a reboot ends QEMU), on a disk that keeps what GRUB
and machined write; between runs the test reads the disk (the boot state with mtools, the
/var marker with debugfs).

A power cut is QEMU killed with SIGKILL while machined or its installer waits at a chosen step of
an upgrade (kiln.test=pause:STEP, machined's hook for this test and nothing else).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import http.server
import json
import math
import os
import shutil
import signal
import ssl
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from kiln import __version__
from kiln.boot.qemu import READY, BootResult, Machine, boot
from kiln.image.assets import BootAssets
from kiln.image.outputs.installer import build_installer
from tests.e2e.conftest import kiln
from tests.e2e.test_slots import Disk, booted_slot
from tests.e2e.test_system import GUEST_HOST, console, free_port, make_ca, make_cert
from tests.integration import services

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 300.0
V1, V2, V3 = __version__, "0.2.0", "0.3.0"
V_CUT = "0.2.5"  # a release whose installer is cut short
LIVE: list[Session] = []  # the sessions started by the running test
REPO = "kiln/installer"
DISK_SIZE = 2 << 30
MARKER = b"kept across upgrades\n"
MADE_DEFAULT = "and is the default now"  # machined's line once a trial slot has stayed healthy


@dataclass
class Release:
    layout: Path  # the installer's OCI layout
    disk_gz: Path  # /usr/share/kiln/disk.raw.gz in it


@dataclass
class World:
    work: Path
    pki: Path
    registry: str  # host:port of the real registry, as the host reaches it
    guest_registry: str  # the same, as the guest reaches it
    corrupt_registry: str  # a proxy that flips a byte of the boot layer, as the guest reaches it
    v1: Release
    v2: Release


def installer_profile(directory: Path, config_url: str, keys: Path | None = None) -> None:
    """The shipped installer profile with the test's kernel arguments (the config URL, panic=1, a
    trial slot the default after 2 s of health instead of 60); with `keys`, a Secure Boot one signed
    with them.

    It names no version: each release's version (release.json, the annotations, the menu) is its
    machined package's, which `--set kiln_version=` moves together with machined's ready line."""
    directory.mkdir(parents=True, exist_ok=True)
    secure = f"keys: {{path: {keys}}}\nsecureboot: true\n" if keys else ""
    (directory / "upgrade.yaml").write_text(
        secure + "platform: metal\n"
        "customization:\n"
        '  kernel_args: ["console=ttyS0", "panic=1", "kiln.trial_timeout=120", "kiln.trial_grace=2",'
        f' "kiln.config={config_url}"]\n'
        "output:\n"
        "  kind: installer\n"
        "  image:\n"
        "    disk_size: 1GiB\n"
    )


def build_release(profiles: Path, out: Path, *extra: str) -> Release:
    kiln("image", "upgrade", "--profiles-dir", str(profiles), "--out", str(out), *extra, timeout=5400)
    # installer-amd64/ (installer-amd64-secureboot/ for a Secure Boot profile): the OCI layout beside its .tar
    layouts = [p for p in (out / "upgrade").iterdir() if (p / "oci-layout").is_file()]
    assert len(layouts) == 1, f"expected one installer layout in {out / 'upgrade'}, got {layouts}"
    layout = layouts[0]
    assert layout.name.startswith("installer-amd64") and (layout / "index.json").is_file()
    return Release(layout, extract_disk(layout, out / "disk.raw.gz"))


def extract_disk(layout: Path, dest: Path) -> Path:
    """The disk image member of the layout's disk layer."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob_path(layout, index["manifests"][0]["digest"]).read_bytes())
    [disk_layer] = [x for x in manifest["layers"] if x["annotations"]["dev.kiln.layer"] == "disk"]
    with gzip.open(blob_path(layout, disk_layer["digest"])) as stream, tarfile.open(fileobj=stream) as tar:
        member = tar.extractfile("usr/share/kiln/disk.raw.gz")
        assert member is not None
        with dest.open("wb") as out:
            shutil.copyfileobj(member, out)
    return dest


def blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def release_files(v2: Release) -> dict[str, bytes]:
    """The kernel, boot and installer layers' files of release 2, by path."""
    index = json.loads((v2.layout / "index.json").read_text())
    manifest = json.loads(blob_path(v2.layout, index["manifests"][0]["digest"]).read_bytes())
    files: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        if layer["annotations"]["dev.kiln.layer"] in ("kernel", "boot", "installer"):
            with gzip.open(blob_path(v2.layout, layer["digest"])) as stream, tarfile.open(fileobj=stream) as tar:
                for member in tar.getmembers():
                    extracted = tar.extractfile(member) if member.isfile() else None
                    if extracted is not None:
                        files[member.name] = extracted.read()
    return files


def derived_release(
    v2: Release, work: Path, version: str, *, initramfs: bytes | None = None, installer: bytes | None = None
) -> Path:
    """Release 2 as `version`, with its initramfs or its installer replaced."""
    files = release_files(v2)
    release = json.loads(files["usr/share/kiln/release.json"])
    work.mkdir(parents=True, exist_ok=True)
    (work / "vmlinuz").write_bytes(files["usr/share/kiln/vmlinuz"])
    (work / "initramfs.zst").write_bytes(initramfs if initramfs is not None else files["usr/share/kiln/initramfs.zst"])
    (work / "installer").write_bytes(installer if installer is not None else files["usr/bin/installer"])
    (work / "disk.raw").write_bytes(b"\0" * 4096)  # a fresh install is not what this release is for
    assets = BootAssets.make(work / "vmlinuz", work / "initramfs.zst", release["cmdline"], version, 1704067200)
    layout, _ = build_installer(assets, work / "disk.raw", work / "installer", work / "out", "derived")
    return layout


def broken_release(v2: Release, work: Path) -> Path:
    """Version 3: version 2's kernel with an initramfs no kernel can unpack (it panics, panic=1 reboots)."""
    return derived_release(v2, work, V3, initramfs=b"not an initramfs\n" * 64)


def cut_installer_release(v2: Release, work: Path) -> Path:
    """Version V_CUT: release 2 whose installer is its first 64 KiB (the ELF header says amd64, so
    the release is built and pulled as any other; exec'd, it cannot run)."""
    return derived_release(v2, work, V_CUT, installer=release_files(v2)["usr/bin/installer"][: 64 << 10])


def push(layout: Path, registry: str, channel: str) -> None:
    kiln("release", "push", str(layout), "--to", f"{registry}/{REPO}", "--channel", channel)


class CorruptingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the real registry but flips one byte of every blob bigger than 1 MiB."""

    upstream = ""

    def do_GET(self) -> None:
        answer = requests.get(
            f"http://{self.upstream}{self.path}",
            headers={"Accept": ", ".join(self.headers.get_all("Accept") or [])},
            timeout=60,
        )
        body = answer.content
        if "/blobs/" in self.path and len(body) > 1 << 20:
            body = body[:1000] + bytes([body[1000] ^ 0xFF]) + body[1001:]
        self.send_response(answer.status_code)
        for key in ("Content-Type", "Docker-Content-Digest"):
            if key in answer.headers:
                self.send_header(key, answer.headers[key])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


@contextlib.contextmanager
def upgrade_world(work: Path, keys: Path | None = None) -> Iterator[World]:
    """Versions 1 and 2 built, a registry, a corrupting proxy and the config server (bench/upgrade.py too).

    With `keys` (a key directory), both versions are Secure Boot releases signed with them and the
    machine config trusts only releases signed with their image release key (release_keys)."""
    if shutil.which("debugfs") is None or shutil.which("mcopy") is None:
        services.unavailable("debugfs and mtools", "apt-get install e2fsprogs mtools")
    pki = work / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_cert(pki, "ca", "machine", "subjectAltName=IP:127.0.0.1,IP:10.0.2.15")
    for role in ("admin", "operator", "reader"):
        make_cert(pki, "ca", role, "extendedKeyUsage=clientAuth", role=role)
    stack = contextlib.ExitStack()
    registry, _ = stack.enter_context(contextlib.contextmanager(services.registry)())
    port = registry.rsplit(":", 1)[1]
    CorruptingProxy.upstream = registry
    proxy, proxy_port = serve(CorruptingProxy)
    guest_registry, corrupt = f"{GUEST_HOST}:{port}", f"{GUEST_HOST}:{proxy_port}"
    config = json.dumps(
        {
            "hostname": "e2e-upgrade",
            "api": {
                k: (pki / f).read_text() for k, f in (("ca", "ca.crt"), ("cert", "machine.crt"), ("key", "machine.key"))
            },
            "registries": [{"host": guest_registry, "insecure": True}, {"host": corrupt, "insecure": True}],
        }
        # without release keys, upgrades are refused unless the config allows unsigned ones by name
        | ({"release_keys": [(keys / "release-image.pub").read_text()]} if keys else {"allow_unsigned": True})
    ).encode()

    class Config(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/kiln.json" else 404)
            self.send_header("Content-Length", str(len(config)))
            self.end_headers()
            self.wfile.write(config)

        def log_message(self, format: str, *args: object) -> None:
            pass

    config_server, config_port = serve(Config)
    url = f"http://{GUEST_HOST}:{config_port}/kiln.json#sha256={hashlib.sha256(config).hexdigest()}"
    try:
        installer_profile(work / "profiles", url, keys)
        v1 = build_release(work / "profiles", work / "v1")
        v2 = build_release(work / "profiles", work / "v2", "--set", f"kiln_version={V2}")
        yield World(work, pki, registry, guest_registry, corrupt, v1, v2)
    finally:
        for server in (proxy, config_server):
            server.shutdown()
            server.server_close()
        stack.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with upgrade_world(tmp_path_factory.mktemp("upgrade")) as built:
        yield built


def api(
    port: int, pki: Path, method: str, path: str, body: object = None, cert: str = "admin"
) -> tuple[int, dict[str, object]]:
    """One request as the client `cert` (admin, operator or reader: the role is in its Organization)."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.fixture(autouse=True)
def no_qemu_left() -> Iterator[None]:
    """A failed test leaves no guest running (and holding its disk) behind it."""
    yield
    while LIVE:
        LIVE.pop().kill()


class Session:
    """One boot of the disk in QEMU, in a thread, until the guest powers off or reboots."""

    def __init__(
        self, disk: Path, firmware: str, log: Path, expect: str = READY, secure_boot_keys: Path | None = None
    ) -> None:
        self.port = free_port()
        self.log = log
        self.pidfile = log.with_suffix(".pid")
        self.pidfile.unlink(missing_ok=True)
        drive = ["-drive", f"file={disk},format=raw,if=virtio"]
        machine = Machine(firmware=firmware, extra=[*drive, "-pidfile", str(self.pidfile)])
        machine.api_port = self.port
        machine.secure_boot_keys = secure_boot_keys
        self.results: list[BootResult] = []
        self.thread = threading.Thread(
            # until the guest stops QEMU or the test ends the session (kill): a trial boot runs on
            # past ready for its grace period, so BOOT_TIMEOUT from the start is no bound for it
            target=lambda: self.results.append(
                boot(machine, expect, BOOT_TIMEOUT, log, until_exit=True, exit_timeout=math.inf)
            ),
            daemon=True,
        )
        self.thread.start()
        LIVE.append(self)

    def kill(self) -> None:
        """Stop a QEMU the test gave up on (an assertion failed mid-boot), through QEMU's own pidfile."""
        if self.thread.is_alive() and self.pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(self.pidfile.read_text()), signal.SIGTERM)
        self.thread.join(10)

    def cut_power(self) -> None:
        """SIGKILL QEMU: the guest gets no word, and what it had not written to its disk is lost."""
        assert self.thread.is_alive(), "QEMU ended before the power cut"
        os.kill(int(self.pidfile.read_text()), signal.SIGKILL)
        self.thread.join(30)
        assert not self.thread.is_alive(), "QEMU outlived SIGKILL"

    def wait_for(self, text: str, timeout: float = BOOT_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.exists() and text in self.log.read_text(errors="replace"):
                return
            if not self.thread.is_alive():
                break
            time.sleep(0.5)
        shown = "\n".join(console(self.log)[-60:]) if self.log.exists() else "(no console log)"
        raise AssertionError(f"no {text!r} on the console:\n{shown}")

    def status(self, pki: Path) -> dict[str, object]:
        code, answer = api(self.port, pki, "GET", "/v1/status")
        assert code == 200, answer
        return answer

    def upgrade(self, pki: Path, request: dict[str, object]) -> dict[str, object]:
        """POST /v1/upgrade, then poll the status until the upgrade failed or is rebooting, or QEMU ended.

        An API that does not answer while QEMU runs is asked again: on a loaded host a slow answer
        looks like a refused one, and a machine on its way to reboot ends QEMU (-no-reboot) soon."""
        code, answer = api(self.port, pki, "POST", "/v1/upgrade", request)
        assert code == 202, answer
        last: dict[str, object] = {}
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline and self.thread.is_alive():
            try:
                last = self.status(pki)
            except (OSError, http.client.HTTPException):
                time.sleep(0.5)  # rebooting (QEMU ends, the loop with it) or slow: ask again
                continue
            upgrade = last.get("upgrade") or {}
            assert isinstance(upgrade, dict)
            if upgrade.get("state") in ("failed", "rebooting"):
                break
            time.sleep(0.5)
        return last

    def end(self) -> BootResult:
        self.thread.join(BOOT_TIMEOUT)
        assert self.results, "QEMU did not stop"
        return self.results[0]


def ready_version(log: Path) -> str:
    lines = [line for line in console(log) if line.startswith(READY)]
    assert lines, "no ready line"
    return lines[-1].split("version=", 1)[1].split()[0]


def fresh_disk(world: World, name: str) -> Path:
    """A disk file holding version 1, written by `machined install` as `kiln install --image` does."""
    from kiln.installer.install import install_disk
    from tests.integration.test_installer import build_machined

    disk = world.work / name
    with disk.open("wb") as out:
        out.truncate(DISK_SIZE)
    install_disk(build_machined(world.work), world.v1.disk_gz, disk, wipe=False)
    return disk


def ephemeral(disk: Path) -> tuple[int, int]:
    table = json.loads(subprocess.run(["sfdisk", "-J", str(disk)], check=True, capture_output=True).stdout)
    part = next(p for p in table["partitiontable"]["partitions"] if p.get("name") == "EPHEMERAL")
    return part["start"] * 512, part["size"] * 512


def debugfs(disk: Path, command: str, *, write: bool = False) -> str:
    """Run one debugfs command on EPHEMERAL through a loop device over its extent."""
    offset, size = ephemeral(disk)
    device = subprocess.run(
        ["losetup", "--find", "--show", "--offset", str(offset), "--sizelimit", str(size), str(disk)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        args = ["debugfs", *(["-w"] if write else []), "-R", command, device]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


def first_boot(world: World, disk: Path, firmware: str) -> None:
    """Version 1's first boot makes STATE and EPHEMERAL; it powers off cleanly, then a marker goes on /var."""
    session = Session(disk, firmware, world.work / f"{disk.name}-first.log")
    session.wait_for(READY)
    assert api(session.port, world.pki, "POST", "/v1/poweroff")[0] == 202
    assert session.end().exit_code == 0
    marker = world.work / "marker"
    marker.write_bytes(MARKER)
    debugfs(disk, f"write {marker} marker", write=True)


def boot_and(world: World, disk: Path, firmware: str, name: str, *, trial: bool = False) -> Session:
    """Boot the disk to ready; a trial boot on until its slot has stayed healthy and is the default."""
    session = Session(disk, firmware, world.work / f"{disk.name}-{name}.log")
    session.wait_for(READY)
    if trial:
        session.wait_for(MADE_DEFAULT)
    return session


def observed_boot_state(session: Session, world: World) -> dict[str, object]:
    """The boot/state resource (`kiln node get bootstate`) once it shows this boot made its slot the
    default: machined observes the slots every 2 s."""
    deadline = time.monotonic() + 30
    while True:
        code, answer = api(session.port, world.pki, "GET", "/v1/resources?type=bootstate")
        assert code == 200, answer
        resources = answer["resources"]
        assert isinstance(resources, list) and len(resources) == 1, answer
        spec: dict[str, object] = resources[0]["spec"]
        if spec["booted_as"] == "default" or time.monotonic() > deadline:
            return spec
        time.sleep(1)


def boot_state(status: dict[str, object]) -> dict[str, object]:
    state = status["boot"]
    assert isinstance(state, dict), status
    return state


def test_upgrade_rollback_and_refusals_under_bios(world: World) -> None:
    """1 -> 2 (a wrong digest refused first), rollback 2 -> 1, 1 -> 2 by channel, then a broken 3 that
    falls back to 2 by itself; /var's marker survives all of it."""
    push(world.v2.layout, world.registry, "stable")
    push(broken_release(world.v2, world.work / "v3"), world.registry, "alpha")
    disk = fresh_disk(world, "bios.raw")
    first_boot(world, disk, "bios")

    # on version 1: a registry that serves a corrupted blob is refused, and the machine runs on
    session = boot_and(world, disk, "bios", "v1")
    status = session.upgrade(world.pki, {"image": f"{world.corrupt_registry}/{REPO}:{V2}"})
    upgrade = status["upgrade"]
    assert isinstance(upgrade, dict) and upgrade["state"] == "failed", status
    assert "digest mismatch" in str(upgrade["error"]), upgrade
    assert status["version"] == V1 and session.thread.is_alive()
    services_now = status["services"]
    assert isinstance(services_now, list) and all(x["state"] != "stopped" for x in services_now), services_now
    # an installer that cannot run fails once the services are stopped and the disk released:
    # the controllers mount /var and STATE again and start the services again, on version 1
    push(cut_installer_release(world.v2, world.work / "cut"), world.registry, "beta")
    status = session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V_CUT}"})
    upgrade = status["upgrade"]
    assert isinstance(upgrade, dict) and upgrade["state"] == "failed" and "installer" in str(upgrade["error"]), upgrade
    session.wait_for("machined: services: started again", timeout=60)
    said = session.log.read_text(errors="replace")
    stopped = said.index("services: stopping them all, as an upgrade installing slot B")
    mounted = said.index("disk: /var and STATE are mounted again")
    assert stopped < mounted < said.index("services: started again") and "disk: mounting" not in said, said[stopped:]
    status = session.status(world.pki)
    services_now = status["services"]
    assert isinstance(services_now, list) and all(x["state"] != "stopped" for x in services_now), services_now
    assert status["version"] == V1 and Disk(disk).state()["kiln_default"] == "A"
    session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V2}"})
    assert session.end().exit_code == 0, "the upgrade did not end in a reboot"
    assert "upgrade: slot B holds 0.2.0 and is on trial; rebooting" in session.log.read_text(errors="replace")
    state = Disk(disk).state()
    assert state["kiln_next"] == "B" and state["kiln_tries"] == "3" and state["kiln_version_B"] == V2

    session = boot_and(world, disk, "bios", "v2", trial=True)
    assert ready_version(session.log) == V2
    status = session.status(world.pki)
    slots = boot_state(status)
    assert status["version"] == V2 and slots["slot"] == "B" and slots["booted_as"] == "default", slots
    assert slots["previous_slot"] == "A" and slots["previous_version"] == V1
    assert Disk(disk).state()["kiln_default"] == "B"
    assert observed_boot_state(session, world)["booted_as"] == "default"
    # a rollback request from 2 returns to 1: an operator's (a reader may not)
    assert api(session.port, world.pki, "POST", "/v1/rollback", cert="reader")[0] == 403
    code, answer = api(session.port, world.pki, "POST", "/v1/rollback", cert="operator")
    assert code == 202 and answer["slot"] == "A", answer
    assert session.end().exit_code == 0
    state = Disk(disk).state()  # A is on trial: should it fail, GRUB returns to B
    assert state["kiln_default"] == "B" and state["kiln_next"] == "A" and state["kiln_tries"] == "3", state
    session = boot_and(world, disk, "bios", "rolled-back", trial=True)
    assert ready_version(session.log) == V1
    assert "boot: slot A stayed healthy for 2s and is the default now" in session.log.read_text(errors="replace")

    # the stable channel: 0.3.0 is alpha, so 0.2.0 is the one
    session.upgrade(world.pki, {"channel": "stable", "repository": f"{world.guest_registry}/{REPO}"})
    assert session.end().exit_code == 0
    assert f"upgrade: channel stable of {world.guest_registry}/{REPO}: {V2}" in session.log.read_text(errors="replace")
    session = boot_and(world, disk, "bios", "v2-again", trial=True)
    assert ready_version(session.log) == V2

    # version 3 never reaches ready: GRUB gives it three tries, then boots slot B again
    session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V3}"})
    assert session.end().exit_code == 0
    for attempt in range(3):
        log = world.work / f"bios-v3-{attempt}.log"
        machine = Machine(firmware="bios", extra=["-drive", f"file={disk},format=raw,if=virtio"])
        result = boot(machine, "Kernel panic", BOOT_TIMEOUT, log)
        assert result.ok, f"try {attempt}: {result.reason}\n" + "\n".join(result.tail)
    session = boot_and(world, disk, "bios", "fallback")
    assert ready_version(session.log) == V2
    slots = boot_state(session.status(world.pki))
    assert slots["slot"] == "B" and slots["rolled_back"] is True and slots["rolled_back_version"] == V3, slots
    # slot A now holds the release that failed: rolling back to it is refused
    code, answer = api(session.port, world.pki, "POST", "/v1/rollback")
    assert code == 409 and "did not reach ready" in str(answer["error"]), answer
    assert api(session.port, world.pki, "POST", "/v1/poweroff")[0] == 202
    session.end()
    assert MARKER.decode() in debugfs(disk, "cat marker"), "/var lost its marker"


# Where the power-cut test stops an upgrade (kiln.test=pause:STEP) and cuts the power: after the
# pull (nothing on BOOT yet), amid the new slot's files, after its boot.cfg, after the boot state.
CUTS = ("pulled", "wrote-B/vmlinuz", "wrote-B/boot.cfg", "wrote-the-boot-state")


def test_a_power_cut_at_each_step_of_an_upgrade_leaves_a_machine_that_boots(world: World) -> None:
    """An upgrade 1 -> 2 is stopped at each step in turn (machined and its installer pause there,
    kiln.test=pause:STEP on slot A's command line) and QEMU is killed (SIGKILL: a power cut, with
    whatever the guest had not written lost). Until the boot state is written, the next boot is
    version 1 from slot A, with nothing on trial; after it, version 2 boots on trial and becomes
    the default. /var's marker survives all of them."""
    push(world.v2.layout, world.registry, "stable")
    disk = fresh_disk(world, "powercut.raw")
    first_boot(world, disk, "bios")  # STATE and EPHEMERAL made, powered off cleanly, the marker on /var
    slots = Disk(disk)
    original = slots.read("A/boot.cfg").decode()
    assert original.count("kiln.slot=A") == 1, original
    for step in CUTS:
        cmdline = original.replace("kiln.slot=A", f"kiln.test=pause:{step} kiln.slot=A")
        slots.write("A/boot.cfg", cmdline.encode(), world.work / "powercut-boot.cfg")
        session = boot_and(world, disk, "bios", "cut-" + step.replace("/", "-"))
        assert ready_version(session.log) == V1 and booted_slot(session.log) == "A"
        code, answer = api(
            session.port, world.pki, "POST", "/v1/upgrade", {"image": f"{world.guest_registry}/{REPO}:{V2}"}
        )
        assert code == 202, answer
        session.wait_for(f"test: paused after {step.replace('-', ' ')}, for a power cut")
        session.cut_power()
        state = slots.state()
        if step != "wrote-the-boot-state":
            assert state["kiln_default"] == "A" and not state.get("kiln_next"), (step, state)
        else:
            assert state["kiln_next"] == "B" and state["kiln_version_B"] == V2, state
    session = boot_and(world, disk, "bios", "after-the-cuts", trial=True)
    assert ready_version(session.log) == V2 and booted_slot(session.log) == "B"
    assert slots.state()["kiln_default"] == "B"
    assert api(session.port, world.pki, "POST", "/v1/poweroff")[0] == 202
    session.end()
    assert MARKER.decode() in debugfs(disk, "cat marker"), "/var lost its marker"


LIVE_ADDRESS = "10.0.2.88/24"
# a service the booted config does not have, started by the services controller once applied
LIVE_SERVICE = {"name": "probe", "command": "/usr/sbin/blkid", "type": "oneshot", "restart": "never"}


def apply_config_live(world: World, session: Session) -> None:
    """`kiln node apply-config` on a running machine: eth0 keeps its DHCP lease (the way in for the API)
    and takes a static address too, live, and a new service runs; `kiln node get` and the status read
    them back. The machine's
    config comes from kiln.config=, so a staged config is refused and what waits for a boot is not kept.
    The config keeps what the upgrade after it needs (its registries, allow_unsigned)."""
    config = world.work / "live.json"
    registries = [{"host": world.guest_registry, "insecure": True}, {"host": world.corrupt_registry, "insecure": True}]
    document = {
        "hostname": "e2e-upgrade",
        "network": {"interfaces": [{"name": "eth0", "addresses": [LIVE_ADDRESS], "dhcp": True}]},
        "registries": registries,
        "allow_unsigned": True,
        "services": [LIVE_SERVICE],
    }
    config.write_text(json.dumps(document))
    pki = world.pki
    nodes = ["--nodes", f"127.0.0.1:{session.port}", "--ca", str(pki / "ca.crt")]
    nodes += ["--cert", str(pki / "admin.crt"), "--key", str(pki / "admin.key")]
    report = json.loads(kiln("node", "apply-config", str(config), "--json", *nodes).stdout)
    results = {s["section"]: s["result"] for s in report["sections"]}
    assert results["network"] == "applied" and results["hostname"] == "unchanged", report
    assert results["services"] == "applied", report
    assert results["api"] == "not applied", report  # the next boot reads kiln.config= again
    deadline = time.monotonic() + 60
    while True:  # network/status reaches the answer's config version once the network is applied
        listed = json.loads(kiln("node", "get", "network/status", "applied", "-o", "json", *nodes).stdout)
        if listed[0]["resources"][0]["spec"]["config_version"] >= report["config_version"]:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(1)
    machine_config = json.loads(kiln("node", "get", "config/machine", "-o", "json", *nodes).stdout)
    assert machine_config[0]["resources"][0]["spec"]["network"]["interfaces"][0]["addresses"] == [LIVE_ADDRESS]
    status = json.loads(kiln("node", "status", "--json", *nodes).stdout)[0]["status"]
    assert LIVE_ADDRESS in status["addresses"]["eth0"], status["addresses"]
    deadline = time.monotonic() + 30
    while True:  # and as a network/address resource, observed from the kernel within seconds
        listed = json.loads(kiln("node", "get", "addresses", "-o", "json", *nodes).stdout)
        if f"eth0/{LIVE_ADDRESS}" in {r["id"] for r in listed[0]["resources"]}:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(1)
    session.wait_for(f"machined: network: eth0: {LIVE_ADDRESS} (static)", timeout=30)
    session.wait_for("machined: services: started probe", timeout=30)
    deadline = time.monotonic() + 30
    while True:  # the service ran, as its service/status resource says
        listed = json.loads(kiln("node", "get", "services", "-o", "json", *nodes).stdout)
        probe = {r["id"]: r["spec"] for r in listed[0]["resources"]}.get("probe")
        if probe and probe["state"] == "exited" and probe["source"] == "machine config":
            break
        assert time.monotonic() < deadline, listed
        time.sleep(1)
    code, answer = api(session.port, pki, "POST", "/v1/config?mode=staged", document)
    assert code == 409 and "kiln.config=" in str(answer["error"]), answer


def test_upgrade_under_uefi_keeps_var(world: World) -> None:
    """1 -> 2 by image reference under OVMF; /var's marker is still there on version 2. Before the
    upgrade, version 1 takes a static address live from a config applied over the API."""
    push(world.v2.layout, world.registry, "stable")
    disk = fresh_disk(world, "uefi.raw")
    first_boot(world, disk, "uefi")
    session = boot_and(world, disk, "uefi", "v1")
    apply_config_live(world, session)
    status = session.upgrade(world.pki, {"image": f"{world.guest_registry}/{REPO}:{V2}"})
    assert session.end().exit_code == 0, status
    session = boot_and(world, disk, "uefi", "v2", trial=True)
    assert ready_version(session.log) == V2
    status = session.status(world.pki)
    assert status["version"] == V2
    assert api(session.port, world.pki, "POST", "/v1/poweroff")[0] == 202
    session.end()
    assert MARKER.decode() in debugfs(disk, "cat marker"), "/var lost its marker"
