"""`kiln release upload aws|azure DIR`: the verb over kiln.cloud.aws and kiln.cloud.azure (arguments,
progress, the JSON result)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from kiln.cloud import aws, azure
from kiln.cloud.artifact import DEFAULT_NAME, CloudImage
from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.verb import Context

CLOUDS = ("aws", "azure")
RAW_FORMATS = (".raw",)
VHD_FORMATS = (".vhd",)
# Each cloud's own options and their defaults: given for the other cloud, they are refused, not ignored.
ONLY_FOR: dict[str, dict[str, object]] = {
    "aws": {"regions": None, "public": False, "channel": None, "cleanup": False},
    "azure": {"container": None, "resource_group": None, "gallery": None},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "publish a kiln image output directory to a cloud (docs/clouds.md)"
    parser.add_argument("cloud", choices=CLOUDS, help="the cloud to publish to")
    parser.add_argument(
        "directory", type=Path, metavar="DIR", help="a kiln image output directory (e.g. _out/aws, _out/azure)"
    )
    parser.add_argument(
        "--name-template",
        default=DEFAULT_NAME,
        help=f"the AMI's or the Azure image's name; the blob's with .vhd (default {DEFAULT_NAME})",
    )
    parser.add_argument("--workers", type=int, default=8, help="blocks or page ranges uploaded at once (default 8)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_aws_arguments(parser.add_argument_group("aws"))
    add_azure_arguments(parser.add_argument_group("azure"))


def add_aws_arguments(group: Any) -> None:
    group.add_argument(
        "--regions",
        metavar="R1,R2",
        help="where the image goes: the first gets the snapshot, the others a copy "
        "(default: the region of the AWS configuration: AWS_DEFAULT_REGION, ~/.aws/config)",
    )
    group.add_argument("--public", action="store_true", help="let every account launch the image")
    group.add_argument("--channel", help="name the image in the SSM parameter /kiln/CHANNEL/ARCH/latest")
    group.add_argument(
        "--cleanup",
        action="store_true",
        help="instead of uploading: remove every AMI and snapshot of this image (what a failed upload left)",
    )


def add_azure_arguments(group: Any) -> None:
    group.add_argument(
        "--container",
        metavar="URL",
        help="the blob container the VHD goes to, https://ACCOUNT.blob.core.windows.net/CONTAINER, with a SAS "
        f"after ? (read, create, write) or the account in {azure.CONNECTION_STRING}",
    )
    group.add_argument("--resource-group", help="the resource group in the printed az command that makes the image")
    group.add_argument(
        "--gallery", help="make the printed command an Azure Compute Gallery image version in this gallery"
    )


def regions(args: argparse.Namespace) -> list[str]:
    if args.regions:
        return [r.strip() for r in args.regions.split(",") if r.strip()]
    import boto3  # the region of the AWS configuration: AWS_DEFAULT_REGION, ~/.aws/config

    default = boto3.session.Session().region_name
    if not default:
        raise InputError("no AWS region: give --regions, or set one in the AWS configuration (AWS_DEFAULT_REGION)")
    return [str(default)]


def check_options(args: argparse.Namespace) -> None:
    """Options of the other cloud are refused: a --regions given to an Azure upload is a mistake to say."""
    if not 1 <= args.workers <= 64:
        raise InputError(f"--workers {args.workers}: choose 1 to 64")
    for cloud, options in ONLY_FOR.items():
        given = [name for name, default in options.items() if getattr(args, name) != default]
        if cloud != args.cloud and given:
            flag = "--" + given[0].replace("_", "-")
            raise InputError(f"{flag} is for kiln release upload {cloud}, not {args.cloud}")
    if args.cloud == "azure" and not args.container:
        raise InputError("kiln release upload azure needs --container URL (the blob container the VHD goes to)")


def run(ctx: Context[object]) -> int:
    args = ctx.args
    check_options(args)
    if args.cloud == "azure":
        return run_azure(args)
    image = CloudImage.read(args.directory, "aws", RAW_FORMATS)
    chosen = regions(args)
    if args.cleanup:
        removed = aws.cleanup(image, chosen, say_line)
        if args.json:
            print(json.dumps({"removed": removed}, indent=2))
        return 0
    options = aws.Options(chosen, args.public, args.name_template, args.channel, args.workers)
    with tempfile.TemporaryDirectory(prefix="kiln-upload-") as work:
        result = aws.upload(image, options, Path(work), say_line)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        for region, ami in result.images.items():
            print(f"{region}  {ami}")
    return 0


def run_azure(args: argparse.Namespace) -> int:
    image = CloudImage.read(args.directory, "azure", VHD_FORMATS)
    options = azure.Options(args.container, args.name_template, args.resource_group, args.gallery, args.workers)
    with tempfile.TemporaryDirectory(prefix="kiln-upload-") as work:
        result = azure.upload(image, options, Path(work), say_line)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print(result.blob)
        print("# the image: Azure's management API has no emulator to test against, so Kiln leaves this to az")
        for command in result.commands:
            print(command)
    return 0
