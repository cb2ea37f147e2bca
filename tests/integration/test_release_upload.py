"""`kiln release upload aws` against moto's server: a real local HTTP server speaking the AWS APIs
(EBS direct, EC2, SSM, STS), reached through boto3 with AWS_ENDPOINT_URL, as an emulator is reached.

Between boto3 and moto sits a small recording proxy: moto keeps only some of what RegisterImage
is given (no architecture, boot mode or ENA), so the test reads those off the requests as they
went over the wire; the proxy can also refuse one operation, to fail an upload midway.

The output directory is made here, not by `kiln image` (which takes minutes): a sparse 64 MiB raw
disk with a few non-zero blocks, zstd-compressed, and a manifest.json in kiln image's shape.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from kiln.cloud.artifact import BLOCK
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

boto3 = pytest.importorskip("boto3")

DISK = 64 << 20
FILLED = {0: b"\x01", 3: b"kiln", 127: b"\xff"}  # block index -> bytes written at its start
REGIONS = ("us-east-1", "eu-west-1")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto(env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    process = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("moto_server did not listen within 30 s")


@dataclass
class Proxy:
    """Forwards every request to moto and records (operation, form fields or JSON body, path)."""

    upstream: int
    port: int = 0
    seen: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    refuse: str = ""  # an operation answered with a non-retryable error instead

    def operations(self) -> list[str]:
        return [operation for operation, _, _ in self.seen]

    def fields(self, operation: str) -> dict[str, Any]:
        return next(body for op, body, _ in self.seen if op == operation)


def operation_of(method: str, path: str, headers: Any, body: bytes) -> tuple[str, dict[str, Any]]:
    """The AWS operation a request is: the Query APIs' Action, the JSON APIs' X-Amz-Target, else (EBS's
    REST API) the method and path, with the checksum header."""
    target = headers.get("X-Amz-Target")
    if target:
        return target.rsplit(".", 1)[-1], json.loads(body or b"{}")
    form = {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}
    if "Action" in form:
        return form["Action"], form
    return f"{method} {path.split('?')[0]}", {"checksum": headers.get("x-amz-Checksum")}


@pytest.fixture(scope="module")
def aws() -> Iterator[Proxy]:
    process, port = start_moto()
    proxy = Proxy(port)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            operation, fields = operation_of(self.command, self.path, self.headers, body)
            proxy.seen.append((operation, fields, self.path))
            if operation == proxy.refuse:
                error = b"<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>refused by the test"
                error += b"</Message></Error></Errors><RequestID>x</RequestID></Response>"
                self.send_response(400)
                self.send_header("Content-Length", str(len(error)))
                self.end_headers()
                self.wfile.write(error)
                return
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    proxy.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield proxy
    server.shutdown()
    process.kill()
    process.wait()


def output_dir(where: Path, version: str = "1.2.3", arch: str = "amd64") -> Path:
    """An aws output directory as kiln image writes one: the compressed raw disk and manifest.json."""
    where.mkdir(parents=True)
    raw = where / "disk.raw"
    with raw.open("wb") as disk:
        disk.truncate(DISK)
        for index, data in FILLED.items():
            disk.seek(index * BLOCK)
            disk.write(data)
    subprocess.run(["zstd", "-q", "--rm", str(raw), "-o", str(where / f"aws-{arch}.raw.zst")], check=True)
    manifest = {
        "profile": {"arch": arch, "kind": "image", "name": "aws", "platform": "aws", "version": version},
        "artifacts": [{"path": f"aws-{arch}.raw.zst", "sha256": "0" * 64, "size": 1}],
        "inputs": {},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    return where


def kiln(proxy: Proxy | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    endpoint = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"} if proxy else {}
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", "release", "upload", *args],
        cwd=ROOT,
        env={**os.environ, **CREDENTIALS, "AWS_DEFAULT_REGION": REGIONS[0], **endpoint, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def client(proxy: Proxy, service: str, region: str = REGIONS[0]) -> Any:
    return boto3.client(
        service, region_name=region, endpoint_url=f"http://127.0.0.1:{proxy.port}", **_credential_arguments()
    )


def _credential_arguments() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": CREDENTIALS["AWS_SESSION_TOKEN"],
    }


def test_an_upload_writes_the_disk_registers_copies_and_names_the_image(aws: Proxy, tmp_path: Path) -> None:
    directory = output_dir(tmp_path / "aws")
    regions = ",".join(REGIONS)
    first = kiln(aws, "aws", str(directory), "--regions", regions, "--public", "--channel", "stable", "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    result = json.loads(first.stdout)
    assert set(result["images"]) == set(REGIONS) and result["reused"] is False
    total = DISK // BLOCK
    assert result["blocks_sent"] == len(FILLED) and result["blocks_skipped"] == total - len(FILLED)
    assert result["bytes_sent"] == len(FILLED) * BLOCK and result["disk_bytes"] == DISK

    # the snapshot's blocks read back are the disk's
    ebs = client(aws, "ebs")
    snapshot = result["snapshot"]
    listed = ebs.list_snapshot_blocks(SnapshotId=snapshot)["Blocks"]
    assert sorted(int(b["BlockIndex"]) for b in listed) == sorted(FILLED)
    for index, data in FILLED.items():
        block = ebs.get_snapshot_block(SnapshotId=snapshot, BlockIndex=index, BlockToken="x")
        assert block["BlockData"].read() == data + bytes(BLOCK - len(data))
    puts = {op.rsplit("/", 1)[1]: fields["checksum"] for op, fields, _ in aws.seen if op.startswith("PUT ")}
    assert sorted(map(int, puts)) == sorted(FILLED)  # one PutSnapshotBlock per block holding data
    block = FILLED[3] + bytes(BLOCK - len(FILLED[3]))
    assert puts["3"] == base64.b64encode(hashlib.sha256(block).digest()).decode()

    # RegisterImage as it went over the wire
    registered = aws.fields("RegisterImage")
    assert registered["Architecture"] == "x86_64" and registered["BootMode"] == "uefi-preferred"
    assert registered["EnaSupport"] == "true" and registered["VirtualizationType"] == "hvm"
    assert registered["BlockDeviceMapping.1.Ebs.SnapshotId"] == snapshot
    assert registered["Name"] == "kiln-aws-1.2.3-amd64"

    for region in REGIONS:
        ec2 = client(aws, "ec2", region)
        ami = result["images"][region]
        [image] = ec2.describe_images(ImageIds=[ami])["Images"]
        tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
        assert (
            tags["kiln:version"] == "1.2.3" and tags["kiln:arch"] == "amd64" and len(tags["kiln:manifest-sha256"]) == 64
        )
        permissions = ec2.describe_image_attribute(ImageId=ami, Attribute="launchPermission")["LaunchPermissions"]
        assert {"Group": "all"} in permissions
        parameter = client(aws, "ssm", region).get_parameter(Name="/kiln/stable/amd64/latest")["Parameter"]
        assert parameter["Value"] == ami and result["parameters"][region] == "/kiln/stable/amd64/latest"

    # the same image again: found by its tag, nothing uploaded or registered
    before = len(aws.seen)
    again = kiln(aws, "aws", str(directory), "--regions", regions, "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["reused"] is True and second["images"] == result["images"]
    later = [op for op, _, _ in aws.seen[before:]]
    assert "StartSnapshot" not in str(later) and "RegisterImage" not in later and "CopyImage" not in later


def test_a_failure_midway_says_what_is_left_and_cleanup_removes_it(aws: Proxy, tmp_path: Path) -> None:
    directory = output_dir(tmp_path / "aws", version="2.0.0")
    aws.refuse = "RegisterImage"
    try:
        failed = kiln(aws, "aws", str(directory))
    finally:
        aws.refuse = ""
    assert failed.returncode == 1, failed.stderr
    assert "register_image in us-east-1 failed" in failed.stderr and "refused by the test" in failed.stderr
    assert "left behind: snapshot snap-" in failed.stderr and "--cleanup" in failed.stderr
    snapshot = failed.stderr.split("left behind: snapshot ", 1)[1].split()[0].rstrip(",(")
    ec2 = client(aws, "ec2")
    assert ec2.describe_snapshots(SnapshotIds=[snapshot])["Snapshots"]
    cleaned = kiln(aws, "aws", str(directory), "--cleanup", "--json")
    assert cleaned.returncode == 0, cleaned.stderr
    assert snapshot in json.loads(cleaned.stdout)["removed"][REGIONS[0]]
    digest_filter = [{"Name": "tag:kiln:version", "Values": ["2.0.0"]}]
    assert ec2.describe_snapshots(OwnerIds=["self"], Filters=digest_filter)["Snapshots"] == []


def test_bad_input_is_refused_before_anything_is_made(aws: Proxy, tmp_path: Path) -> None:
    before = len(aws.seen)
    missing = kiln(aws, "aws", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no manifest.json" in missing.stderr
    directory = output_dir(tmp_path / "aws")
    unknown = kiln(aws, "aws", str(directory), "--regions", "us-east-1,moon-base-1")
    assert unknown.returncode == 2 and "unknown AWS region(s): moon-base-1" in unknown.stderr
    other = tmp_path / "gcp"
    output_dir(other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["profile"]["platform"] = "gcp"
    (other / "manifest.json").write_text(json.dumps(manifest))
    wrong = kiln(aws, "aws", str(other))
    assert wrong.returncode == 2 and "for platform 'gcp', not 'aws'" in wrong.stderr
    assert len(aws.seen) == before  # nothing reached AWS


def test_credentials_aws_refuses_are_a_clear_error(tmp_path: Path) -> None:
    """moto with its authentication on (INITIAL_NO_AUTH_ACTION_COUNT=0) knows no access key."""
    process, port = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        directory = output_dir(tmp_path / "aws")
        result = kiln(None, "aws", str(directory), env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    finally:
        process.kill()
        process.wait()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "AWS refused the credentials" in result.stderr and "Traceback" not in result.stderr
