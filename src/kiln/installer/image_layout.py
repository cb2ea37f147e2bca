"""An OCI image layout (a directory, or a tar of one read in place) and the checks before it is published.

What `kiln release push` reads: index.json names one linux image manifest, or one per architecture
(a multi-arch installer: `kiln image installer --platform linux/amd64,linux/arm64` writes its
`installer-oci/`), directly or through one nested image index; every blob each image references
(the manifest, the config, each layer) has the sha256 and size its descriptor says.
The JSON documents are read whole, so each is capped at JSON_LIMIT. A file of the layout must be a
regular file (a directory's symlink, or a tar's link or device entry, is no blob).
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kiln.core.errors import InputError, display_path
from kiln.core.hashing import CHUNK
from kiln.core.paths import PathEscape, join_inside
from kiln.image.outputs.installer import CONFIG_TYPE, INDEX_TYPE, MANIFEST_TYPE

ARCHITECTURES = ("amd64", "arm64")
VERSION_KEY = "org.opencontainers.image.version"
JSON_LIMIT = 4 << 20  # index.json, the manifest and the config are read whole: no more than this
_HEX = re.compile(r"[0-9a-f]{64}")


class Layout:
    """An OCI image layout in a directory or a tar archive (`tar` open on it), read in place."""

    def __init__(self, path: Path, tar: tarfile.TarFile | None = None) -> None:
        self.path = path
        self._tar = tar
        self._members: dict[str, tarfile.TarInfo] = {}
        for member in tar.getmembers() if tar is not None else []:
            name = member.name.removeprefix("./")
            if member.isfile():
                self._members[name] = member
            else:
                self._members.pop(name, None)  # a later entry of the name replaces an earlier file

    def __str__(self) -> str:
        return display_path(self.path)

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        """A regular file of the layout (not a symlink, nothing outside it), open for reading; a read that
        fails is an InputError."""
        try:
            with self._open(name) as stream:
                yield stream
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise InputError(f"{self}: cannot read {name}: {exc}") from None

    def _open(self, name: str) -> IO[bytes]:
        if self._tar is not None:
            member = self._members.get(name)
            stream = self._tar.extractfile(member) if member is not None else None
            if stream is None:
                raise InputError(f"{self}: the layout has no file {name}")
            return stream
        try:
            path = join_inside(self.path, name, follow_last=False)  # a symlinked directory stays inside the layout
        except PathEscape as exc:
            raise InputError(f"{self}: {exc.message}") from None
        if path.is_symlink() or not path.is_file():
            raise InputError(f"{self}: the layout has no regular file {name}")
        return path.open("rb")

    def read_json(self, name: str, what: str) -> Any:
        with self.open(name) as stream:
            data = stream.read(JSON_LIMIT + 1)
        if len(data) > JSON_LIMIT:
            raise InputError(f"{self}: {what} is larger than {JSON_LIMIT} bytes")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InputError(f"{self}: {what} is not JSON: {exc}") from None

    def verify(self, descriptor: Blob) -> None:
        """The blob's bytes have the sha256 and size its descriptor says."""
        h = hashlib.sha256()
        size = 0
        with self.open(descriptor.name) as stream:
            while chunk := stream.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
        if h.hexdigest() != descriptor.hex or size != descriptor.size:
            raise InputError(
                f"{self}: blob {descriptor.digest} ({descriptor.what}) does not match its descriptor: "
                f"it holds {size} bytes with digest sha256:{h.hexdigest()}, the descriptor says {descriptor.size} bytes"
            )


@contextmanager
def open_layout(path: Path) -> Iterator[Layout]:
    """The layout in directory `path`, or in the tar archive `path` (read in place, never unpacked)."""
    if path.is_dir():
        yield Layout(path)
        return
    with ExitStack() as stack:
        try:
            layout = Layout(path, stack.enter_context(tarfile.open(path, "r:*")))
        except (OSError, tarfile.TarError, EOFError) as exc:
            shown = display_path(path)
            raise InputError(f"{shown}: not an OCI image layout directory or a readable tar of one: {exc}") from None
        yield layout


@dataclass(frozen=True)
class Blob:
    """A descriptor of the layout: the blob's digest, size and what it is."""

    digest: str
    size: int
    what: str

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")

    @property
    def name(self) -> str:
        return f"blobs/sha256/{self.hex}"

    @classmethod
    def of(cls, descriptor: Any, what: str, layout: Layout) -> Blob:
        if not isinstance(descriptor, dict):
            raise InputError(f"{layout}: the descriptor of the {what} is not an object")
        digest, size = descriptor.get("digest"), descriptor.get("size")
        if not isinstance(digest, str) or not digest.startswith("sha256:") or not _HEX.fullmatch(digest[7:]):
            raise InputError(f"{layout}: the {what} has digest {digest!r}: expected sha256:<64 hex digits>")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InputError(f"{layout}: the {what} ({digest}) has no valid size")
        return cls(digest, size, what)


def _index_entries(layout: Layout) -> list[tuple[dict[str, Any], Blob]]:
    """index.json's entries, each an image manifest: one, or one per architecture; an index.json whose
    one entry is an image index (as buildx writes) is followed to that index's entries."""
    index = layout.read_json("index.json", "index.json")
    entries = index.get("manifests") if isinstance(index, dict) else None
    if isinstance(entries, list) and len(entries) == 1 and _get(entries[0], "mediaType") == INDEX_TYPE:
        nested = Blob.of(entries[0], "image index", layout)
        if nested.size > JSON_LIMIT:
            raise InputError(f"{layout}: the image index is larger than {JSON_LIMIT} bytes")
        layout.verify(nested)
        index = layout.read_json(nested.name, "the image index")
        entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not 1 <= len(entries) <= len(ARCHITECTURES):
        count = len(entries) if isinstance(entries, list) else "no"
        raise InputError(
            f"{layout}: index.json must name one image manifest, or one per architecture "
            f"({', '.join(ARCHITECTURES)}); it names {count}"
        )
    found = []
    for number, entry in enumerate(entries, 1):
        what = "image manifest" if len(entries) == 1 else f"image manifest {number}"
        manifest_blob = Blob.of(entry, what, layout)
        if entry.get("mediaType") != MANIFEST_TYPE:
            raise InputError(f"{layout}: index.json names a {entry.get('mediaType')!r}, not an OCI image manifest")
        if manifest_blob.size > JSON_LIMIT:
            raise InputError(f"{layout}: the {what} is larger than {JSON_LIMIT} bytes")
        found.append((entry, manifest_blob))
    return found


def _manifest_blobs(layout: Layout, manifest: Any) -> list[Blob]:
    """The config (first) and the layers a manifest names, each digest once."""
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise InputError(f"{layout}: the image manifest is not an OCI image manifest (schemaVersion 2)")
    if manifest.get("mediaType", MANIFEST_TYPE) != MANIFEST_TYPE:
        raise InputError(f"{layout}: the image manifest has media type {manifest.get('mediaType')!r}")
    annotations = manifest.get("annotations", {})
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        raise InputError(f"{layout}: the image manifest's annotations are not a map of strings")
    config = Blob.of(manifest.get("config"), "config", layout)
    if manifest["config"].get("mediaType") != CONFIG_TYPE:
        raise InputError(f"{layout}: the config is a {manifest['config'].get('mediaType')!r}, not an image config")
    if config.size > JSON_LIMIT:
        raise InputError(f"{layout}: the config is larger than {JSON_LIMIT} bytes")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise InputError(f"{layout}: the image manifest has no layers")
    unique: dict[str, Blob] = {}
    for blob in [config] + [Blob.of(d, f"layer {i + 1}", layout) for i, d in enumerate(layers)]:
        if unique.setdefault(blob.digest, blob).size != blob.size:
            raise InputError(f"{layout}: blob {blob.digest} is named with two sizes")
    return list(unique.values())


def _architecture(layout: Layout, config: Any, entry: dict[str, Any]) -> str:
    """The config's architecture of a linux image, the same as index.json's platform says if it says one."""
    if not isinstance(config, dict) or config.get("os") != "linux":
        raise InputError(f"{layout}: the image is not a linux image (config os {_get(config, 'os')!r})")
    arch = config.get("architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise InputError(f"{layout}: the image is for architecture {arch!r}, not one of {', '.join(ARCHITECTURES)}")
    platform = entry.get("platform")
    if isinstance(platform, dict) and (platform.get("os"), platform.get("architecture")) != ("linux", arch):
        raise InputError(
            f"{layout}: index.json says {platform.get('os')}/{platform.get('architecture')}, the config linux/{arch}"
        )
    return arch


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


@dataclass
class Image:
    """A checked image of a layout: its manifest, the blobs it needs, its architecture and version label."""

    layout: Layout
    manifest: dict[str, Any]
    blobs: list[Blob]  # the config first, then the layers, each digest once
    architecture: str
    version: str


def read_images(layout: Layout) -> list[Image]:
    """index.json -> one linux image manifest, or one per architecture -> each one's config and layers,
    every blob verified. Two images for one architecture are refused.

    The version is the manifest's org.opencontainers.image.version, or the config's label of that name.
    """
    images: list[Image] = []
    entries = _index_entries(layout)
    for entry, manifest_blob in entries:
        layout.verify(manifest_blob)
        manifest = layout.read_json(manifest_blob.name, "the image manifest")
        blobs = _manifest_blobs(layout, manifest)
        for blob in blobs:
            layout.verify(blob)
        config = layout.read_json(blobs[0].name, "the config")
        arch = _architecture(layout, config, entry)
        if any(image.architecture == arch for image in images):
            raise InputError(f"{layout}: index.json names two images for linux/{arch}: one per architecture")
        labels = _get(_get(config, "config"), "Labels")
        version = manifest.get("annotations", {}).get(VERSION_KEY) or _get(labels, VERSION_KEY)
        if not isinstance(version, str) or not version:
            which = "the image" if len(entries) == 1 else f"the {arch} image"
            raise InputError(
                f"{layout}: {which} has no {VERSION_KEY} (neither a manifest annotation nor a config label)"
            )
        images.append(Image(layout, manifest, blobs, arch, version))
    return images


def read_image(layout: Layout) -> Image:
    """The layout's one image (read_images), refusing a layout with one per architecture."""
    images = read_images(layout)
    if len(images) != 1:
        raise InputError(f"{layout}: index.json must name exactly one image manifest, it names {len(images)}")
    return images[0]
