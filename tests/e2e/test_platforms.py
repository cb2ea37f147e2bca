"""End-to-end: each cloud profile's real image boots against a fake of its cloud.

The fake metadata service and Azure's fake WireServer run on the host's loopback. QEMU's user
network is moved to 168.0.0.0/7 so that both 169.254.169.254 and 168.63.129.16 lie inside it,
and `guestfwd` hands each guest connection to those addresses to socat, which connects to the
fake: the guest uses the platforms' real addresses. The answers follow each platform's published
documentation. Drives (Azure's provisioning medium, VMware's OVF environment, NoCloud's cidata)
are real ISO images made with xorriso.

Each guest gets its config (API certificates and a oneshot service) from the platform's user
data and its hostname from the platform's metadata; both are checked through the API. Nothing in
the guest is stubbed; the clouds are.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import lzma
import shutil
import subprocess
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kiln.boot.qemu import READY, BootResult, Machine, boot
from tests.e2e.test_system import (
    client_context,
    console,
    free_port,
    make_ca,
    make_cert,
    request,
    wait_for_line,
)

pytestmark = pytest.mark.e2e

BOOT_TIMEOUT = 240.0
GUEST_MAC = "52:54:00:12:34:56"  # QEMU's default for the first NIC
NETWORK = "net=168.0.0.0/7,host=168.0.0.2,dhcpstart=168.0.0.15,dns=168.0.0.3"
METADATA, WIRESERVER = "169.254.169.254", "168.63.129.16"
AWS_TOKEN = "AQAEAFakeTokenForTheE2ETest=="


@dataclass
class Cloud:
    """What the fake clouds were asked, for the assertions."""

    user_data: bytes
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    health_reports: list[bytes] = field(default_factory=list)


def answer_metadata(cloud: Cloud, platform: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """The documented answers of each platform's metadata service, for this test's machine."""
    host = f"kiln-{platform}"
    if platform == "aws":
        if method == "PUT" and path == "/latest/api/token":
            return (200, AWS_TOKEN.encode()) if headers.get("x-aws-ec2-metadata-token-ttl-seconds") else (400, b"")
        if headers.get("x-aws-ec2-metadata-token") != AWS_TOKEN:
            return 401, b""
        return {
            "/latest/user-data": (200, cloud.user_data),
            "/latest/meta-data/hostname": (200, f"{host}.ec2.internal".encode()),
            "/latest/meta-data/instance-id": (200, b"i-0123456789abcdef0"),
        }.get(path, (404, b""))
    if platform == "gcp":
        if headers.get("metadata-flavor") != "Google":
            return 403, b""
        return {
            "/computeMetadata/v1/instance/attributes/user-data": (200, cloud.user_data),
            "/computeMetadata/v1/instance/hostname": (200, f"{host}.c.project.internal".encode()),
            "/computeMetadata/v1/instance/id": (200, b"4520031799277581759"),
        }.get(path, (404, b""))
    if platform == "azure" and path.startswith("/metadata/instance") and headers.get("metadata") == "true":
        compute = {"name": host, "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "osProfile": {"computerName": host}}
        return 200, json.dumps({"compute": compute}).encode()
    if platform == "digital-ocean" and path == "/metadata/v1.json":
        public = {
            "ipv4": {"ip_address": "168.0.0.15", "netmask": "254.0.0.0", "gateway": "168.0.0.2"},
            "mac": GUEST_MAC,
        }
        document = {
            "droplet_id": 2756294,
            "hostname": host,
            "user_data": cloud.user_data.decode(),
            "interfaces": {"public": [public | {"type": "public"}]},
            "dns": {"nameservers": ["168.0.0.3"]},
        }
        return 200, json.dumps(document).encode()
    if platform == "hcloud":
        return {
            "/hetzner/v1/metadata": (200, f"hostname: {host}\ninstance-id: 42424242\n".encode()),
            "/hetzner/v1/userdata": (200, cloud.user_data),
        }.get(path, (404, b""))
    if platform == "vultr":
        return {
            "/v1.json": (200, json.dumps({"hostname": host, "instanceid": "a747bfz6385e", "interfaces": []}).encode()),
            "/latest/user-data": (200, cloud.user_data),
        }.get(path, (404, b""))
    if platform == "openstack":
        meta = {"uuid": "d8e02d56-2648-49a3-bf97-6be8f1204f38", "hostname": f"{host}.novalocal", "name": host}
        return {
            "/openstack/latest/meta_data.json": (200, json.dumps(meta).encode()),
            "/openstack/latest/user_data": (200, cloud.user_data),
        }.get(path, (404, b""))
    return 404, b""


def goal_state() -> bytes:
    return (
        b'<?xml version="1.0" encoding="utf-8"?><GoalState><Version>2012-11-30</Version>'
        b"<Incarnation>7</Incarnation><Machine><ExpectedState>Started</ExpectedState></Machine>"
        b"<Container><ContainerId>9d0e5a4e-0b5e-4e4a-8d0e-5e9b1c7f3a21</ContainerId><RoleInstanceList>"
        b"<RoleInstance><InstanceId>02aab8a4.kiln-azure</InstanceId><State>Started</State></RoleInstance>"
        b"</RoleInstanceList></Container></GoalState>"
    )


def serve(cloud: Cloud, platform: str, wireserver: bool) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one(self, method: str) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = self.rfile.read(int(headers.get("content-length") or 0))
            cloud.requests.append((method, self.path, headers))
            if wireserver:
                code, data = self.wireserver(method, body, headers)
            else:
                code, data = answer_metadata(cloud, platform, method, self.path, headers)
            self.send_response(code)
            if platform == "gcp" and not wireserver:
                self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def wireserver(self, method: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
            if headers.get("x-ms-version") != "2012-11-30":
                return 400, b""
            if method == "GET" and self.path.endswith("comp=goalstate"):
                return 200, goal_state()
            if method == "POST" and self.path.endswith("comp=health"):
                cloud.health_reports.append(body)
                return 200, b""
            return 404, b""

        def do_GET(self) -> None:
            self.handle_one("GET")

        def do_PUT(self) -> None:
            self.handle_one("PUT")

        def do_POST(self) -> None:
            self.handle_one("POST")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def fake_cloud(platform: str, user_data: bytes) -> Iterator[tuple[Cloud, str]]:
    """The cloud's fake services; yields them with the QEMU network options that reach them."""
    cloud = Cloud(user_data)
    metadata, wire = serve(cloud, platform, wireserver=False), serve(cloud, platform, wireserver=True)
    forward = "guestfwd=tcp:{}:80-cmd:socat - TCP:127.0.0.1:{}"
    options = ",".join(
        [
            NETWORK,
            forward.format(METADATA, metadata.server_address[1]),
            forward.format(WIRESERVER, wire.server_address[1]),
        ]
    )
    try:
        yield cloud, options
    finally:
        for server in (metadata, wire):
            server.shutdown()
            server.server_close()


def bootable_disk(outputs: Path, platform: str, work: Path) -> tuple[Path, str]:
    """The platform's shipped artifact as QEMU opens it: decompressed or unpacked where needed."""
    directory = outputs / platform
    [artifact] = [p for p in directory.iterdir() if p.name.startswith(f"{platform}-amd64.")]
    raw = work / f"{platform}.raw"
    if artifact.name.endswith(".zst"):
        subprocess.run(["zstd", "-q", "-d", "-f", str(artifact), "-o", str(raw)], check=True)
    elif artifact.name.endswith(".raw.gz"):
        subprocess.run(f"gzip -dc {artifact} | cp --sparse=always /dev/stdin {raw}", shell=True, check=True)
    elif artifact.name.endswith(".xz"):
        with lzma.open(artifact) as source, raw.open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    elif artifact.name.endswith(".tar.gz"):
        with tarfile.open(artifact) as tar:
            tar.extract("disk.raw", work, filter="data")
        (work / "disk.raw").rename(raw)
    elif artifact.suffix == ".ova":
        with tarfile.open(artifact) as ova:
            [vmdk] = [m for m in ova.getmembers() if m.name.endswith(".vmdk")]
            ova.extract(vmdk, work, filter="data")
        return work / vmdk.name, "vmdk"
    elif artifact.suffix in (".vhd", ".qcow2"):
        return artifact, {".vhd": "vpc", ".qcow2": "qcow2"}[artifact.suffix]
    else:
        return artifact, "raw"
    return raw, "raw"


def iso(path: Path, label: str, files: dict[str, bytes]) -> Path:
    """A real ISO 9660 image (Joliet and Rock Ridge) holding `files`, as the platform attaches it."""
    tree = path.with_suffix(".d")
    tree.mkdir()
    for name, data in files.items():
        (tree / name).write_bytes(data)
    subprocess.run(
        ["xorriso", "-as", "mkisofs", "-quiet", "-J", "-R", "-V", label, "-o", str(path), str(tree)], check=True
    )
    return path


def ovf_environment(properties: dict[str, str]) -> bytes:
    items = "".join(f'<Property oe:key="{k}" oe:value="{v}"/>' for k, v in properties.items())
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Environment xmlns="http://schemas.dmtf.org/ovf/environment/1" '
        'xmlns:oe="http://schemas.dmtf.org/ovf/environment/1" xmlns:ve="http://www.vmware.com/schema/ovfenv" '
        f'oe:id="" ve:vCenterId="vm-1042"><PropertySection>{items}</PropertySection></Environment>'
    ).encode()


def azure_provisioning(custom_data: bytes, host: str) -> bytes:
    ns1 = "http://schemas.microsoft.com/windowsazure"
    return (
        '<?xml version="1.0" encoding="utf-8"?><ns0:Environment xmlns:ns0="http://schemas.dmtf.org/ovf/environment/1" '
        f'xmlns:ns1="{ns1}"><ns1:ProvisioningSection><ns1:Version>1.0</ns1:Version>'
        "<ns1:LinuxProvisioningConfigurationSet><ns1:ConfigurationSetType>LinuxProvisioningConfiguration"
        f"</ns1:ConfigurationSetType><ns1:HostName>{host}</ns1:HostName><ns1:UserName>azureuser</ns1:UserName>"
        f"<ns1:CustomData>{base64.b64encode(custom_data).decode()}</ns1:CustomData>"
        "</ns1:LinuxProvisioningConfigurationSet></ns1:ProvisioningSection></ns0:Environment>"
    ).encode()


def drive_for(platform: str, user_data: bytes, work: Path) -> Path | None:
    """The medium the platform attaches, if it provisions through one."""
    host = f"kiln-{platform}"
    if platform == "azure":
        return iso(work / "azure.iso", "rd_rdfe_stable", {"ovf-env.xml": azure_provisioning(user_data, host)})
    if platform == "vmware":
        encoded = base64.b64encode(user_data).decode()
        environment = ovf_environment(
            {"guestinfo.kiln.config": encoded, "guestinfo.kiln.config.encoding": "base64", "hostname": host}
        )
        return iso(work / "vmware.iso", "OVF ENV", {"ovf-env.xml": environment})
    if platform == "nocloud":
        files = {"user-data": user_data, "meta-data": f"instance-id: iid-1\nlocal-hostname: {host}\n".encode()}
        return iso(work / "nocloud.iso", "cidata", files)
    return None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_cert(directory, "ca", "machine", "subjectAltName=IP:127.0.0.1")
    make_cert(directory, "ca", "admin", "extendedKeyUsage=clientAuth", role="admin")
    return directory


def machine_config(pki: Path) -> bytes:
    """User data as a release engineer passes it: a Kiln config (API certificates, a oneshot service)."""
    config = {
        "api": {name: (pki / f"machine.{ext}").read_text() for name, ext in (("cert", "crt"), ("key", "key"))}
        | {"ca": (pki / "ca.crt").read_text()},
        "services": [{"name": "probe", "command": "/usr/sbin/blkid", "type": "oneshot", "restart": "never"}],
    }
    return json.dumps(config).encode()


PLATFORMS = ["aws", "gcp", "azure", "digital-ocean", "hcloud", "vultr", "openstack", "vmware", "nocloud"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_cloud_image_takes_its_config_and_name_from_its_cloud(
    platform: str, every_profile: Path, pki: Path, tmp_path: Path
) -> None:
    """The platform's own image reaches ready naming its platform, runs the user data's service and
    takes the metadata's hostname; Azure's WireServer hears Ready."""
    user_data = machine_config(pki)
    disk, disk_format = bootable_disk(every_profile, platform, tmp_path)
    port, log = free_port(), tmp_path / "console.log"
    with fake_cloud(platform, user_data) as (cloud, options):
        guest = Machine(disk=disk, disk_format=disk_format, api_port=port, net_options=options)
        guest.cdrom = drive_for(platform, user_data, tmp_path)
        results: list[BootResult] = []
        thread = threading.Thread(
            target=lambda: results.append(boot(guest, READY, BOOT_TIMEOUT, log, until_exit=True)), daemon=True
        )
        thread.start()
        try:
            wait_for_line(log, READY, thread, BOOT_TIMEOUT)
            lines = console(log)
            [ready] = [line for line in lines if line.startswith(READY)]
            assert ready.endswith(f" platform={platform}"), ready
            context = client_context(pki, "admin")
            status = eventually(lambda: json.loads(request(port, context, "GET", "/v1/status")[1]), ready_service)
            addresses = [a for found in status["addresses"].values() for a in found]
            assert "168.0.0.15/7" in addresses, addresses
            # IPv6 is the kernel's SLAAC, from the router advertisements of QEMU's user network (fec0::/64)
            status = eventually(lambda: json.loads(request(port, context, "GET", "/v1/status")[1]), has_slaac)
            assert status["hostname"].split(".")[0] == f"kiln-{platform}", status  # aws and gcp give FQDNs
            assert status["platform"]["name"] == platform and not status["platform"]["error"], status["platform"]
            assert status["config"] == f"{platform}:user-data" or platform == "nocloud", status["config"]
            if platform == "azure":
                eventually(lambda: cloud.health_reports, bool)
                report = ET.fromstring(cloud.health_reports[0])
                assert report.findtext(".//State") == "Ready" and report.findtext(".//GoalStateIncarnation") == "7"
                # the platform controller records the report it sent in platform/metadata
                reported = eventually(lambda: json.loads(request(port, context, "GET", "/v1/status")[1]), sent_report)
                assert reported["platform"]["ready_report"] == "sent", reported["platform"]
            if platform == "aws":
                assert all("x-aws-ec2-metadata-token" in h for m, _, h in cloud.requests if m == "GET")
            assert request(port, context, "POST", "/v1/poweroff")[0] == 202
        finally:
            thread.join(BOOT_TIMEOUT)
    assert results and results[0].exit_code == 0, "the guest did not power off"


def sent_report(status: dict[str, Any]) -> bool:
    return bool(status["platform"]["ready_report"])


def has_slaac(status: dict[str, Any]) -> bool:
    return any(a.startswith("fec0::") for found in status["addresses"].values() for a in found)


def ready_service(status: dict[str, Any]) -> bool:
    return any(s["name"] == "probe" and s["state"] == "exited" for s in status.get("services") or [])


def eventually(probe: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 60) -> Any:
    """Poll `probe` until `done` holds for its value (a real condition, with a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout:.0f} s")
        time.sleep(0.5)
