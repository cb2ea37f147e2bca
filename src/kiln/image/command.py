"""`kiln image PROFILE...` (profiles) and `kiln image --output kernel,initramfs` (no profile)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.image import kernel_initramfs
from kiln.pkg.graph import Graph

DEFAULT_PLATFORM = "linux/amd64"  # without profiles and without --platform


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
    kernel_initramfs.add_arguments(parser)


def run(args: argparse.Namespace, load: Callable[[str], Graph]) -> int:
    """Profiles given: build them all; none: the kernel + initramfs output of the booting-system issue.

    The arch: a profile's `arch:`, else --platform's (args.platform, None when not given), else amd64;
    a profile's arch and --platform that disagree are refused (profile.resolve_platform).
    """
    if not args.profiles:
        return kernel_initramfs.run(load(args.platform or DEFAULT_PLATFORM), args)
    from kiln.image.imager import build_packages, check_packages, make_images, with_release_version
    from kiln.image.profile import load_profiles, resolve_platform

    if args.extension or args.package or args.output != "kernel,initramfs":
        raise InputError(
            "--output, --extension and --package apply without profiles; a profile names its "
            "extensions and packages under input:"
        )
    profiles = resolve_platform(load_profiles(args.profiles, Path(args.profiles_dir)), args.platform)
    platforms = sorted({p.platform_spec for p in profiles})
    if len(platforms) > 1:
        raise InputError(f"profiles for several platforms ({', '.join(platforms)}): make them one platform per run")
    graph = load(platforms[0])
    check_packages(profiles, graph)
    profiles = with_release_version(profiles, graph)
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
