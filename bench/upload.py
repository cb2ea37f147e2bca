"""Benchmark: `kiln release upload` of a realistic disk to AWS's and Azure's emulators, against plain loops.

The disk is synthetic, made here without building images: a 2 GiB sparse raw disk holding about 25 MiB
of random (incompressible, like squashfs) data in extents scattered at fixed pseudo-random offsets, with
a GPT's sectors at both ends: the shape of a shipped cloud image (the aws profile's 1 GiB disk has 51 of
its 2,048 blocks of 512 KiB with data), twice as large. It is written as the shipped profiles write it,
by Kiln's own writers: `aws-amd64.raw.zst` (chunked zstd) and `azure-amd64.vhd` (a fixed VHD), each
beside a manifest.json.

- AWS: kiln.cloud.aws.upload against moto's server (as tests/integration/test_release_upload.py runs
  it): from the output directory to a completed EBS snapshot (the zstd unpacked, the non-zero blocks
  put eight at a time), then the AMI. Beside it, a plain loop of PutSnapshotBlock calls in the same run:
  every 512 KiB block of the raw disk (no skipping), one after another, between StartSnapshot and
  CompleteSnapshot; it reads the raw disk directly, so it does not pay for unpacking.
- Azure: kiln.cloud.azure.upload against Azurite (as test_release_upload_azure.py runs it): the VHD's
  runs of non-zero pages as a page blob. Beside it, a plain loop of Put Page calls: every 4 MiB of the
  VHD, one after another.

Both emulators run on this machine and hold what they are sent (moto in memory, Azurite on disk), so the
figures measure the requests and what each side does per byte, not a network. Appends to
bench/results/upload.json. Run: `.venv/bin/python bench/upload.py` (needs `.[test]`, moto_server, azurite).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.services import AZURITE_ACCOUNT, AZURITE_KEY, Azurite, azurite  # noqa: E402
from tests.integration.test_release_upload import CREDENTIALS, start_moto  # noqa: E402

from kiln.cloud import aws, azure  # noqa: E402
from kiln.cloud.artifact import BLOCK, CloudImage  # noqa: E402
from kiln.core.hashing import file_sha256  # noqa: E402
from kiln.image.assets import BootAssets  # noqa: E402
from kiln.image.compress import compress  # noqa: E402
from kiln.image.outputs.formats import convert  # noqa: E402

RESULTS = ROOT / "bench/results/upload.json"
DISK = 2 << 30
DATA = 25 << 20  # bytes of data in the extents
SEED = 20261201
REGION = "us-east-1"
CONTAINER = "bench"
MIB = 1 << 20


def synthetic_disk(path: Path) -> int:
    """The 2 GiB sparse raw disk; returns how many of its bytes hold data."""
    rng = random.Random(SEED)
    written = 0
    with path.open("wb") as disk:
        disk.truncate(DISK)
        disk.write(rng.randbytes(34 * 512))  # the primary GPT: protective MBR, header, entries
        disk.seek(DISK - 33 * 512)
        disk.write(rng.randbytes(33 * 512))  # the backup GPT
        written += 67 * 512
        while written < DATA:
            size = min(rng.choice((16, 64, 256, 1024, 2048, 4096)) << 10, DATA - written)
            disk.seek(rng.randrange(1 << 20, DISK - (8 << 20), 4096))
            disk.write(rng.randbytes(size))
            written += size
    return written


def output_dir(where: Path, platform: str, artifact: Path) -> Path:
    manifest = {
        "profile": {"arch": "amd64", "kind": "image", "name": platform, "platform": platform, "version": "1.0.0"},
        "artifacts": [{"path": artifact.name, "sha256": file_sha256(artifact), "size": artifact.stat().st_size}],
        "inputs": {},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    return where


def outputs(raw: Path, work: Path) -> tuple[Path, Path]:
    """The aws and azure output directories of the raw disk, written by Kiln's own writers."""
    kernel, initrd = work / "vmlinuz", work / "initramfs.zst"
    kernel.write_bytes(b"bench kernel\n")
    initrd.write_bytes(b"bench initramfs\n")
    assets = BootAssets.make(kernel, initrd, "console=ttyS0", "1.0.0", 1704067200)
    azure_dir, aws_dir = work / "azure", work / "aws"
    azure_dir.mkdir()
    aws_dir.mkdir()
    vhd = convert(raw, "vhd", azure_dir / "azure-amd64.vhd", assets)
    copy = aws_dir / "aws-amd64.raw"
    subprocess.run(["cp", "--sparse=always", str(raw), str(copy)], check=True)
    zst = compress(copy, ".zst", assets.epoch, aws_dir / "aws-amd64.raw.zst")
    return output_dir(aws_dir, "aws", zst), output_dir(azure_dir, "azure", vhd)


@contextmanager
def moto() -> Iterator[int]:
    process, port = start_moto()
    try:
        yield port
    finally:
        process.kill()
        process.wait()


def bench_aws(directory: Path, raw: Path, work: Path) -> dict[str, Any]:
    with moto() as port:
        os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": REGION})
        image = CloudImage.read(directory, "aws", (".raw",))
        result = aws.upload(image, aws.Options([REGION]), work, lambda line: None)
        loop = aws_plain_loop(raw)
    total = DISK // BLOCK
    kiln_s = result.seconds["snapshot"]
    return {
        "kiln": {
            "bytes_sent": result.bytes_sent,
            "blocks_sent": result.blocks_sent,
            "blocks_of_the_disk": total,
            "seconds_to_snapshot": round(kiln_s, 2),
            "seconds_with_ami": round(result.seconds["total"], 2),
            "disk_blocks_per_second": round(total / kiln_s),
            "blocks_sent_per_second": round(result.blocks_sent / kiln_s, 1),
        },
        "plain_loop": loop,
        "plain_loop_over_kiln": round(loop["seconds"] / kiln_s, 1),
    }


def aws_plain_loop(raw: Path) -> dict[str, Any]:
    """StartSnapshot, PutSnapshotBlock for every block of the disk in order, CompleteSnapshot."""
    import boto3

    ebs = boto3.client("ebs", region_name=REGION)
    began = time.monotonic()
    snapshot = ebs.start_snapshot(VolumeSize=DISK >> 30, Timeout=60)["SnapshotId"]
    count = 0
    with raw.open("rb") as disk:
        while data := disk.read(BLOCK):
            checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
            ebs.put_snapshot_block(
                SnapshotId=snapshot,
                BlockIndex=count,
                BlockData=data,
                DataLength=BLOCK,
                Checksum=checksum,
                ChecksumAlgorithm="SHA256",
            )
            count += 1
    ebs.complete_snapshot(SnapshotId=snapshot, ChangedBlocksCount=count)
    seconds = time.monotonic() - began
    return {
        "blocks": count,
        "bytes_sent": count * BLOCK,
        "seconds": round(seconds, 2),
        "blocks_per_second": round(count / seconds, 1),
    }


def bench_azure(directory: Path, work: Path) -> dict[str, Any]:
    with contextmanager(azurite)(CONTAINER) as emulator:
        image = CloudImage.read(directory, "azure", (".vhd",))
        result = azure.upload(image, azure.Options(sas_url(emulator)), work, lambda line: None)
        loop = azure_plain_loop(emulator, image.artifact)
    kiln_s = result.seconds["upload"]
    return {
        "kiln": {
            "bytes_sent": result.bytes_sent,
            "ranges_sent": result.ranges_sent,
            "disk_bytes": result.disk_bytes,
            "seconds": round(kiln_s, 2),
            "disk_mib_per_second": round(result.disk_bytes / MIB / kiln_s),
        },
        "plain_loop": loop,
        "plain_loop_over_kiln": round(loop["seconds"] / kiln_s, 1),
    }


def sas_url(emulator: Azurite) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        AZURITE_ACCOUNT,
        CONTAINER,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, create=True, write=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    return f"{emulator.account_url}/{CONTAINER}?{sas}"


def azure_plain_loop(emulator: Azurite, vhd: Path) -> dict[str, Any]:
    """A page blob of the VHD's size, then Put Page for every 4 MiB of it in order."""
    client = emulator.service().get_blob_client(CONTAINER, "plain-loop.vhd")
    size = vhd.stat().st_size
    began = time.monotonic()
    client.create_page_blob(size)
    count = 0
    with vhd.open("rb") as disk:
        offset = 0
        while data := disk.read(azure.MAX_PUT):
            client.upload_page(data, offset, len(data), validate_content="md5")
            offset += len(data)
            count += 1
    seconds = time.monotonic() - began
    return {
        "puts": count,
        "bytes_sent": size,
        "seconds": round(seconds, 2),
        "puts_per_second": round(count / seconds, 1),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-upload-") as tmp:
        work = Path(tmp)
        raw = work / "disk.raw"
        data = synthetic_disk(raw)
        aws_dir, azure_dir = outputs(raw, work)
        (work / "aws-work").mkdir()
        (work / "azure-work").mkdir()
        load_before = os.getloadavg()[0]
        aws_figures = bench_aws(aws_dir, raw, work / "aws-work")
        azure_figures = bench_azure(azure_dir, work / "azure-work")
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "disk": f"synthetic: {DISK >> 30} GiB sparse raw, {data / MIB:.1f} MiB of data (seed {SEED})",
        "disk_bytes": DISK,
        "aws": aws_figures,
        "azure": azure_figures,
        "cores": os.cpu_count(),
        "load_average_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }
    report(result)
    history = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*history, result], indent=2) + "\n")


def report(result: dict[str, Any]) -> None:
    a, z = result["aws"], result["azure"]
    print(result["disk"])
    print(
        f"aws   kiln: {a['kiln']['blocks_sent']} of {a['kiln']['blocks_of_the_disk']} blocks, "
        f"{a['kiln']['bytes_sent'] / MIB:.1f} MiB of {DISK // MIB} MiB, in {a['kiln']['seconds_to_snapshot']} s "
        f"({a['kiln']['disk_blocks_per_second']} disk blocks/s, {a['kiln']['blocks_sent_per_second']} sent/s)"
    )
    print(
        f"aws   plain PutSnapshotBlock loop: {a['plain_loop']['blocks']} blocks in {a['plain_loop']['seconds']} s "
        f"({a['plain_loop']['blocks_per_second']} blocks/s): {a['plain_loop_over_kiln']} x kiln's time"
    )
    print(
        f"azure kiln: {z['kiln']['ranges_sent']} page ranges, {z['kiln']['bytes_sent'] / MIB:.1f} MiB of "
        f"{z['kiln']['disk_bytes'] / MIB:.0f} MiB, in {z['kiln']['seconds']} s"
    )
    print(
        f"azure plain Put Page loop: {z['plain_loop']['puts']} puts of 4 MiB in {z['plain_loop']['seconds']} s: "
        f"{z['plain_loop_over_kiln']} x kiln's time"
    )


if __name__ == "__main__":
    main()
