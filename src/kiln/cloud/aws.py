"""An AWS AMI from a `kiln image` aws output directory, without S3 or an import job.

The disk goes straight into an EBS snapshot through the EBS direct APIs: StartSnapshot, one
PutSnapshotBlock per 512 KiB block that holds anything but zeros (each with its SHA-256, in
parallel), CompleteSnapshot. RegisterImage then makes the AMI (hvm, ENA, the boot modes the disk
supports), CopyImage puts it in the other regions, and with --public every copy gets a public
launch permission; with --channel an SSM parameter per region names the newest AMI of the channel
and arch (/kiln/<channel>/<arch>/latest).

Everything made is tagged kiln:manifest-sha256 (the output directory's manifest.json: one release's
image), kiln:version, kiln:profile, kiln:arch and kiln:schematic, so a second upload of the same
image finds the AMIs and does nothing, and `cleanup` finds what a failed upload left. Credentials
come from boto3's usual chain (environment, profile, instance role); AWS_ENDPOINT_URL points it at
an emulator.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.cloud.artifact import (
    BLOCK,
    DEFAULT_NAME,
    CloudImage,
    UploadFailed,
    blocks,
    image_name,
    send_in_parallel,
    size_in_gib,
)
from kiln.cloud.result import result_json
from kiln.core.errors import InputError

ARCHITECTURES = {"amd64": "x86_64", "arm64": "arm64"}
BOOT_MODES = {"amd64": "uefi-preferred", "arm64": "uefi"}  # amd64 disks boot BIOS and UEFI; arm64 UEFI only
ROOT_DEVICE = "/dev/xvda"
DIGEST_TAG = "kiln:manifest-sha256"


@dataclass
class Options:
    regions: list[str]  # the first is where the snapshot is written; the image is copied to the others
    public: bool = False
    name_template: str = DEFAULT_NAME
    channel: str | None = None
    workers: int = 8


@dataclass
class Result:
    """What an upload made or found, for `--json`."""

    images: dict[str, str] = field(default_factory=dict)  # region -> AMI id
    snapshot: str = ""
    reused: bool = False  # the image was there already: nothing was uploaded
    parameters: dict[str, str] = field(default_factory=dict)  # region -> SSM parameter name
    bytes_sent: int = 0
    blocks_sent: int = 0
    blocks_skipped: int = 0
    disk_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return result_json(self)


def tags(image: CloudImage) -> list[dict[str, str]]:
    return [
        {"Key": DIGEST_TAG, "Value": image.manifest_sha256},
        {"Key": "kiln:version", "Value": image.version},
        {"Key": "kiln:profile", "Value": image.profile},
        {"Key": "kiln:arch", "Value": image.arch},
        {"Key": "kiln:schematic", "Value": image.schematic or "none"},
    ]


class Aws:
    """boto3 clients per region, and each call wrapped so a failure names itself."""

    def __init__(self, regions: list[str]) -> None:
        import boto3  # an optional extra (kiln[aws]): only uploads need it

        self.session = boto3.session.Session()
        known = set(self.session.get_available_regions("ec2"))
        unknown = [r for r in regions if r not in known]
        if not regions or unknown:
            raise InputError(f"unknown AWS region(s): {', '.join(unknown) or '(none given)'}")
        self.left: list[str] = []  # what a failure leaves behind, said with the error

    def client(self, service: str, region: str) -> Any:
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 8}, max_pool_connections=32)
        return self.session.client(service, region_name=region, config=config)

    def call(self, service: Any, operation: str, region: str, **params: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(service, operation)(**params)
        except (ClientError, BotoCoreError) as exc:
            left = f"; left behind: {', '.join(self.left)} (kiln release upload aws --cleanup removes it)"
            raise UploadFailed(f"{operation} in {region} failed: {exc}" + (left if self.left else "")) from None

    def check_credentials(self, region: str) -> None:
        """Fail early, before anything is made, when AWS does not take the credentials."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client("sts", region).get_caller_identity()
        except (ClientError, BotoCoreError) as exc:
            raise InputError(f"AWS refused the credentials ({exc}); check the profile or environment") from None


def upload(image: CloudImage, options: Options, work: Path, say: Callable[[str], None]) -> Result:
    """Make (or find) the image's AMI in every region of `options`, and what the options add."""
    aws = Aws(options.regions)
    home = options.regions[0]
    aws.check_credentials(home)
    result = Result()
    began = time.monotonic()
    ec2 = aws.client("ec2", home)
    found = find_image(aws, ec2, home, image)
    if found:
        say(f"{home}: {found} is this image already (tag {DIGEST_TAG}); nothing to upload")
        result.images[home], result.reused = found, True
    else:
        raw = image.raw(work)
        result.disk_bytes = raw.stat().st_size
        result.snapshot = write_snapshot(aws, home, image, raw, options.workers, result, say)
        result.seconds["snapshot"] = time.monotonic() - began
        result.images[home] = register(aws, ec2, home, image, result.snapshot, options.name_template)
        say(f"{home}: registered {result.images[home]}")
    mark = time.monotonic()
    for region in options.regions[1:]:
        result.images[region] = copy_to(aws, region, home, result.images[home], image, options.name_template, say)
    result.seconds["copy"] = time.monotonic() - mark
    for region, ami in result.images.items():
        client = aws.client("ec2", region)
        if options.public:
            aws.call(
                client, "modify_image_attribute", region, ImageId=ami, LaunchPermission={"Add": [{"Group": "all"}]}
            )
        if options.channel:
            name = f"/kiln/{options.channel}/{image.arch}/latest"
            ssm = aws.client("ssm", region)
            aws.call(
                ssm,
                "put_parameter",
                region,
                Name=name,
                Value=ami,
                Type="String",
                DataType="aws:ec2:image",
                Overwrite=True,
            )
            result.parameters[region] = name
    result.seconds["total"] = time.monotonic() - began
    return result


def find_image(aws: Aws, ec2: Any, region: str, image: CloudImage) -> str | None:
    """This account's AMI of this image (by its manifest digest), if one is there."""
    answer = aws.call(
        ec2,
        "describe_images",
        region,
        Owners=["self"],
        Filters=[{"Name": f"tag:{DIGEST_TAG}", "Values": [image.manifest_sha256]}],
    )
    usable = [i for i in answer.get("Images", []) if i.get("State") in ("available", "pending")]
    return str(sorted(usable, key=lambda i: str(i["ImageId"]))[0]["ImageId"]) if usable else None


def write_snapshot(
    aws: Aws, region: str, image: CloudImage, raw: Path, workers: int, result: Result, say: Callable[[str], None]
) -> str:
    """The disk as an EBS snapshot: only the blocks that are not all zeros, in parallel; its id."""
    ebs = aws.client("ebs", region)
    started = aws.call(
        ebs,
        "start_snapshot",
        region,
        VolumeSize=size_in_gib(raw),
        Tags=tags(image),
        Description=f"Kiln {image.profile} {image.version} {image.arch}",
        ClientToken=image.manifest_sha256,  # a retried start gives the same snapshot
        Timeout=60,
    )
    snapshot = str(started["SnapshotId"])
    aws.left.append(f"snapshot {snapshot}")
    total = -(-raw.stat().st_size // BLOCK)

    def put(index: int, data: bytes) -> None:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        aws.call(
            ebs,
            "put_snapshot_block",
            region,
            SnapshotId=snapshot,
            BlockIndex=index,
            BlockData=data,
            DataLength=BLOCK,
            Checksum=checksum,
            ChecksumAlgorithm="SHA256",
        )

    # a failed call raises UploadFailed here, once every block was tried
    result.blocks_sent, result.bytes_sent = send_in_parallel(blocks(raw), put, workers)
    result.blocks_skipped = total - result.blocks_sent
    say(f"{region}: {snapshot}: {result.blocks_sent} blocks sent, {result.blocks_skipped} of zeros skipped")
    aws.call(ebs, "complete_snapshot", region, SnapshotId=snapshot, ChangedBlocksCount=result.blocks_sent)
    waiter = aws.client("ec2", region).get_waiter("snapshot_completed")
    try:
        waiter.wait(SnapshotIds=[snapshot], WaiterConfig={"Delay": 5, "MaxAttempts": 360})
    except Exception as exc:  # botocore's WaiterError: the snapshot never completed
        raise UploadFailed(f"snapshot {snapshot} in {region} did not complete: {exc}") from None
    return snapshot


def register(aws: Aws, ec2: Any, region: str, image: CloudImage, snapshot: str, template: str) -> str:
    """RegisterImage on the snapshot; tagged both ways (at registration and after), so an emulator
    that ignores TagSpecifications still tags it."""
    name = image_name(template, image)
    answer = aws.call(
        ec2,
        "register_image",
        region,
        Name=name,
        Description=f"Kiln {image.profile} {image.version} ({image.arch})",
        Architecture=ARCHITECTURES[image.arch],
        RootDeviceName=ROOT_DEVICE,
        BlockDeviceMappings=[
            {
                "DeviceName": ROOT_DEVICE,
                "Ebs": {"SnapshotId": snapshot, "VolumeType": "gp3", "DeleteOnTermination": True},
            }
        ],
        VirtualizationType="hvm",
        EnaSupport=True,
        BootMode=BOOT_MODES[image.arch],
        ImdsSupport="v2.0",
        TagSpecifications=[{"ResourceType": "image", "Tags": tags(image)}],
    )
    ami = str(answer["ImageId"])
    aws.left.append(f"image {ami} in {region}")
    aws.call(ec2, "create_tags", region, Resources=[ami], Tags=tags(image))
    return ami


def copy_to(
    aws: Aws, region: str, home: str, source: str, image: CloudImage, template: str, say: Callable[[str], None]
) -> str:
    """The image in `region`: the copy made earlier, or a new CopyImage of `source`."""
    ec2 = aws.client("ec2", region)
    found = find_image(aws, ec2, region, image)
    if found:
        say(f"{region}: {found} is this image already")
        return found
    answer = aws.call(
        ec2, "copy_image", region, SourceImageId=source, SourceRegion=home, Name=image_name(template, image)
    )
    ami = str(answer["ImageId"])
    aws.left.append(f"image {ami} in {region}")
    aws.call(ec2, "create_tags", region, Resources=[ami], Tags=tags(image))
    say(f"{region}: copied {source} as {ami}")
    return ami


def cleanup(image: CloudImage, regions: list[str], say: Callable[[str], None]) -> dict[str, list[str]]:
    """Deregister every AMI and delete every snapshot tagged with this image's digest, per region."""
    aws = Aws(regions)
    aws.check_credentials(regions[0])
    removed: dict[str, list[str]] = {}
    for region in regions:
        ec2 = aws.client("ec2", region)
        gone: list[str] = []
        tagged = [{"Name": f"tag:{DIGEST_TAG}", "Values": [image.manifest_sha256]}]
        # the AMIs first: a snapshot an AMI still uses cannot be deleted
        for describe, owners, listed, key, remove in (
            ("describe_images", "Owners", "Images", "ImageId", "deregister_image"),
            ("describe_snapshots", "OwnerIds", "Snapshots", "SnapshotId", "delete_snapshot"),
        ):
            answer = aws.call(ec2, describe, region, **{owners: ["self"]}, Filters=tagged)
            for found in answer.get(listed, []):
                aws.call(ec2, remove, region, **{key: found[key]})
                gone.append(str(found[key]))
        for item in gone:
            say(f"{region}: removed {item}")
        removed[region] = gone
    return removed
