"""`kiln release push`: publish an installer image to an OCI registry as a release of a channel.

The input is the OCI image layout `kiln image` writes for an installer profile (a directory, or
the `.tar` beside it, read in place), or the profile itself, built first as `kiln image` would.
Nothing is sent before the layout checks out (kiln.installer.image_layout: one linux image, or one
per architecture, every blob matching its descriptor). The release's version is the manifest's
`org.opencontainers.image.version` (or the config's label of that name) and must be a semantic
version, the same for every architecture.

What is pushed: the layers and the config unchanged (only those the registry lacks, HEAD first),
then a new manifest, the layout's with release annotations added: the version, `dev.kiln.channel`,
`dev.kiln.architecture` and, when given, `dev.kiln.upgrade-from`. It is serialized canonically
(sorted keys, no whitespace), so the same layout, channel and upgrade-from give the same digest.
It goes under one tag, `image_tag(version)`; no other tag is touched. A machine following a
channel picks the newest semver tag whose annotations admit it (docs/upgrades.md).

A multi-arch layout (`installer-oci/` or `installer-index.tar`, from `kiln image installer
--platform linux/amd64,linux/arm64`): each image's manifest is annotated as above and pushed by
its digest, then an OCI image index naming them with their platforms (and the version, channel
and upgrade-from annotations) goes under the tag. Blobs the images share are sent once. machined
follows the index to its own architecture's manifest, whose annotations it reads.

The verb itself (arguments, building a profile first, --sign) is kiln.installer.release_command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.semver import SemVer
from kiln.image.outputs.installer import INDEX_TYPE, MANIFEST_TYPE, image_tag
from kiln.installer.image_layout import VERSION_KEY, Blob, Layout, read_image, read_images

if TYPE_CHECKING:  # kiln.core.registry imports requests: not at every CLI start
    from kiln.core.registry import Ref

CHANNELS = ("alpha", "beta", "stable")
CHANNEL_KEY = "dev.kiln.channel"
ARCH_KEY = "dev.kiln.architecture"
UPGRADE_FROM_KEY = "dev.kiln.upgrade-from"
RELEASE_KEYS = (CHANNEL_KEY, ARCH_KEY, UPGRADE_FROM_KEY)  # replaced, never kept from the layout
MIB = 1 << 20

# --- the release ---------------------------------------------------------------------------------------------------


@dataclass
class Release:
    """A checked installer image with a semantic version."""

    layout: Layout
    manifest: dict[str, Any]
    blobs: list[Blob]
    version: SemVer
    architecture: str


def read_release(layout: Layout) -> Release:
    """The layout's one image, checked (image_layout.read_image), whose version must be a semantic version."""
    image = read_image(layout)
    version = SemVer.parse(image.version, f"{layout}: the image's version")
    return Release(layout, image.manifest, image.blobs, version, image.architecture)


def read_releases(layout: Layout) -> list[Release]:
    """The layout's image, or its images one per architecture (image_layout.read_images), each with
    a semantic version, all the same one: they are one release."""
    images = read_images(layout)
    releases = []
    for image in images:
        which = "the image's" if len(images) == 1 else f"the {image.architecture} image's"
        version = SemVer.parse(image.version, f"{layout}: {which} version")
        releases.append(Release(layout, image.manifest, image.blobs, version, image.architecture))
    if len({r.version.text for r in releases}) > 1:
        given = ", ".join(f"{r.architecture} {r.version}" for r in releases)
        raise InputError(f"{layout}: the images have different versions ({given}): a release is one version")
    return releases


def annotated_manifest(
    manifest: dict[str, Any], version: SemVer, channel: str, architecture: str, upgrade_from: SemVer | None
) -> bytes:
    """The manifest with the release annotations set (others kept), serialized canonically."""
    if channel not in CHANNELS:
        raise InputError(f"channel {channel!r} is not one of {', '.join(CHANNELS)}")
    annotations = {k: v for k, v in dict(manifest.get("annotations") or {}).items() if k not in RELEASE_KEYS}
    annotations[VERSION_KEY] = version.text
    annotations[CHANNEL_KEY] = channel
    annotations[ARCH_KEY] = architecture
    if upgrade_from is not None:
        annotations[UPGRADE_FROM_KEY] = upgrade_from.text
    return json.dumps({**manifest, "annotations": annotations}, sort_keys=True, separators=(",", ":")).encode()


def release_index(
    manifests: list[tuple[str, str, int]], version: SemVer, channel: str, upgrade_from: SemVer | None
) -> bytes:
    """The image index pushed under a multi-arch release's tag: each (architecture, digest, size) of
    an annotated manifest with its platform, in architecture order, and the release's version,
    channel and upgrade-from as the index's annotations; serialized canonically."""
    if channel not in CHANNELS:
        raise InputError(f"channel {channel!r} is not one of {', '.join(CHANNELS)}")
    annotations = {VERSION_KEY: version.text, CHANNEL_KEY: channel}
    if upgrade_from is not None:
        annotations[UPGRADE_FROM_KEY] = upgrade_from.text
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [
            {
                "mediaType": MANIFEST_TYPE,
                "digest": digest,
                "size": size,
                "platform": {"architecture": arch, "os": "linux"},
            }
            for arch, digest, size in sorted(manifests)
        ],
        "annotations": annotations,
    }
    return json.dumps(index, sort_keys=True, separators=(",", ":")).encode()


def check_upgrade_from(text: str | None) -> SemVer | None:
    """--upgrade-from, checked before anything is built or read."""
    return None if text is None else SemVer.parse(text, "--upgrade-from")


# --- pushing ---------------------------------------------------------------------------------------------------------


@dataclass
class Pushed:
    ref: Ref
    tag: str
    digest: str  # what the tag names: the manifest, or a multi-arch release's index
    version: str
    channel: str
    architecture: str | None  # None for a multi-arch release (see manifests)
    upgrade_from: str | None
    uploaded: list[Blob]
    skipped: list[Blob]
    replaced: str | None  # the digest the tag named before, when it was another
    manifests: dict[str, str] = field(default_factory=dict)  # architecture -> its manifest's digest
    media_type: str = MANIFEST_TYPE
    signatures: dict[str, str] = field(default_factory=dict)  # signed digest -> its signature's tag (--sign)
    attestations: dict[str, str] = field(default_factory=dict)  # attested digest -> its attestation's tag

    @property
    def uploaded_bytes(self) -> int:
        return sum(b.size for b in self.uploaded)

    @property
    def skipped_bytes(self) -> int:
        return sum(b.size for b in self.skipped)

    def line(self) -> str:
        index = "" if self.architecture else f"index of {', '.join(self.manifests)}; "
        return (
            f"pushed {self.ref}:{self.tag}@{self.digest} ({index}channel {self.channel}, version {self.version}, "
            f"{_mib(self.uploaded_bytes)} MiB uploaded, {_mib(self.skipped_bytes)} MiB already there)"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "reference": f"{self.ref}:{self.tag}@{self.digest}",
            "registry": self.ref.host,
            "repository": self.ref.repo,
            "tag": self.tag,
            "digest": self.digest,
            "version": self.version,
            "channel": self.channel,
            "architecture": self.architecture,
            "media_type": self.media_type,
            "manifests": self.manifests,
            "upgrade_from": self.upgrade_from,
            "uploaded": {"blobs": len(self.uploaded), "bytes": self.uploaded_bytes},
            "skipped": {"blobs": len(self.skipped), "bytes": self.skipped_bytes},
            "replaced": self.replaced,
            "signatures": self.signatures,
            "attestations": self.attestations,
        }


def _mib(size: int) -> str:
    return "0" if size == 0 else f"{size / MIB:.1f}"


def push_release(
    release: Release,
    ref: Ref,
    channel: str,
    upgrade_from: SemVer | None,
    say: Callable[[str], None] = say_line,
) -> Pushed:
    """Upload the blobs the registry lacks, then PUT the annotated manifest under the version's tag."""
    return push_releases([release], ref, channel, upgrade_from, say)


def push_releases(
    releases: list[Release],
    ref: Ref,
    channel: str,
    upgrade_from: SemVer | None,
    say: Callable[[str], None] = say_line,
) -> Pushed:
    """One release (read_releases): its image's annotated manifest under the version's tag; with one image
    per architecture, each annotated manifest by its digest, then their image index under the tag."""
    version = releases[0].version
    if upgrade_from is not None and version < upgrade_from:
        raise InputError(f"--upgrade-from {upgrade_from} is newer than the release's version {version}")
    from kiln.core.registry import Client, RegistryError, digest_of

    bodies = [annotated_manifest(r.manifest, r.version, channel, r.architecture, upgrade_from) for r in releases]
    index = None
    if len(releases) > 1:
        listed = [(r.architecture, digest_of(body), len(body)) for r, body in zip(releases, bodies, strict=True)]
        index = release_index(listed, version, channel, upgrade_from)
    tag = image_tag(version.text)
    client = Client(ref)
    uploaded: list[Blob] = []
    skipped: list[Blob] = []
    seen: set[str] = set()
    for release in releases:
        for blob in release.blobs:
            if blob.digest in seen:
                continue  # another architecture's image has it too: sent (or found) once
            seen.add(blob.digest)
            if client.has_blob(blob.digest):
                skipped.append(blob)
                continue
            say(f"release: uploading the {blob.what} {blob.digest[:19]} ({blob.size / MIB:.1f} MiB) to {ref}")
            with release.layout.open(blob.name) as stream:
                client.upload_blob(stream, blob.digest, blob.size, f"the {blob.what} {blob.digest}")
            uploaded.append(blob)
    try:  # only to report a replaced manifest or index: no reason to stop
        before = client.manifest_digest(tag, accept=f"{MANIFEST_TYPE}, {INDEX_TYPE}")
    except RegistryError:
        before = None
    if index is None:
        digest = client.put_manifest(tag, bodies[0])
        manifests = {releases[0].architecture: digest}
    else:
        pairs = sorted(zip(releases, bodies, strict=True), key=lambda pair: pair[0].architecture)
        manifests = {r.architecture: client.put_manifest(digest_of(body), body) for r, body in pairs}
        digest = client.put_manifest(tag, index, INDEX_TYPE)
    return Pushed(
        ref,
        tag,
        digest,
        version.text,
        channel,
        releases[0].architecture if index is None else None,
        upgrade_from.text if upgrade_from else None,
        uploaded,
        skipped,
        before if before and before != digest else None,
        manifests,
        MANIFEST_TYPE if index is None else INDEX_TYPE,
    )
