"""`kiln install --disk PATH`: a profile's raw disk written by the same `machined install` the installer image runs."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_jobs_option, add_profiles_dir_option, add_schematic_option, add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("--disk", required=True, metavar="PATH", help="the disk (or disk image file) to write")
    parser.add_argument(
        "--wipe",
        action="store_true",
        help="overwrite a disk that holds a partition table, a known signature or data in its "
        "first or last MiB (a disk in use is refused even so)",
    )
    parser.add_argument(
        "--profile",
        default="metal",
        metavar="PROFILE",
        help="the raw-disk profile whose layout is installed (default metal)",
    )
    add_profiles_dir_option(parser)
    parser.add_argument("--image", metavar="FILE", help="install this raw disk image instead of building the profile")
    add_schematic_option(parser, "customise the profile with this schematic (docs/factory.md)")
    parser.add_argument("--out", default="_out", metavar="DIR", help="where the profile's output is written")
    parser.add_argument("--json", action="store_true", help="what was installed where, as JSON")
    add_jobs_option(parser)


def run(ctx: Context[Graph]) -> int:
    """Write a profile's raw disk onto --disk with the same `machined install` the installer image runs."""
    from kiln.image.checks import MACHINED, check_packages, with_release_version
    from kiln.image.imager import MACHINED_PATH, build_packages, make_images, package_file
    from kiln.image.profile import load_profiles
    from kiln.installer.install import check_disk, install_disk

    args = ctx.args
    profile = load_profiles([args.profile], Path(args.profiles_dir))[0]
    if profile.kind != "image" or profile.disk_format != "raw":
        raise InputError(
            f"profile {profile.name} writes {profile.kind} ({profile.disk_format}, {profile.out_format}):"
            " kiln install needs a raw disk image profile such as metal",
            profile.location("output"),
        )
    if args.schematic is not None:
        from kiln.image.command import with_schematic

        profile = with_schematic([profile], args.schematic)[0]
    profile = replace(profile, out_format="raw")  # what is written to the disk, not what a release ships
    graph = ctx.graph(profile.platform_spec)
    check_packages([profile], graph)
    profile = with_release_version([profile], graph)[0]
    image = Path(args.image) if args.image else None
    if image is not None and not image.is_file():
        raise InputError(f"--image {image}: no such file")
    # machined alone first (usually stored): it checks the disk before the image is built. It runs from a
    # copy made without following a link, so a package linking it to a host program cannot run that instead.
    tree = build_packages([], graph, args.jobs, json_output=False, extra=(MACHINED,)).trees[MACHINED]
    with tempfile.TemporaryDirectory(prefix="kiln-install-") as tmp:
        machined = package_file(tree, MACHINED_PATH, Path(tmp) / "machined", 0o755, "machined")
        check_disk(machined, Path(args.disk), image if image is not None else profile.disk_size, wipe=args.wipe)
        if image is None:
            built = build_packages([profile], graph, args.jobs, json_output=False)
            result = make_images([profile], built, Path(args.out), args.jobs, say_line)[0]
            image = result.directory / profile.file_name
        install_disk(machined, image, Path(args.disk), wipe=args.wipe)
    if args.json:
        print(json.dumps({"image": str(image), "disk": args.disk, "profile": profile.name, "version": profile.version}))
    else:
        print(f"installed {image} onto {args.disk}")
    return 0
