"""`kiln release upload aws DIR`: the verb over kiln.cloud.aws (arguments, progress, the JSON result)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from kiln.cloud import aws
from kiln.cloud.artifact import CloudImage
from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.verb import Context

CLOUDS = ("aws",)
RAW_FORMATS = (".raw",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "publish a kiln image output directory to a cloud (docs/clouds.md)"
    parser.add_argument("cloud", choices=CLOUDS, help="the cloud to publish to")
    parser.add_argument("directory", type=Path, metavar="DIR", help="a kiln image output directory (e.g. _out/aws)")
    parser.add_argument(
        "--regions",
        metavar="R1,R2",
        help="where the image goes: the first gets the snapshot, the others a copy "
        "(default: the region of the AWS configuration: AWS_DEFAULT_REGION, ~/.aws/config)",
    )
    parser.add_argument("--public", action="store_true", help="let every account launch the image")
    parser.add_argument(
        "--name-template", default=aws.DEFAULT_NAME, help=f"the AMI's name (default {aws.DEFAULT_NAME})"
    )
    parser.add_argument("--channel", help="name the image in the SSM parameter /kiln/CHANNEL/ARCH/latest")
    parser.add_argument("--workers", type=int, default=8, help="blocks uploaded at once (default 8)")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="instead of uploading: remove every AMI and snapshot of this image (what a failed upload left)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def regions(args: argparse.Namespace) -> list[str]:
    if args.regions:
        return [r.strip() for r in args.regions.split(",") if r.strip()]
    import boto3  # the region of the AWS configuration: AWS_DEFAULT_REGION, ~/.aws/config

    default = boto3.session.Session().region_name
    if not default:
        raise InputError("no AWS region: give --regions, or set one in the AWS configuration (AWS_DEFAULT_REGION)")
    return [str(default)]


def run(ctx: Context[object]) -> int:
    args = ctx.args
    if not 1 <= args.workers <= 64:
        raise InputError(f"--workers {args.workers}: choose 1 to 64")
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
