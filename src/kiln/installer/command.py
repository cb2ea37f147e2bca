"""`kiln image PROFILE...` (profiles) and `kiln image --output kernel,initramfs` (no profile)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.pkg.graph import Graph
from kiln.rootfs import command as rootfs_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "profiles",
        nargs="*",
        metavar="PROFILE",
        help="profiles by name (in --profiles-dir) or path: iso metal aws ...; without one, "
        "--output kernel,initramfs is written",
    )
    parser.add_argument(
        "--profiles-dir",
        default="profiles",
        metavar="DIR",
        help="where profile names are looked up (default ./profiles)",
    )
    rootfs_command.add_arguments(parser)


def run(args: argparse.Namespace, load: Callable[[str], Graph]) -> int:
    """Profiles given: build them all; none: the kernel + initramfs output of the booting-system issue."""
    if not args.profiles:
        return rootfs_command.run(load(args.platform), args)
    from kiln.installer.imager import build_packages, check_packages, make_images
    from kiln.installer.profile import load_profiles

    if args.extension or args.package or args.output != "kernel,initramfs":
        raise InputError(
            "--output, --extension and --package apply without profiles; a profile names its "
            "extensions and packages under input:"
        )
    profiles = load_profiles(args.profiles, Path(args.profiles_dir))
    platforms = sorted({p.platform_spec for p in profiles})
    if len(platforms) > 1:
        raise InputError(f"profiles for several platforms ({', '.join(platforms)}): make them one platform per run")
    graph = load(platforms[0])
    check_packages(profiles, graph)
    built = build_packages(profiles, graph, args.jobs, json_output=args.json)
    results = make_images(profiles, built, Path(args.out or "_out"), args.jobs, say_line)
    if args.json:
        print(
            json.dumps(
                {
                    r.profile.name: {
                        "directory": str(r.directory),
                        "seconds": round(r.seconds, 2),
                        "artifacts": r.artifacts,
                    }
                    for r in results
                },
                indent=2,
            )
        )
        return 0
    for result in results:
        print(f"{result.profile.name}: {result.directory}/ ({result.seconds:.1f} s)")
        for artifact in result.artifacts:
            print(f"  {artifact['size'] / 1048576:10.2f} MiB  {artifact['path']}  {artifact['sha256'][:16]}")
    return 0


def add_install_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--profiles-dir", default="profiles", metavar="DIR", help="where profile names are looked up")
    parser.add_argument("--image", metavar="FILE", help="install this raw disk image instead of building the profile")
    parser.add_argument("--out", default="_out", metavar="DIR", help="where the profile's output is written")
    parser.add_argument("--jobs", "-j", type=int, default=2, metavar="N", help="packages built at once")


def run_install(args: argparse.Namespace, load: Callable[[str], Graph]) -> int:
    """Write a profile's raw disk onto --disk with the same `machined install` the installer image runs."""
    from kiln.installer.imager import MACHINED, build_packages, check_packages, make_images
    from kiln.installer.install import install_disk
    from kiln.installer.profile import load_profiles

    profile = load_profiles([args.profile], Path(args.profiles_dir))[0]
    if profile.kind != "image" or profile.disk_format != "raw" or profile.out_format != "raw":
        raise InputError(
            f"profile {profile.name} writes {profile.kind} ({profile.disk_format}, {profile.out_format}):"
            " kiln install needs a raw, uncompressed disk image profile such as metal",
            profile.location("output"),
        )
    graph = load(profile.platform_spec)
    check_packages([profile], graph)
    built = build_packages([] if args.image else [profile], graph, args.jobs, json_output=False, extra=(MACHINED,))
    if args.image:
        image = Path(args.image)
        if not image.is_file():
            raise InputError(f"--image {image}: no such file")
    else:
        result = make_images([profile], built, Path(args.out), args.jobs, say_line)[0]
        image = result.directory / profile.file_name
    install_disk(built.trees[MACHINED] / "usr/sbin/machined", image, Path(args.disk), wipe=args.wipe)
    print(f"installed {image} onto {args.disk}")
    return 0
