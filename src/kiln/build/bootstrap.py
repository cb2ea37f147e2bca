"""Making the seed root (stage0): debootstrap, or a user's tarball or OCI archive.

The seed is stored like any package output, under the key of its definition, so
it is made once per definition and store.

`--from-tar` takes a root filesystem tarball, an OCI image layout in a tar (as
skopeo, buildah or docker 25+ write it) or a classic `docker save` archive. Every
such archive is hostile input: blobs are used only once their sha256 matches the
digest that names them (uncompressed layers also the config's diff_ids), the image
of the requested platform is picked from a multi-arch index, unknown layer media
types are refused, and layers are applied without ever following a symlink of the
tree being built: a whiteout or a member whose path leads through one is refused.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kiln.build.sources.archives import Member, tar_members
from kiln.build.sources.errors import FetchError
from kiln.build.store import Entry, Store
from kiln.core.errors import BuildError, InputError, Location
from kiln.core.hashing import file_sha256
from kiln.pkg.stage0 import Stage0
from kiln.pkg.variables import Platform

STAGE0_NAME = "stage0"

# Emptied in the stored seed: caches that only make it bigger and vary between runs, and
# /dev, whose device nodes the store refuses (the sandbox mounts its own /dev).
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "dev")


def ensure_stage0(
    stage0: Stage0,
    key: str,
    platform: Platform,
    store: Store,
    log_dir: Path,
    say: Callable[[str], None],
    source_date_epoch: int,
) -> Entry:
    """The seed's store entry, made now if it is missing (under the store lock)."""
    if store.has(key):
        return store.entry(key)
    with store.lock(key):
        if store.has(key):
            return store.entry(key)
        staging = store.staging(key)
        tree = staging / "tree"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{key}.log"
        start = time.monotonic()
        with store.hold_staging_lock(staging), log_path.open("wb") as log:
            if stage0.tarball is not None:
                say(f"stage0: importing {stage0.tarball}")
                import_tarball(stage0.tarball, tree, platform)
            else:
                say(f"stage0: debootstrap {stage0.suite} ({len(stage0.include)} extra packages), about a minute")
                debootstrap(stage0, platform, tree, log, log_path)
            for rel in _PRUNE:
                target = tree / rel
                if target.is_dir():
                    shutil.rmtree(target)
                    target.mkdir(parents=True)
            (tree / "tmp").mkdir(exist_ok=True)
            (tree / "tmp").chmod(0o1777)
            meta = {"stage0": stage0.identity(), "seconds": round(time.monotonic() - start, 1)}
            entry = store.commit(key, staging, STAGE0_NAME, meta, source_date_epoch)
        say(f"stage0: stored as {key[:12]} in {time.monotonic() - start:.0f} s")
        return entry


def debootstrap(stage0: Stage0, platform: Platform, tree: Path, log: object, log_path: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed: run scripts/setup-host.sh")
    if os.geteuid() != 0:
        raise BuildError("debootstrap needs root; or give a root tarball with --from-tar")
    command = ["debootstrap", f"--variant={stage0.variant}", f"--arch={platform.arch}"]
    if stage0.include:
        command.append("--include=" + ",".join(stage0.include))
    command += [stage0.suite, str(tree), stage0.mirror]
    result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        raise BuildError(
            f"debootstrap failed (exit {result.returncode}); last lines of {log_path}:\n" + "\n".join(tail)
        )


class SeedError(InputError):
    """A --from-tar archive that is malformed, unsafe, or has no image for the platform (bad input, exit 2)."""


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
OPAQUE = ".wh..wh..opq"
WHITEOUT = ".wh."
MAX_JSON = 4 << 20
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
CHUNK = 1 << 20


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


@dataclass
class Layer:
    """A layer blob to apply: its file, how it is compressed, and the sha256 of its tar if known."""

    blob: Path
    compression: str | None
    diff_id: str | None = None


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
        return [Layer(self.file(p), _sniff_compression(self.file(p)), d) for p, d in zip(paths, diff_ids, strict=True)]


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


def _sniff_compression(path: Path) -> str | None:
    with path.open("rb") as handle:
        head = handle.read(4)
    return "gzip" if head.startswith(b"\x1f\x8b") else "zstd" if head == b"\x28\xb5\x2f\xfd" else None


def oci_layers(layout: Path, platform: Platform) -> list[Path]:
    """Layer blobs (verified) of `platform`'s image in an unpacked OCI image layout, bottom first."""
    return [layer.blob for layer in Image(layout, Location(str(layout))).oci_layers(platform)]


def _plain_tar(layer: Layer, work: Path, label: str, where: Location) -> Path:
    """The layer as an uncompressed tar (zstd through its tool, argv only), checked against its diff_id."""
    if layer.compression is None:
        plain = layer.blob
    else:
        plain = work / "layer.tar"
        if layer.compression == "gzip":
            try:
                with gzip.open(layer.blob, "rb") as source, plain.open("wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
            except (OSError, EOFError, zlib.error) as exc:
                raise SeedError(f"{label}: cannot decompress: {exc}", where) from None
        else:
            tool = shutil.which("zstd")
            if tool is None:
                raise SeedError(f"{label} is zstd-compressed and zstd is not installed (apt-get install zstd)", where)
            result = subprocess.run(
                [tool, "-q", "-d", "-f", "-o", str(plain), "--", str(layer.blob)], capture_output=True, text=True
            )
            if result.returncode != 0:
                raise SeedError(f"{label}: cannot decompress: {result.stderr.strip()}", where)
    if layer.diff_id is not None and f"sha256:{file_sha256(plain)}" != layer.diff_id:
        raise SeedError(f"{label} does not match its diff_id {layer.diff_id}", where)
    return plain


def apply_layer(layer: Layer | Path, tree: Path, label: str | None = None, where: Location | None = None) -> None:
    """Unpack one layer over `tree`, honouring OCI whiteouts (.wh.name and .wh..wh..opq).

    Every member and whiteout must stay inside `tree` without passing through a
    symlink (of the tree, or made by this layer): GNU tar follows an existing
    symlink to a directory, so `etc -> /etc` from a lower layer would send an upper
    layer's `etc/passwd` to the host.
    """
    if isinstance(layer, Path):
        layer = Layer(layer, _sniff_compression(layer))
    label = label or layer.blob.name
    where = where or Location(str(layer.blob))
    with tempfile.TemporaryDirectory(dir=tree.parent, prefix=".layer-") as tmp:
        plain = _plain_tar(layer, Path(tmp), label, where)
        try:
            members = tar_members(plain, label)
        except FetchError as exc:
            raise SeedError(exc.message, where) from None
        whiteouts = _check_layer(members, tree, label, where)
        for parts in whiteouts:
            _whiteout(tree, parts)
        result = subprocess.run(
            [
                "tar",
                "-xpf",
                str(plain),
                "-C",
                str(tree),
                "--numeric-owner",
                f"--exclude={WHITEOUT}*",
                f"--exclude=*/{WHITEOUT}*",
            ],
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise SeedError(f"cannot unpack {label}: {result.stderr.strip()}", where)


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def _check_layer(members: list[Member], tree: Path, label: str, where: Location) -> list[list[str]]:
    """Refuse members that would leave the tree; return the whiteouts as path components."""
    links = {"/".join(_parts(m.name)) for m in members if m.kind == "symlink"}
    whiteouts: list[list[str]] = []

    def refuse(member: Member, why: str) -> SeedError:
        return SeedError(f"{label}: member {member.name!r} {why}", where)

    for member in members:
        parts = _parts(member.name)
        if member.name.startswith("/") or ".." in parts:
            raise refuse(member, "leads outside the root (absolute or '..')")
        through = _symlink_prefix(tree, parts[:-1], links)
        if through:
            raise refuse(member, f"would be written through the symlink {through!r}")
        if member.kind == "hardlink":
            target = _parts(member.link)
            if member.link.startswith("/") or ".." in target:
                raise refuse(member, f"is a hardlink outside the root (target {member.link!r})")
            through = _symlink_prefix(tree, target[:-1], links)
            if through:
                raise refuse(member, f"is a hardlink through the symlink {through!r}")
        if parts and parts[-1].startswith(WHITEOUT):
            if parts[-1] != OPAQUE and parts[-1][len(WHITEOUT) :] in ("", ".", ".."):
                raise refuse(member, "is a whiteout of no file")
            whiteouts.append(parts)
    return whiteouts


def _symlink_prefix(tree: Path, parents: list[str], layer_links: set[str]) -> str | None:
    """The first of `parents`' prefixes that is a symlink in the tree or in the layer, if any."""
    current = tree
    for depth, part in enumerate(parents, 1):
        prefix = "/".join(parents[:depth])
        if prefix in layer_links:
            return prefix
        current = current / part
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return prefix
        except OSError:
            pass
    return None


def _real_dir(tree: Path, parts: list[str]) -> Path | None:
    """tree/parts if every component is a real directory (no symlink followed), else None."""
    current = tree
    for part in parts:
        current = current / part
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return None
        except OSError:
            return None
    return current


def _whiteout(tree: Path, parts: list[str]) -> None:
    """Apply one whiteout inside `tree` only; nothing is followed, a missing path is nothing to remove."""
    directory = _real_dir(tree, parts[:-1])
    if directory is None:
        return
    if parts[-1] == OPAQUE:
        for child in list(directory.iterdir()):
            _remove(child)
    else:
        _remove(directory / parts[-1][len(WHITEOUT) :])


def _remove(path: Path) -> None:
    """Remove a file, link or directory tree without following symlinks."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()
