"""What profiles ask of the package graph, checked before anything is built.

Every package a profile names exists, every extension is one (or a valid registry reference),
and the release has one version: all errors at once, at the profile's (or the package's) line,
so a wrong profile costs no build.
"""

from __future__ import annotations

from dataclasses import replace

from kiln import __version__
from kiln.core.errors import InputError, InputErrors, KilnError
from kiln.core.release_version import VERSION_VARIABLE
from kiln.core.schema import suggest
from kiln.image.oci_extension import Reference, is_oci
from kiln.image.outputs.kinds import KINDS
from kiln.image.profile import Profile
from kiln.pkg.graph import Graph
from kiln.rootfs.extension import manifest_for

MACHINED = "machined"


def check_packages(profiles: list[Profile], graph: Graph) -> None:
    """Every package a profile names exists in the tree: errors point at the profile's line."""
    known = graph.tree.packages
    errors: list[KilnError] = []
    for profile in profiles:
        errors += profile.missing_files()  # a file input given per arch, none for this arch
        fields: list[tuple[tuple[str | int, ...], str]] = []
        if profile.kernel.package:
            fields.append((("input", "kernel"), profile.kernel.package))
        if profile.initramfs is None:
            fields.append((("input", "init"), profile.init))
            for key in ("rootfs", "packages", "extensions"):
                fields += [
                    (("input", key, i), name) for i, name in enumerate(getattr(profile, key)) if not is_oci(name)
                ]
        fields += [(("output", "kind"), name) for name in KINDS[profile.kind].packages]
        if profile.loader_package:
            fields.append((("arch",) if profile.arch_given else ("output", "kind"), profile.loader_package))
        for path, name in fields:
            if name not in known:
                why = f": {profile.arch} outputs take GRUB from it" if name == profile.loader_package else ""
                errors.append(
                    InputError(f"unknown package '{name}'{suggest(name, set(known))}{why}", profile.location(*path))
                )
        errors += extension_errors(profile, graph)
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)


def extension_errors(profile: Profile, graph: Graph) -> list[KilnError]:
    """Extensions that are no extension (a package without `extension:`) or no valid reference, before any build."""
    errors: list[KilnError] = []
    for name in profile.extensions if profile.initramfs is None else ():
        try:
            if is_oci(name):
                Reference.parse(name)
            elif name in graph.tree.packages:
                manifest_for(graph.tree.packages[name])
        except InputError as exc:
            errors.append(exc)
    return errors


def with_release_version(profiles: list[Profile], graph: Graph) -> list[Profile]:
    """Every profile takes the release's one version: the tree's kiln_version (core.release_version:
    --release-version, $KILN_VERSION, the project's version: or git describe), which machined is built with.

    That is the version the running machine reports and compares upgrades against, so os-release,
    machined, release.json, the registry tag, the ISO label, the manifest and the SBOMs agree. A
    profile's own `version:` may only repeat it: a release that mixes versions is refused at its line.
    """
    release = str(graph.tree.variables.get(VERSION_VARIABLE) or __version__)
    errors: list[KilnError] = [
        InputError(
            f"version {profile.version} differs from the release's version {release}: a release has one version, "
            "set with --release-version, $KILN_VERSION or the project file's version: (remove this line)",
            profile.location("version"),
        )
        for profile in profiles
        if profile.version and profile.version != release
    ]
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)
    return [replace(profile, version=release) for profile in profiles]
