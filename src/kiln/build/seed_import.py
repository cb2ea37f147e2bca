"""`--from-tar`: a seed root from a root filesystem tarball, an OCI image layout or a `docker save` archive.

OCI layouts come in a tar as skopeo, buildah or docker 25+ write them. Every such archive is
hostile input: blobs are used only once their sha256 matches the digest that names them
(uncompressed layers also the config's diff_ids), the image of the requested platform is picked
from a multi-arch index, unknown layer media types are refused, and layers are applied without
ever following a symlink of the tree being built (kiln.build.seed_layers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from kiln.build.seed_layers import Layer, SeedError, apply_layer, sniff_compression
from kiln.core.errors import Location
from kiln.core.hashing import file_sha256
from kiln.pkg.variables import Platform


class NoImage(SeedError):
    """The archive (or a nested index) has no image for the requested platform."""


INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
# Layer media type -> the compression to undo; anything else is refused.
LAYER_TYPES: dict[str, str | None] = {
    "application/vnd.oci.image.layer.v1.tar": None,
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": None,
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
MAX_JSON = 4 << 20
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def import_tarball(archive: Path, tree: Path, platform: Platform) -> None:
    """Unpack a root filesystem tarball, or the layers of `platform`'s image in an OCI or docker-save archive."""
    tree.mkdir(parents=True, exist_ok=True)
    where = Location(str(archive))
    try:
        with tarfile.open(archive) as tar:
            names = {os.path.normpath(name) for name in tar.getnames()}
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SeedError(f"cannot read {archive.name}: {exc}", where) from None
    oci = {"index.json", "oci-layout"} <= names  # docker 25+ writes manifest.json too: the layout wins
    if oci or "manifest.json" in names:
        with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
            layout = Image(_unpack_layout(archive, Path(tmp), where), where)
            layers = layout.oci_layers(platform) if oci else layout.docker_layers(platform)
            for number, layer in enumerate(layers, 1):
                apply_layer(layer, tree, f"{archive.name} layer {number}", where)
        return
    _untar(archive, tree, where)


def _untar(archive: Path, dest: Path, where: Location) -> None:
    """GNU tar keeps owners, modes, devices and links as a root filesystem needs.

    Into an empty directory this is safe with GNU tar's own rules: it refuses `..`
    members and creates absolute or `..` symlinks only at the end, so no member is
    written through one.
    """
    result = subprocess.run(
        ["tar", "-xpf", str(archive), "-C", str(dest), "--numeric-owner"], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SeedError(f"cannot unpack {archive.name}: {result.stderr.strip()}", where)


def _unpack_layout(archive: Path, dest: Path, where: Location) -> Path:
    """The image archive's files (JSON and blobs) under `dest`; tarfile's 'data' filter keeps them inside."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SeedError(f"cannot unpack {archive.name}: {exc}", where) from None
    return dest


class Image:
    """An unpacked image archive, read only through verified blobs."""

    def __init__(self, root: Path, where: Location) -> None:
        self.root = root
        self.where = where
        self._verified: set[Path] = set()

    def error(self, message: str) -> SeedError:
        return SeedError(message, self.where)

    def file(self, rel: str) -> Path:
        """A regular file of the archive named by a relative path (no '..', no way out)."""
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise self.error(f"path {rel!r} in the image points outside it")
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()) or not path.is_file():
            raise self.error(f"the image has no file {rel!r}")
        return path

    def blob(self, descriptor: dict[str, Any]) -> Path:
        """The blob a descriptor names, once its sha256 (and size, if given) match."""
        digest = str(descriptor.get("digest", ""))
        match = _DIGEST.fullmatch(digest)
        if not match:
            raise self.error(f"unsupported or malformed digest {digest!r}")
        path = self.file(f"blobs/sha256/{match.group(1)}")
        if path not in self._verified:
            actual = file_sha256(path)
            if actual != match.group(1):
                raise self.error(f"blob {digest} does not match its digest (its sha256 is {actual})")
            size = path.stat().st_size
            if "size" in descriptor and descriptor["size"] != size:
                raise self.error(f"blob {digest} is {size} bytes, the descriptor says {descriptor['size']}")
            self._verified.add(path)
        return path

    def json(self, path: Path, what: str) -> Any:
        if path.stat().st_size > MAX_JSON:
            raise self.error(f"{what} is larger than {MAX_JSON} bytes")
        try:
            return json.loads(path.read_bytes())
        except ValueError as exc:
            raise self.error(f"{what} is not valid JSON: {exc}") from None

    # --- OCI image layout ------------------------------------------------------------------------------------------

    def oci_layers(self, platform: Platform) -> list[Layer]:
        """Layers of the image for `platform` (the index may be multi-arch), bottom first."""
        manifest = self.pick(self.json(self.file("index.json"), "index.json"), platform, "index.json")
        config = self.json(self.blob(_mapping(manifest.get("config"))), "the image config")
        self.check_platform(config, platform)
        diff_ids = _diff_ids(config)
        layers: list[Layer] = []
        for number, descriptor in enumerate(_list(manifest.get("layers")), 1):
            media_type = str(_mapping(descriptor).get("mediaType", ""))
            if media_type not in LAYER_TYPES:
                raise self.error(
                    f"layer {number} has media type {media_type!r}, which Kiln cannot unpack; supported: "
                    + ", ".join(sorted(LAYER_TYPES))
                )
            diff_id = diff_ids[number - 1] if len(diff_ids) >= number else None
            layers.append(Layer(self.blob(_mapping(descriptor)), LAYER_TYPES[media_type], diff_id))
        return layers

    def pick(self, index: Any, platform: Platform, what: str, depth: int = 0) -> dict[str, Any]:
        """The image manifest for `platform` in an index, following nested indexes."""
        if depth > 4:
            raise self.error("image indexes nest too deeply")
        seen: list[str] = []
        fallback: list[dict[str, Any]] = []
        for descriptor in _list(_mapping(index).get("manifests")):
            descriptor = _mapping(descriptor)
            declared = _mapping(descriptor.get("platform") or {})
            if declared:
                seen.append(f"{declared.get('os')}/{declared.get('architecture')}")
                if (declared.get("os"), declared.get("architecture")) != (platform.os, platform.arch):
                    continue
            document = self.json(self.blob(descriptor), f"manifest {descriptor.get('digest')}")
            if descriptor.get("mediaType") in INDEX_TYPES or _mapping(document).get("mediaType") in INDEX_TYPES:
                try:
                    return self.pick(document, platform, what, depth + 1)
                except NoImage:
                    continue
            if declared:
                return _mapping(document)
            fallback.append(_mapping(document))  # no platform in the index: its config will say
        for manifest in fallback:
            config = self.json(self.blob(_mapping(manifest.get("config"))), "the image config")
            if (config.get("os"), config.get("architecture")) == (platform.os, platform.arch):
                return manifest
            seen.append(f"{config.get('os')}/{config.get('architecture')}")
        has = ", ".join(dict.fromkeys(seen)) or "no image at all"
        raise NoImage(
            f"no image for {platform} in this archive (it has {has}); choose one of those with --platform", self.where
        )

    def check_platform(self, config: Any, platform: Platform) -> None:
        found = (_mapping(config).get("os"), _mapping(config).get("architecture"))
        if found != (platform.os, platform.arch) and found != (None, None):
            raise self.error(f"the image is for {found[0]}/{found[1]}, not {platform}")

    # --- docker save (before docker 25) ----------------------------------------------------------------------------

    def docker_layers(self, platform: Platform) -> list[Layer]:
        """Layers of a classic `docker save` archive: manifest.json lists layer tars, the config their diff_ids."""
        images = _list(self.json(self.file("manifest.json"), "manifest.json"))
        matching: list[tuple[dict[str, Any], Any]] = []
        seen: list[str] = []
        for image in images:
            image = _mapping(image)
            if "Config" not in image or "Layers" not in image:
                raise self.error("manifest.json is no docker-save manifest (entries need Config and Layers)")
            config_path = self.file(str(image["Config"]))
            named = re.search(r"([0-9a-f]{64})(\.json)?$", str(image["Config"]))
            if named and file_sha256(config_path) != named.group(1):
                raise self.error(f"config {image['Config']} does not match its digest")
            config = self.json(config_path, str(image["Config"]))
            seen.append(f"{_mapping(config).get('os')}/{_mapping(config).get('architecture')}")
            if (_mapping(config).get("os"), _mapping(config).get("architecture")) == (platform.os, platform.arch):
                matching.append((image, config))
        if not matching:
            has = ", ".join(dict.fromkeys(seen)) or "no image at all"
            raise NoImage(f"no image for {platform} in this docker-save archive (it has {has})", self.where)
        if len(matching) > 1:
            raise self.error(f"this docker-save archive holds {len(matching)} images for {platform}: save just one")
        image, config = matching[0]
        paths = [str(p) for p in _list(image["Layers"])]
        diff_ids = _diff_ids(config)
        if len(diff_ids) != len(paths):
            raise self.error(f"the config lists {len(diff_ids)} layer digests for {len(paths)} layers")
        return [Layer(self.file(p), sniff_compression(self.file(p)), d) for p, d in zip(paths, diff_ids, strict=True)]


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SeedError(f"malformed image metadata: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise SeedError(f"malformed image metadata: expected a list, got {type(value).__name__}")
    return value


def _diff_ids(config: Any) -> list[str]:
    rootfs = _mapping(config).get("rootfs") or {}
    return [str(d) for d in _list(_mapping(rootfs).get("diff_ids", []))]


def oci_layers(layout: Path, platform: Platform) -> list[Path]:
    """Layer blobs (verified) of `platform`'s image in an unpacked OCI image layout, bottom first."""
    return [layer.blob for layer in Image(layout, Location(str(layout))).oci_layers(platform)]
