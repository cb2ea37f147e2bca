"""End-to-end: the real Kiln kernel + initramfs boot in QEMU (TCG) and behave as a machine.

Nothing here is stubbed. The images are the real ones built through the graph (conftest's
`image_dir`, and the same image plus the `e2e-probe` extension from tests/fixtures/e2e-probe);
machined partitions a real qcow2 disk, which the host then reads with qemu-img, sfdisk and
blkid; the API is real mutual TLS with certificates made by openssl. The probe service writes
to the console itself, since a Kiln machine has no shell to ask. Six boots in all, about
10-30 s each under TCG; each waits at most BOOT_TIMEOUT.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import http.server
import json
import os
import re
import resource
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kiln import __version__
from kiln.boot.qemu import READY, BootResult, Machine, boot, machine_for
from kiln.rootfs.archive import cpio_newc
from tests.e2e.config_drive import config_drive
from tests.e2e.conftest import KILN, ROOT, kiln

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 120.0
FIXTURES = ROOT / "tests" / "fixtures"
READY_RE = re.compile(
    r"machined ready: version=(?P<version>\S+) kernel=(?P<kernel>\S+) "
    r"extensions=\[(?P<extensions>[^\]]*)\] var=(?P<var>\S+) platform=(?P<platform>\S+)$"
)
GUEST_HOST = "10.0.2.2"  # the host as QEMU's user network shows it to the guest


# --- helpers -------------------------------------------------------------------------------


def machine(image: Path, cmdline: str = "") -> Machine:
    booted = machine_for(image)
    booted.cmdline = f"console=ttyS0 {cmdline}".strip()
    return booted


def run_boot(booted: Machine, expect: str, log: Path, until_exit: bool = False) -> BootResult:
    """Boot and insist on `expect`; a failure shows the console's last lines."""
    result = boot(booted, expect, BOOT_TIMEOUT, log, until_exit=until_exit)
    assert result.ok, f"boot failed ({result.reason}), waiting for {expect!r}; console:\n" + "\n".join(result.tail)
    return result


def console(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()


def ready(lines: list[str]) -> re.Match[str]:
    """The one ready line of a boot, parsed."""
    found = [m for m in (READY_RE.search(line) for line in lines) if m]
    shown = "\n".join(lines[-40:])
    assert len(found) == 1, f"expected exactly one well-formed ready line, got {len(found)}:\n{shown}"
    return found[0]


def index_of(lines: list[str], pattern: str) -> int:
    """Index of the first line matching the regex; fails the test, with the console, if none does."""
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            return i
    shown = "\n".join(lines[-60:])
    raise AssertionError(f"no console line matches {pattern!r}:\n{shown}")


def kernel_version() -> str:
    variables = yaml.safe_load((ROOT / "pkgs" / "vars.yaml").read_text())
    return str(variables["kernel_version"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the image with the probe extension ---------------------------------------------------


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base image plus the e2e-probe extension.

    Built from a copy of the project's pkgs/ and runtime/ (identical files, so identical cache
    keys: every real package comes from the store) with tests/fixtures/e2e-probe added as a
    package; only the probe itself is built (a few seconds).
    """
    project = tmp_path_factory.mktemp("probe-project")
    shutil.copytree(ROOT / "pkgs", project / "pkgs", symlinks=True)
    shutil.copytree(ROOT / "runtime", project / "runtime", symlinks=True)
    shutil.copytree(FIXTURES / "e2e-probe", project / "pkgs" / "e2e-probe", symlinks=True)
    for name in ("kiln-project.yaml", "kiln.yaml"):  # source mirrors, should the store miss a package
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, project / name)
    out = project / "image"
    kiln(
        "image",
        "--pkgs",
        str(project / "pkgs"),
        "--kind",
        "kernel,initramfs",
        "--extension",
        "e2e-probe",
        "--out",
        str(out),
        timeout=5400,
    )
    return out


# --- 1 + 5a: diskless boot to the ready line, then poweroff ----------------------------------


def test_diskless_boot_reaches_ready_and_powers_off(image_dir: Path, tmp_path: Path) -> None:
    """No disk: /var is a tmpfs; kiln.test=poweroff ends QEMU with exit code 0 after the ready line.

    A config drive whose kiln.yaml is a link to /dev/zero sits in the CD drive: machined refuses the
    link (reading through it would fill PID 1's memory), says so, and boots on defaults."""
    log = tmp_path / "console.log"
    booted = machine(image_dir, "kiln.test=poweroff")
    booted.cdrom = config_drive(tmp_path / "zero.iso", {}, links={"kiln.yaml": "/dev/zero"})
    result = run_boot(booted, READY, log, until_exit=True)
    assert result.exit_code == 0 and result.reason == "powered off"
    lines = console(log)
    line = ready(lines)
    assert line["version"] == __version__
    assert line["kernel"] == kernel_version()
    assert line["extensions"] == ""
    assert line["var"] == "tmpfs"
    assert line["platform"] == "metal"
    assert index_of(lines, r"kiln-init: rootfs mounted read-only with 0 extension") < index_of(lines, READY)
    assert index_of(lines, r"machined: disk: none .*/var is a tmpfs") < index_of(lines, READY)
    refused = r"machined: config: /dev/sr\d+: kiln\.yaml: a symlink: not a regular file; using defaults"
    assert index_of(lines, refused) < index_of(lines, READY)
    assert index_of(lines, READY) < index_of(lines, r"machined: poweroff now")


def test_kiln_boot_accel_auto_finds_out_once_and_boots(image_dir: Path, tmp_path: Path) -> None:
    """The real `kiln boot --accel auto`, twice, with a cache of its own: the first run probes KVM with a
    boot that must show the kernel's banner (here KVM's guests hang, so TCG; where KVM works, KVM),
    the second reads the answer; both reach the ready line."""
    env = {**os.environ, "KILN_CACHE": str(tmp_path / "cache")}
    said = []
    for _ in range(2):
        run = subprocess.run(
            [*KILN, "boot", str(image_dir), "--accel", "auto", "--json", "--log", str(tmp_path / "console.log")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout)["ok"] is True
        said.append(
            next(line for line in run.stderr.splitlines() if line.startswith(("kiln boot: tcg", "kiln boot: kvm")))
        )
    cached = json.loads((tmp_path / "cache/boot/accel.json").read_text())
    assert len(cached) == 1
    works = next(iter(cached.values()))
    if Path("/dev/kvm").exists():
        assert "a first boot under KVM" in said[0]
        assert ("booted Linux on this host before" if works else "hung before the kernel's banner") in said[1]
    assert said[1].startswith("kiln boot: kvm" if works else "kiln boot: tcg")


# --- 2 + 3: a blank disk, first boot partitions it, /var persists; the probe restarts --------


@dataclass
class DiskBoots:
    first: list[str]  # console of the first boot (blank disk)
    second: list[str]  # console of the second boot (same disk)
    table: dict[str, object]  # sfdisk --json of the disk between the two boots
    raw: Path  # the disk as raw, between the two boots


# The config the first boot's drive gives and the machine keeps: a static address on eth0 with
# DHCP off, inside QEMU's user network (10.0.2.0/24, the host's gateway at 10.0.2.2).
KEPT_ADDRESS = "10.0.2.77/24"
KEPT_CONFIG = {
    "hostname": "e2e-kept",
    "network": {
        "interfaces": [
            {"name": "eth0", "addresses": [KEPT_ADDRESS], "gateway": GUEST_HOST, "dhcp": False, "dhcp6": False}
        ],
        "nameservers": ["10.0.2.3"],
    },
}


@pytest.fixture(scope="module")
def disk_boots(probe_image: Path, tmp_path_factory: pytest.TempPathFactory) -> DiskBoots:
    """Two boots of the probe image on one qcow2 disk, blank at first; the disk is read between them.

    A KILNCFG drive is in the CD drive each time: the first boot's (KEPT_CONFIG: hostname e2e-kept,
    a static address) is the config the machine keeps; the second boot's, a stick someone plugged
    in (hostname e2e-stick), must not replace it.

    Each boot ends (QEMU is stopped) once the probe has been restarted, which is after it
    wrote and fsynced its /var marker, and (machined's 1 s restart backoff) after the ready line.
    """
    work = tmp_path_factory.mktemp("disk")
    disk = work / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "1G"], check=True)
    booted = machine(probe_image)
    booted.blank_disk = disk
    booted.cdrom = config_drive(work / "first.iso", {"kiln.json": json.dumps(KEPT_CONFIG).encode()})
    run_boot(booted, "e2e-probe: running", work / "first.log")
    raw = work / "disk.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(disk), str(raw)], check=True)
    dump = subprocess.run(["sfdisk", "--json", str(raw)], capture_output=True, text=True)
    assert dump.returncode == 0, f"sfdisk cannot read the disk after the first boot: {dump.stderr}"
    table = json.loads(dump.stdout)["partitiontable"]
    booted.cdrom = config_drive(work / "stick.iso", {"kiln.json": json.dumps({"hostname": "e2e-stick"}).encode()})
    run_boot(booted, "e2e-probe: running", work / "second.log")
    return DiskBoots(console(work / "first.log"), console(work / "second.log"), table, raw)


def partitions(table: dict[str, object]) -> dict[str, dict[str, object]]:
    listed = table.get("partitions")
    assert isinstance(listed, list)
    return {str(p.get("name")): p for p in listed}


def test_first_boot_creates_state_and_ephemeral(disk_boots: DiskBoots) -> None:
    """machined gives a blank disk a GPT with STATE (100 MiB) and EPHEMERAL (the rest), formatted ext4."""
    table = disk_boots.table
    assert table["label"] == "gpt"
    parts = partitions(table)
    assert sorted(parts) == ["EPHEMERAL", "STATE"], table
    sector = int(str(table.get("sectorsize", 512)))
    state, ephemeral = parts["STATE"], parts["EPHEMERAL"]
    assert int(str(state["size"])) * sector == 100 * 1024 * 1024
    assert int(str(ephemeral["size"])) * sector >= 256 * 1024 * 1024
    for part in (state, ephemeral):
        assert int(str(part["start"])) * sector % (1024 * 1024) == 0, f"{part} is not 1 MiB aligned"
    for name, part in parts.items():
        probe = subprocess.run(
            ["blkid", "-p", "-o", "export", "-O", str(int(str(part["start"])) * sector), str(disk_boots.raw)],
            capture_output=True,
            text=True,
        )
        tags = dict(line.split("=", 1) for line in probe.stdout.splitlines() if "=" in line)
        assert tags.get("TYPE") == "ext4" and tags.get("LABEL") == name, probe.stdout + probe.stderr

    first = disk_boots.first
    line = ready(first)
    number = str(ephemeral["node"]).removeprefix(str(disk_boots.raw))
    assert line["var"] == f"/dev/vda{number}", f"ready line says var={line['var']}, EPHEMERAL is partition {number}"
    assert line["extensions"] == "e2e-probe"
    assert index_of(first, r"machined: disk: created STATE on /dev/vda") < index_of(first, READY)
    assert index_of(first, r"machined: disk: formatted EPHEMERAL") < index_of(first, READY)


def test_var_survives_a_reboot(disk_boots: DiskBoots) -> None:
    """A file the probe writes to /var on the first boot is what it finds on the second; nothing is redone."""
    first, second = disk_boots.first, disk_boots.second
    index_of(first, r"e2e-probe: no /var marker")
    index_of(first, r"e2e-probe: wrote /var marker: boot 1")
    index_of(second, r"e2e-probe: found /var marker: boot 1")
    index_of(second, r"e2e-probe: wrote /var marker: boot 2")
    assert not [x for x in second if re.search(r"machined: disk: (created|formatted)", x)], "second boot redid the disk"
    assert ready(second)["var"] == ready(first)["var"]


def test_a_config_drive_counts_only_on_the_first_boot(disk_boots: DiskBoots) -> None:
    """The first boot takes the KILNCFG drive's config and keeps it on STATE; a drive inserted later
    does not replace it: the second boot says why it ignores the drive and runs on the kept config."""
    first, second = disk_boots.first, disk_boots.second
    assert index_of(first, r"machined: config: /dev/sr\d+:kiln\.json$") < index_of(first, READY)
    index_of(first, r"e2e-probe: hostname e2e-kept$")
    ignored = r"machined: config: config drive /dev/sr\d+ ignored: a config is kept in /dev/vda\d+:config\.json"
    kept = r"machined: config: \S+/config\.json \(kept from an earlier boot\)"
    assert index_of(second, ignored) < index_of(second, kept) < index_of(second, READY)
    index_of(second, r"e2e-probe: hostname e2e-kept$")
    assert not [line for line in second if "e2e-stick" in line]


def test_the_kept_config_network_is_applied(disk_boots: DiskBoots) -> None:
    """The static address of the config is on eth0 before ready on both boots, and DHCP never runs:
    on the second boot (no config of its own, a disk with STATE) the network waits for the kept
    config instead of starting DHCP on the defaults."""
    static = rf"machined: network: eth0: {re.escape(KEPT_ADDRESS)} \(static\)$"
    for lines in (disk_boots.first, disk_boots.second):
        assert index_of(lines, static) < index_of(lines, READY)
        assert not [line for line in lines if "via DHCP" in line]
    kept = r"machined: config: \S+/config\.json \(kept from an earlier boot\)"
    assert index_of(disk_boots.second, kept) < index_of(disk_boots.second, static)


def test_extension_service_restarts_after_it_is_killed(disk_boots: DiskBoots) -> None:
    """The extension's service starts, kills itself (SIGKILL), and machined's supervisor restarts it."""
    lines = disk_boots.first
    assert index_of(lines, r"kiln-init: extension layer 01-e2e-probe\.sqsh") < index_of(lines, READY)
    first = index_of(lines, r"e2e-probe: start 1$")
    killed = index_of(lines, r"e2e-probe: killing myself")
    restarting = index_of(lines, r"machined: service e2e-probe: killed by killed; restarting in 1s")
    second = index_of(lines, r"e2e-probe: start 2$")
    assert first < killed < restarting < second
    # the probe's own lines may come before or after machined's "started" line for that run (and the boot
    # ends at the probe's "running", maybe before the second one), so only the first is placed
    assert index_of(lines, r"machined: service e2e-probe: started \(pid \d+\)") < restarting


# --- 4 + 5b: the mutual-TLS API, and poweroff through it ------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"openssl {' '.join(args)}: {result.stderr}"


def make_ca(directory: Path, name: str) -> None:
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-subj",
        f"/CN={name}",
        "-days",
        "2",
        cwd=directory,
    )


def make_cert(directory: Path, ca: str, name: str, extensions: str = "", role: str = "") -> None:
    """A certificate signed by `ca`; a client's `role` (admin, operator, reader) is its Organization."""
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/O={role}/CN={name}" if role else f"/CN={name}",
        cwd=directory,
    )
    signed = [
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
    ]
    if extensions:
        (directory / f"{name}.ext").write_text(extensions + "\n")
        signed += ["-extfile", f"{name}.ext"]
    openssl(*signed, cwd=directory)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA with the machine's, an admin's, an operator's and a reader's certificates, and a second CA with
    its own 'admin'."""
    directory = tmp_path / "pki"
    directory.mkdir()
    make_ca(directory, "ca")
    make_cert(directory, "ca", "machine", "subjectAltName=IP:127.0.0.1,IP:10.0.2.15,DNS:e2e-api")
    make_cert(directory, "ca", "admin", "extendedKeyUsage=clientAuth", role="admin")
    make_cert(directory, "ca", "operator", "extendedKeyUsage=clientAuth", role="operator")
    make_cert(directory, "ca", "reader", "extendedKeyUsage=clientAuth", role="reader")
    make_ca(directory, "rogue-ca")
    make_cert(directory, "rogue-ca", "rogue-admin", "extendedKeyUsage=clientAuth", role="admin")
    return directory


@pytest.fixture
def config_server(pki: Path) -> Iterator[str]:
    """Serves the machine config (hostname, API certificates) over HTTP on the host; yields its guest URL,
    pinned by the config's sha256 (machined refuses plain http without one)."""
    config = json.dumps(
        {
            "hostname": "e2e-api",
            "api": {
                "ca": (pki / "ca.crt").read_text(),
                "cert": (pki / "machine.crt").read_text(),
                "key": (pki / "machine.key").read_text(),
            },
        }
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/kiln.json":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(config)))
            self.end_headers()
            self.wfile.write(config)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{GUEST_HOST}:{server.server_address[1]}/kiln.json#sha256={hashlib.sha256(config).hexdigest()}"
    finally:
        server.shutdown()
        server.server_close()


def client_context(pki: Path, cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return context


def request(port: int, context: ssl.SSLContext, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body).encode())
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def watched_until_synced(port: int, context: ssl.SSLContext, query: str) -> list[dict[str, object]]:
    """The lines of GET /v1/resources?watch=1 up to `synced`: the state when the watch began."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request("GET", "/v1/resources?watch=1" + query)
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
        lines: list[dict[str, object]] = []
        while not lines or lines[-1]["event"] != "synced":
            lines.append(json.loads(response.readline()))
        return lines
    finally:
        connection.close()


def refused(port: int, context: ssl.SSLContext) -> str:
    """The error a request fails with; fails the test if the API answers."""
    try:
        status, body = request(port, context, "GET", "/v1/status")
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected) as error:
        return repr(error)
    raise AssertionError(f"the API answered {status} without a valid client certificate: {body[:200]!r}")


def forbidden(port: int, context: ssl.SSLContext, method: str, path: str) -> bool:
    """True if the API refuses this client: 403, or no TLS session at all."""
    try:
        return request(port, context, method, path)[0] == 403
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True


def open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections to 127.0.0.1:port that never send a byte (QEMU's user network accepts
    each on the host side at once, then connects it to the guest)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 512), hard))
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        return list(pool.map(lambda _: socket.create_connection(("127.0.0.1", port), timeout=60), range(count)))


def wait_for_line(log: Path, text: str, thread: threading.Thread, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if not thread.is_alive():
            break
        time.sleep(0.5)
    shown = "\n".join(console(log)[-40:]) if log.exists() else "(no console log)"
    raise AssertionError(f"no {text!r} on the console:\n{shown}")


def test_plain_http_config_is_refused_and_the_machine_boots_on_defaults(image_dir: Path, tmp_path: Path) -> None:
    """kiln.config= over plain http without a #sha256= digest is refused before anything is fetched (the
    config would define root services and the API CA): one console line, then ready on defaults."""
    log = tmp_path / "console.log"
    url = f"http://{GUEST_HOST}:9/kiln.json"
    result = run_boot(machine(image_dir, f"kiln.config={url} kiln.test=poweroff"), READY, log, until_exit=True)
    assert result.exit_code == 0
    lines = console(log)
    assert index_of(lines, r"machined: config: kiln.config: plain http is refused.*using defaults") < index_of(
        lines, READY
    )


def test_api_mutual_tls_and_poweroff(image_dir: Path, pki: Path, config_server: str, tmp_path: Path) -> None:
    """Config from a URL turns the API on; only a client certificate from its CA gets answers, each
    within its role; a reader watches resources; a config over the API is checked but not applied on
    this diskless machine; upgrades are refused while the config names no release keys; 2,000 idle
    connections from another address do not keep an admin out; POST /v1/poweroff powers the machine
    off (QEMU exits 0).

    The idle connections come through a second NIC on a QEMU user network of its own (10.0.3.0/24),
    so machined sees them from another address than the admin's (10.0.2.2)."""
    port, flood_port = free_port(), free_port()
    assert port != flood_port
    booted = machine(image_dir, f"kiln.config={config_server}")
    booted.api_port = port
    booted.extra = [
        "-netdev",
        f"user,id=net1,net=10.0.3.0/24,hostfwd=tcp:127.0.0.1:{flood_port}-:50000",
        "-device",
        "virtio-net-pci,netdev=net1",
    ]
    log = tmp_path / "console.log"
    results: list[BootResult] = []
    thread = threading.Thread(
        target=lambda: results.append(boot(booted, READY, BOOT_TIMEOUT + 60, log, until_exit=True)), daemon=True
    )
    thread.start()
    try:
        wait_for_line(log, READY, thread, BOOT_TIMEOUT)
        lines = console(log)
        assert index_of(lines, r"machined: config: " + re.escape(config_server)) < index_of(lines, READY)
        assert index_of(lines, r"machined: api: listening on .*:50000 \(mutual TLS\)") < index_of(lines, READY)

        status, body = request(port, client_context(pki, "admin"), "GET", "/v1/status")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["version"] == __version__
        assert answer["kernel"] == kernel_version()
        assert answer["hostname"] == "e2e-api"
        assert answer["var"] == "tmpfs"
        assert answer["extensions"] == []
        assert answer["schematic"] == ""  # an image made without one
        assert answer["config"] == config_server

        no_cert = refused(port, client_context(pki, None))
        wrong_ca = refused(port, client_context(pki, "rogue-admin"))
        assert no_cert and wrong_ca
        # the machine's own certificate (no clientAuth, the machine's key) is no client; a reader only reads
        assert forbidden(port, client_context(pki, "machine"), "GET", "/v1/status")
        assert request(port, client_context(pki, "reader"), "GET", "/v1/status")[0] == 200
        # the machine's resources: the config it runs (fetched from the config server), the
        # network applied from it, and the machine's health
        status, body = request(port, client_context(pki, "reader"), "GET", "/v1/resources")
        resources = {(r["type"], r["id"]): r for r in json.loads(body)["resources"]}
        # what the kernel, the supervisor and the clock have (no boot/state: this machine has no A/B disk)
        observed = {"network/link", "network/address", "service/status", "time/status"}
        owned = {key for key in resources if key[0] not in observed and key[0] != "extension/status"}
        assert status == 200 and owned == {
            ("config/source", "boot"),
            ("config/machine", "machine"),
            ("config/install", "install"),
            ("config/kept", "kept"),
            ("platform/metadata", "platform"),
            ("api/status", "api"),
            ("volume/status", "volumes"),
            ("extension/services", "services"),
            ("network/status", "applied"),
            ("health/machine", "machine"),
            ("machine/stage", "machine"),
            ("machine/ready", "machine"),
            ("service/set", "services"),
        }
        assert resources[("network/link", "eth0")]["spec"]["up"] is True, sorted(resources)
        assert ("time/status", "clock") in resources and not any(key[0] == "boot/state" for key in resources)
        address = resources[("network/address", "eth0/10.0.2.15/24")]  # QEMU's DHCP lease
        assert address["spec"]["scope"] == "global" and address["owner"] == "links", address
        status, body = request(port, client_context(pki, "reader"), "GET", "/v1/resources?type=addresses")
        assert status == 200 and {r["type"] for r in json.loads(body)["resources"]} == {"network/address"}, body
        assert resources[("health/machine", "machine")]["owner"] == "health", resources
        assert resources[("machine/ready", "machine")]["spec"]["var"] == "tmpfs", resources
        # the boot is over, and the services controller runs the services of the config it follows
        assert resources[("machine/stage", "machine")]["spec"] == {"stage": "running"}, resources
        services = resources[("service/set", "services")]
        assert services["owner"] == "service-set" and services["spec"]["state"] == "running", services
        assert services["spec"]["config_version"] == resources[("config/machine", "machine")]["version"], services
        # the disks it uses, as the volumes controller set them up before ready (diskless: /var on a tmpfs)
        volumes = resources[("volume/status", "volumes")]
        assert volumes["owner"] == "volumes" and volumes["spec"] == {"var": "tmpfs"}, volumes
        # the extensions the ready line names, each an extension/status of the extensions controller
        extensions = [r for key, r in sorted(resources.items()) if key[0] == "extension/status"]
        ready_extensions = resources[("machine/ready", "machine")]["spec"]["extensions"]
        assert [r["id"] for r in extensions] == ready_extensions, extensions
        assert all(r["owner"] == "extensions" for r in extensions), extensions
        assert resources[("extension/services", "services")]["owner"] == "extensions", resources
        assert resources[("platform/metadata", "platform")]["spec"]["name"] == "metal", resources
        assert resources[("platform/metadata", "platform")]["owner"] == "platform", resources
        # the config controller composed the config from kiln.config= (read by the boot-config
        # controller); diskless, nothing is kept
        source = resources[("config/source", "boot")]
        assert source["owner"] == "bootconfig" and source["spec"] == {"source": config_server}, source
        assert resources[("config/machine", "machine")]["spec"]["source"] == config_server, resources
        assert resources[("config/kept", "kept")]["spec"] == {"action": "none"}, resources
        # the API controller says what the API serves, for the config version it follows
        api = resources[("api/status", "api")]
        assert api["owner"] == "api" and api["spec"]["address"].endswith(":50000"), api
        assert '"machine"' in api["spec"]["certificate"], api
        assert api["spec"]["config_version"] == resources[("config/machine", "machine")]["version"], api
        applied = resources[("network/status", "applied")]
        assert applied["owner"] == "network" and applied["phase"] == "running", applied
        assert applied["spec"]["config_version"] == resources[("config/machine", "machine")]["version"], resources
        # a reader may watch them: the state when the watch began, then "synced"
        watched = watched_until_synced(port, client_context(pki, "reader"), "&type=network/status")
        assert [line["event"] for line in watched] == ["current", "synced"], watched
        assert watched[0]["resource"] == applied, watched
        # a config over the API: admin only; this diskless machine checks it and says what auto would
        # do, but refuses to apply one that could not outlive a reboot
        new_config = {"hostname": "e2e-api-2"}
        assert request(port, client_context(pki, "operator"), "POST", "/v1/config", new_config)[0] == 403
        status, body = request(port, client_context(pki, "admin"), "POST", "/v1/config?mode=dry_run", new_config)
        report = json.loads(body)
        assert status == 200 and {"section": "hostname", "result": "applied"} in report["sections"], report
        assert any("no STATE partition" in note for note in report["notes"]), report
        status, body = request(port, client_context(pki, "admin"), "POST", "/v1/config", new_config)
        assert status == 409 and b"no STATE partition" in body, body
        assert request(port, client_context(pki, "reader"), "POST", "/v1/poweroff")[0] == 403
        assert request(port, client_context(pki, "reader"), "POST", "/v1/upgrade", {"image": "x"})[0] == 403
        assert request(port, client_context(pki, "reader"), "POST", "/v1/rollback")[0] == 403
        # an operator may roll back (this diskless machine has nothing to roll back to: 409, not 403)
        status, body = request(port, client_context(pki, "operator"), "POST", "/v1/rollback")
        assert status == 409 and b"did not boot from an A/B disk" in body, body
        # no release_keys and no allow_unsigned in the config: every upgrade is refused, before any fetch
        image = {"image": f"{GUEST_HOST}:9/kiln/installer:9.9.9"}
        status, body = request(port, client_context(pki, "operator"), "POST", "/v1/upgrade", image)
        assert status == 409 and b"no release_keys" in body and b"allow_unsigned: true" in body, body
        # still serving the right client after refusing the others
        assert request(port, client_context(pki, "admin"), "GET", "/v1/services")[0] == 200

        # the second NIC reaches the API; then 2,000 idle connections through it, and the admin still gets in
        assert request(flood_port, client_context(pki, "admin"), "GET", "/v1/status")[0] == 200
        idle = open_idle(flood_port, 2000)
        try:
            status, body = request(port, client_context(pki, "admin"), "GET", "/v1/status")
            assert status == 200, body
        finally:
            for connection in idle:
                connection.close()
        # the flood reached machined: its own log (not the console) names the refusals past 32 from one address
        status, body = request(port, client_context(pki, "admin"), "GET", "/v1/logs?service=machined&format=text")
        assert status == 200, body
        index_of(body.decode().splitlines(), r"api: refused a connection from 10\.0\.3\.2: it has 32 open")

        status, body = request(port, client_context(pki, "admin"), "POST", "/v1/poweroff")
        assert status == 202, body
        thread.join(BOOT_TIMEOUT)
    finally:
        thread.join(BOOT_TIMEOUT + 90)
    assert results, "the boot did not finish"
    result = results[0]
    assert result.ok and result.exit_code == 0, f"{result.reason}:\n" + "\n".join(result.tail)
    lines = console(log)
    assert (
        index_of(lines, READY)
        < index_of(lines, r"machined: poweroff: stopping services")
        < index_of(lines, r"machined: poweroff now")
    )


# --- 6: a damaged rootfs gives init's message and a reboot ----------------------------------


def damage_superblock(data: bytearray) -> None:
    data[0:96] = bytes(96)  # magic, inode count, block size, table offsets: all gone


def damage_data(data: bytearray) -> None:
    """Garbage in every 128 KiB of the data blocks; the tables after them (inodes, directories) stay intact."""
    inode_table = int.from_bytes(data[64:72], "little")
    for offset in range(96 + 65536, inode_table - 4096, 131072):
        data[offset : offset + 4096] = hashlib.sha256(offset.to_bytes(8, "little")).digest() * 128


def damaged_initramfs(image: Path, work: Path, damage: Callable[[bytearray], None]) -> Path:
    """A copy of the image's initramfs whose rootfs.sqsh is damaged."""
    tree = work / "tree"
    tree.mkdir()
    unpacked = subprocess.run(
        f"zstd -dc {image / 'initramfs.zst'} | cpio -idm --quiet", shell=True, cwd=tree, capture_output=True, text=True
    )
    assert unpacked.returncode == 0, unpacked.stderr
    rootfs = tree / "rootfs.sqsh"
    data = bytearray(rootfs.read_bytes())
    assert data[:4] == b"hsqs"
    damage(data)
    rootfs.write_bytes(bytes(data))
    out = work / "damaged"
    out.mkdir()
    shutil.copy2(image / "vmlinuz", out / "vmlinuz")
    cpio_newc(tree, out / "initramfs.zst", 0, level=3)
    return out


@pytest.mark.parametrize("damage", [damage_superblock, damage_data], ids=["superblock", "data"])
def test_damaged_rootfs_reports_and_reboots(
    image_dir: Path, tmp_path: Path, damage: Callable[[bytearray], None]
) -> None:
    """init says what failed in one 'kiln-init: fatal: ...' line naming rootfs.sqsh and reboots (QEMU, with
    -no-reboot, exits): a damaged superblock is caught before mounting, damaged data blocks when init reads
    machined through before exec'ing it (instead of machined dying of SIGBUS, a kernel panic)."""
    damaged = damaged_initramfs(image_dir, tmp_path, damage)
    log = tmp_path / "console.log"
    result = run_boot(machine(damaged), "kiln-init: fatal:", log, until_exit=True)
    assert result.line is not None
    assert "rootfs.sqsh is damaged" in result.line, f"init's message does not name the rootfs: {result.line}"
    assert "rebooting" in result.line
    lines = console(log)
    assert not [x for x in lines if "machined" in x and "kiln-init" not in x], "machined started from a damaged rootfs"
    assert not [x for x in lines if "Kernel panic" in x]
