"""`kiln image PROFILE...` (profiles) and `kiln image --kind kernel,initramfs` (no profile)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.project import RUNNERS
from kiln.core.verb import Context
from kiln.image import kernel_initramfs
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_keys_option, add_profiles_dir_option, add_schematic_option, add_tree_options
from kiln.pkg.variables import DEFAULT_PLATFORM

if TYPE_CHECKING:
    from kiln.image.profile import Profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument(
        "profiles",
        nargs="*",
        metavar="PROFILE",
        help="profiles by name (in --profiles-dir) or path: iso metal aws ...; without one, the project "
        "file's profiles:, else --kind kernel,initramfs is written",
    )
    add_profiles_dir_option(parser)
    add_keys_option(parser, "sign with the keys in DIR (kiln keys generate), in place of the profiles' keys:")
    add_schematic_option(
        parser,
        "customise every profile with this schematic (extensions, kernel arguments, machine config; "
        "docs/factory.md); its ID goes in the manifests, SBOMs and the rootfs",
    )
    parser.add_argument(
        "--cache-from",
        metavar="oci://HOST/REPO",
        help="with profiles: pull needed packages from this registry cache first (default: the project's cache_from:)",
    )
    parser.add_argument(
        "--runner",
        choices=RUNNERS,
        default="sandbox",
        help="with profiles: where the packages' steps run (default sandbox, whatever the project's runner: says): "
        "sandbox (bubblewrap), docker (an engine at DOCKER_HOST), buildkit; the provenance names it",
    )
    kernel_initramfs.add_arguments(parser)


def run(ctx: Context[Graph]) -> int:
    """Profiles given: build them all; none: the kernel + initramfs output of the booting-system issue.

    The arch: a profile's `arch:`, else --platform's (args.platform, None when not given), else amd64;
    a profile's arch and --platform that disagree are refused (profile.resolve_platform). --platform
    may list several platforms (linux/amd64,linux/arm64): then every profile is built for each
    (run_platforms); one platform keeps the single-platform layout.
    """
    from kiln.image.arch import split_platforms

    args, load = ctx.args, ctx.graph
    platforms = split_platforms(args.platform)
    project_profiles = list(ctx.project.profiles)
    if not args.profiles and project_profiles and args.kind is None and args.old_output is None:
        args.profiles = project_profiles  # the project file's `profiles:`, when the command names none
    if not args.profiles:
        if args.schematic is not None:
            raise InputError("--schematic customises profiles: name one (kiln image metal --schematic FILE)")
        if platforms is not None and len(platforms) > 1:
            raise InputError(
                f"--platform {args.platform}: several platforms need profiles (their outputs get the arch in "
                "their names); without a profile, build one platform per run"
            )
        return kernel_initramfs.run(load(platforms[0] if platforms else DEFAULT_PLATFORM), args)
    from kiln.image.checks import check_packages, with_release_version
    from kiln.image.imager import build_packages, make_images
    from kiln.image.manifest import write_release_sums
    from kiln.image.profile import load_profiles, resolve_platform
    from kiln.image.signing_keys import with_keys

    if args.package or args.kind is not None or args.old_output is not None:
        raise InputError(
            "--kind and --package apply without profiles; a profile names its "
            "kind under output: and its packages under input:"
        )
    loaded = with_keys(load_profiles(args.profiles, Path(args.profiles_dir)), args.keys)
    loaded = with_schematic(with_extensions(loaded, args.extension), args.schematic)
    if platforms is not None and len(platforms) > 1:
        return run_platforms(args, load, loaded, platforms)
    profiles = resolve_platform(loaded, platforms[0] if platforms else None)
    arches = sorted({p.platform_spec for p in profiles})
    if len(arches) > 1:
        raise InputError(
            f"profiles for several platforms ({', '.join(arches)}): make them one platform per run, or leave "
            f"arch out of them and build them all with --platform {','.join(arches)}"
        )
    graph = load(arches[0])
    check_packages(profiles, graph)
    profiles = with_release_version(profiles, graph)
    built = build_packages(
        profiles, graph, args.jobs, json_output=args.json, cache_from=args.cache_from, runner=args.runner
    )
    out = Path(args.out or "_out")
    results = make_images(profiles, built, out, args.jobs, say_line)
    sums = write_release_sums(out)
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
    print(f"checksums of every artifact in {out}/: {sums}")
    return 0


def with_extensions(profiles: list[Profile], extensions: list[str]) -> list[Profile]:
    """--extension with profiles: each profile gets these layers after its own input.extensions."""
    from dataclasses import replace

    return [replace(p, extensions=(*p.extensions, *extensions)) for p in profiles] if extensions else profiles


def with_schematic(profiles: list[Profile], file: Path | None) -> list[Profile]:
    """--schematic: every profile customised by it (kiln.image.schematic), its ID said once."""
    if file is None:
        return profiles
    from kiln.image import schematic
    from kiln.image.profile import apply_schematic

    loaded = schematic.load(file)
    say_line(f"schematic {loaded.id} ({file})")
    return [apply_schematic(profile, loaded) for profile in profiles]


def run_platforms(
    args: argparse.Namespace, load: Callable[[str], Graph], profiles: list[Profile], platforms: list[str]
) -> int:
    """`kiln image PROFILE... --platform a,b`: every profile for every platform, one DIR/<profile>/ each."""
    from kiln.image.manifest import write_release_sums
    from kiln.image.multiarch import build_platforms, make_platform_images

    parts = build_platforms(
        load, profiles, platforms, args.jobs, json_output=args.json, say=say_line, runner=args.runner
    )
    out = Path(args.out or "_out")
    results, times = make_platform_images(parts, out, args.jobs, say_line)
    sums = write_release_sums(out)
    if args.json:
        summary = {
            r.name: {
                "directory": str(r.directory),
                "seconds": round(sum(r.seconds.values()), 2),
                "platforms": {p: {"seconds": round(s, 2)} for p, s in r.seconds.items()},
                "artifacts": r.artifacts,
            }
            for r in results
        }
        print(json.dumps(summary, indent=2))
        return 0
    for result in results:
        each = ", ".join(f"{p} {s:.1f} s" for p, s in result.seconds.items())
        print(f"{result.name}: {result.directory}/ ({each})")
        for artifact in result.artifacts:
            arch = artifact.get("arch") or "all"
            print(f"  {artifact['size'] / 1048576:10.2f} MiB  {arch:5}  {artifact['path']}  {artifact['sha256'][:16]}")
    for line in times:
        print(line.line())
    print(f"checksums of every artifact in {out}/: {sums}")
    return 0
