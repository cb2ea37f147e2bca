"""`kiln release push SOURCE --to HOST/REPO --channel C [--sign KEYDIR]`: the verb over kiln.installer.release.

SOURCE is an installer layout (directory or .tar) or an installer profile, built first as `kiln
image` would build it. With --sign, every pushed manifest gets its signature tag in cosign's format
(kiln.signing.image_signature), made with the key directory's image release key (release-image.key,
ECDSA P-256), which is checked before anything is built or pushed. `--signature-format kiln-v1`
signs in the first Kiln format with release.key instead, for the one release that moves machines
whose machined predates the cosign format (kiln.signing.image_signature_v1). A signed push also attests
every pushed manifest with the SLSA provenance of the build (kiln.signing.image_attestation): the
provenance.intoto.json beside the layout (a profile's output directory holds both), or --provenance FILE.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.verb import Context
from kiln.installer.image_layout import open_layout
from kiln.installer.release import CHANNELS, Pushed, check_upgrade_from, push_releases, read_releases
from kiln.pkg.options import add_jobs_option, add_profiles_dir_option, add_schematic_option, add_tree_options
from kiln.signing.release import PROVENANCE

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kiln.pkg.graph import Graph

SIGNATURE_FORMATS = ("cosign", "kiln-v1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "push an installer OCI layout (or its .tar, or an installer profile, built first) to a "
        "registry under the tag of its version, annotated with its channel, architecture and --upgrade-from"
    )
    add_tree_options(parser)
    parser.add_argument(
        "source",
        metavar="LAYOUT_OR_PROFILE",
        help="an installer OCI layout directory or its .tar (as `kiln image installer` writes them); "
        "a name that is not an existing path is an installer profile, built first",
    )
    parser.add_argument("--to", required=True, metavar="HOST[:PORT]/REPO", help="the repository to push to")
    parser.add_argument("--channel", required=True, choices=CHANNELS, help="the release channel")
    parser.add_argument(
        "--upgrade-from",
        metavar="VERSION",
        help="the oldest version that may upgrade to this release (a semantic version)",
    )
    parser.add_argument(
        "--sign",
        type=Path,
        metavar="KEYDIR",
        help="sign every pushed manifest with KEYDIR's image release key, release-image.key (kiln keys generate): "
        "a sha256-<hex>.sig tag each, in cosign's format, which kiln verify IMAGE, machined (release_keys), "
        "cosign and skopeo check",
    )
    parser.add_argument(
        "--signature-format",
        choices=SIGNATURE_FORMATS,
        default="cosign",
        help="cosign (default); kiln-v1 signs with release.key in the first Kiln format, which machined before "
        "Kiln 0.2 checks: only for the release that moves such machines on (docs/release-signing.md)",
    )
    parser.add_argument(
        "--provenance",
        type=Path,
        metavar="FILE",
        help="with --sign: the SLSA provenance to attest each pushed manifest with, a sha256-<hex>.att tag each "
        "(cosign verify-attestation checks it); default: provenance.intoto.json beside the layout, when there",
    )
    parser.add_argument("--out", metavar="DIR", help="where a profile's output is written (default _out)")
    add_schematic_option(
        parser,
        "build the installer profile customised by this schematic (as kiln image --schematic): machines "
        "installed or upgraded from the release keep its extensions; push it to its own repository",
    )
    add_profiles_dir_option(parser)
    add_jobs_option(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(ctx: Context[Graph]) -> int:
    from kiln.core.registry import Ref

    args = ctx.args
    ref = Ref.parse(args.to)
    upgrade_from = check_upgrade_from(args.upgrade_from)
    signing_key = _signing_key(args.sign, args.signature_format)
    attesting_key = _attesting_key(signing_key)
    if args.provenance is not None and attesting_key is None:
        raise InputError("--provenance applies with --sign KEYDIR, in cosign's signature format")
    source = Path(args.source)
    if source.exists():
        if args.out or args.schematic:
            given = "--out" if args.out else "--schematic"
            raise InputError(f"{given} applies when a profile is built, not to an existing layout")
        path = source
    elif "/" in args.source or args.source.endswith(".tar"):
        raise InputError(f"{args.source}: no such installer layout or tarball")
    else:
        path = build_profile(args, ctx.graph)
    provenance = _provenance(args.provenance, path) if attesting_key is not None else None
    with open_layout(path) as layout:
        pushed = push_releases(read_releases(layout), ref, args.channel, upgrade_from)
    if signing_key is not None:
        pushed.signatures = sign_pushed(pushed, signing_key)
    if attesting_key is not None and provenance is not None:
        pushed.attestations = attest_pushed(pushed, provenance, attesting_key)
    if args.json:
        print(json.dumps(pushed.summary(), indent=2))
    else:
        print(pushed.line())
        if pushed.replaced:
            print(f"  the tag {pushed.tag} named {pushed.replaced} before")
        for digest, tag in pushed.signatures.items():
            print(f"  signed {digest}: {pushed.ref}:{tag}")
        for digest, tag in pushed.attestations.items():
            print(f"  attested {digest} (SLSA provenance): {pushed.ref}:{tag}")
        if attesting_key is not None and provenance is None:
            print(f"  not attested: no {PROVENANCE} beside {path} (--provenance FILE names one)")
    return 0


def _signing_key(
    keys_dir: Path | None, signature_format: str = "cosign"
) -> EllipticCurvePrivateKey | Ed25519PrivateKey | None:
    """The key of --sign's directory for the format, checked before anything is built or pushed."""
    if keys_dir is None:
        if signature_format != "cosign":
            raise InputError("--signature-format applies with --sign KEYDIR")
        return None
    from kiln.signing.keyset import RELEASE, RELEASE_IMAGE, KeySet

    if signature_format == "kiln-v1":
        from kiln.signing.release import load_private_key

        return load_private_key(KeySet(keys_dir).key(RELEASE))
    from kiln.signing.image_signature import load_private_key as load_image_key

    return load_image_key(KeySet(keys_dir).key(RELEASE_IMAGE))


def sign_pushed(pushed: Pushed, key: EllipticCurvePrivateKey | Ed25519PrivateKey) -> dict[str, str]:
    """Sign each pushed manifest (and a multi-arch release's index): digest -> its signature's tag. An
    Ed25519 key (--signature-format kiln-v1) signs in the first Kiln format, an ECDSA one in cosign's."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kiln.core.registry import Client
    from kiln.signing import image_signature, image_signature_v1

    client = Client(pushed.ref)
    digests = list(dict.fromkeys([*pushed.manifests.values(), pushed.digest]))
    if isinstance(key, Ed25519PrivateKey):
        return {digest: image_signature_v1.push_signature(client, digest, key) for digest in digests}
    return {digest: image_signature.push_signature(client, digest, key) for digest in digests}


def _attesting_key(key: EllipticCurvePrivateKey | Ed25519PrivateKey | None) -> EllipticCurvePrivateKey | None:
    """The key attestations are signed with: the image release key of cosign's format (none in kiln-v1)."""
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

    return key if isinstance(key, EllipticCurvePrivateKey) else None


def _provenance(given: Path | None, layout: Path) -> dict[str, Any] | None:
    """The provenance to attest with: --provenance's, else the one a profile's output directory holds beside
    the layout (never through a link: the directory may be someone else's), else none."""
    from kiln.signing.image_attestation import read_provenance

    if given is not None:
        return read_provenance(given)
    beside = layout.parent / PROVENANCE
    if beside.is_symlink():
        raise InputError(f"{beside}: a symbolic link; name the provenance with --provenance FILE")
    return read_provenance(beside) if beside.is_file() else None


def attest_pushed(pushed: Pushed, provenance: dict[str, Any], key: EllipticCurvePrivateKey) -> dict[str, str]:
    """Attest each digest `sign_pushed` signed with the provenance: digest -> its attestation's tag."""
    from kiln.core.registry import Client
    from kiln.signing.image_attestation import push_attestation

    client = Client(pushed.ref)
    return {digest: push_attestation(client, digest, provenance, key) for digest in pushed.signatures}


def build_profile(args: argparse.Namespace, load: Callable[[str], Graph]) -> Path:
    """Build an installer profile as `kiln image PROFILE --out DIR [--platform ...]` does; returns its OCI
    layout (with several platforms, the layout of their image index)."""
    from kiln.image.arch import split_platforms
    from kiln.image.checks import check_packages, with_release_version
    from kiln.image.command import with_schematic
    from kiln.image.imager import build_packages, make_images
    from kiln.image.profile import load_profiles, resolve_platform

    try:
        profile = load_profiles([args.source], Path(args.profiles_dir))[0]
    except InputError as exc:
        if exc.location is not None:
            raise
        raise InputError(f"{args.source} is not an existing layout or tar, nor a profile: {exc.message}") from None
    if profile.kind != "installer":
        raise InputError(
            f"profile {profile.name} writes {profile.kind}: kiln release push needs an installer profile "
            "(output kind installer, such as profiles/installer.yaml)",
            profile.location("output", "kind"),
        )
    [profile] = with_schematic([profile], args.schematic)
    platforms = split_platforms(args.platform)
    out = Path(args.out or "_out")
    if platforms is not None and len(platforms) > 1:
        from kiln.image.multiarch import build_platforms, make_platform_images

        parts = build_platforms(load, [profile], platforms, args.jobs, json_output=args.json, say=say_line)
        results, _ = make_platform_images(parts, out, args.jobs, say_line)
        return results[0].directory / f"{profile.name}-oci"
    [profile] = resolve_platform([profile], platforms[0] if platforms else None)
    graph = load(profile.platform_spec)
    check_packages([profile], graph)
    profile = with_release_version([profile], graph)[0]
    built = build_packages([profile], graph, args.jobs, json_output=args.json)
    result = make_images([profile], built, out, args.jobs, say_line)[0]
    return result.directory / profile.installer_name
