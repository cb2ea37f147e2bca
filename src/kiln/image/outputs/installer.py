"""The installer output: an OCI image, FROM scratch, whose entrypoint writes Kiln's disk image onto a disk.

`docker run --rm --privileged -v /dev:/dev kiln-installer:<version> install --disk /dev/sdX` runs
`machined install` (runtime/machined/install.go), the same code `kiln install` runs on the host.
The image holds four layers, each annotated with its role (dev.kiln.layer): the kernel
(/usr/share/kiln/vmlinuz), the boot layer (initramfs.zst, release.json: version, architecture,
kernel command line), the disk image (/usr/share/kiln/disk.raw.gz) and the static machined as
/usr/bin/installer. A fresh install uses the disk image; an upgrade pulls every layer but that one
and runs `installer install --upgrade`, which writes the kernel and initramfs into the other slot.

The disk image goes in gzip-compressed with its raw size in a FEXTRA subfield ("KS", 8 bytes
little-endian; RFC 1952 2.3.1.1) so machined knows the size without inflating it first: a raw
image is mostly zeros, and once `docker load` unpacks a layer those zeros would take their full
size in the engine's storage.

Written with tarfile and zlib rather than a tool: nothing in Debian writes both an OCI layout and
the docker-archive that Debian's docker 20.10 `docker load` needs (it does not read an OCI layout
alone), without a daemon, with bytes we control (umoci writes OCI layouts only; skopeo converts
between them but would be one more tool whose output we must pin; oras is for artifacts, not
runnable images). The formats are a few JSON documents and tars, so every byte stays decided here:
members sorted, owner 0:0, mtimes at assets.epoch, gzip without name or time, "created" from the
epoch. The tarball holds the OCI layout plus docker's manifest.json, so both kinds of reader load it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.core.errors import BuildError, InputError
from kiln.core.hashing import CHUNK
from kiln.image.assets import BootAssets
from kiln.image.chunked import GZIP_LEVEL, write_gzip
from kiln.image.outputs.disk import build_raw
from kiln.image.outputs.grub import SLOTS

if TYPE_CHECKING:
    from kiln.image.profile import Profile

REPOSITORY = "kiln-installer"
ENTRYPOINT = "usr/bin/installer"
SHARE = "usr/share/kiln"
DISK_MEMBER = f"{SHARE}/disk.raw.gz"  # runtime/machined/install.go's first default image
RELEASE_MEMBER = f"{SHARE}/release.json"  # what `machined install --upgrade` writes a slot from
# Each layer says what it holds, so an upgrade pulls every layer but the disk image
# (runtime/machined/internal/oci reads the same key).
LAYER_ANNOTATION = "dev.kiln.layer"

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"

ELF_MACHINES = {0x3E: "amd64", 0xB7: "arm64"}
PT_INTERP = 3


@dataclass(frozen=True)
class Blob:
    """A content-addressed file under blobs/sha256/."""

    media_type: str
    digest: str  # "sha256:<hex>"
    size: int
    annotations: dict[str, str] | None = None

    def descriptor(self) -> dict[str, Any]:
        described: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            described["annotations"] = self.annotations
        return described

    @property
    def path(self) -> str:
        return "blobs/sha256/" + self.digest.removeprefix("sha256:")


def image_tag(version: str) -> str:
    """The tag for a version: characters Docker refuses in tags (such as '+') become '-'."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", version)[:128]
    return tag if tag and tag[0] not in ".-" else "v" + tag[:127]


def write(profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None:
    """The installer output: machined (copied out of its package) and the raw disk it installs, in
    an OCI image."""
    from kiln.image.checks import MACHINED
    from kiln.image.imager import MACHINED_PATH, package_file  # the one nofollow copy of a package's file

    with tempfile.TemporaryDirectory(prefix="disk-", dir=dest.parent) as tmp:
        machined = package_file(trees[MACHINED], MACHINED_PATH, Path(tmp) / "machined", 0o755, "machined")
        raw = build_raw(assets, Path(tmp) / "disk.raw", profile.disk_size)
        build_installer(assets, raw, machined, dest, profile.installer_name, profile_arch=profile.arch)


def build_installer(
    assets: BootAssets, disk_raw: Path, machined: Path, out_dir: Path, name: str, *, profile_arch: str | None = None
) -> tuple[Path, Path]:
    """Write out_dir/<name>/ (an OCI image layout) and out_dir/<name>.tar (that layout plus
    docker's manifest.json, for `docker load`); return both. The image is tagged
    kiln-installer:<version>.

    The image's architecture (config, index platform, release.json) is machined's, read from its
    ELF header: the installer runs it, so that is what a registry must offer each machine.
    `profile_arch` must agree with it: an amd64 machined in an arm64 installer is refused.
    """
    arch = _checked_arch(assets, disk_raw, machined, profile_arch)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = image_tag(assets.version)
    reference = f"{REPOSITORY}:{tag}"
    with tempfile.TemporaryDirectory(prefix=".installer-", dir=out_dir) as tmp:
        work = Path(tmp)
        layout = work / "layout"
        (layout / "blobs/sha256").mkdir(parents=True)
        layer_files = _layer_files(assets, disk_raw, machined, arch, work)
        layers: list[Blob] = []
        diff_ids: list[str] = []
        for role, _, files in layer_files:
            blob, diff_id = _layer(files, assets.epoch, layout, work)
            layers.append(Blob(blob.media_type, blob.digest, blob.size, {LAYER_ANNOTATION: role}))
            diff_ids.append(diff_id)
        created = datetime.fromtimestamp(assets.epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        config = _image_config(assets.version, arch, created, diff_ids, [what for _, what, _ in layer_files])
        config_blob = _json_blob(config, CONFIG_TYPE, layout)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": config_blob.descriptor(),
            "layers": [layer.descriptor() for layer in layers],
            "annotations": {
                "org.opencontainers.image.created": created,
                "org.opencontainers.image.version": assets.version,
            },
        }
        entry = {
            **_json_blob(manifest, MANIFEST_TYPE, layout).descriptor(),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": tag, "io.containerd.image.name": reference},
        }
        _write_index(layout, [entry])
        # docker-archive's manifest: docker 20.10 reads this, not index.json.
        docker_manifest = [
            {"Config": config_blob.path, "RepoTags": [reference], "Layers": [layer.path for layer in layers]}
        ]
        tar_tmp = work / "installer.tar"
        _archive(layout, {"manifest.json": _canonical(docker_manifest)}, assets.epoch, tar_tmp)

        return _publish(layout, tar_tmp, out_dir / name, out_dir / f"{name}.tar")


def _checked_arch(assets: BootAssets, disk_raw: Path, machined: Path, profile_arch: str | None) -> str:
    """machined's architecture, once every input is there and the profile's arch (if any) agrees with it."""
    inputs = {"disk image": disk_raw, "machined": machined, "kernel": assets.vmlinuz, "initramfs": assets.initramfs}
    for what, path in inputs.items():
        if not path.is_file():
            raise InputError(f"installer: {what} {path} does not exist")
    arch = static_elf_arch(machined)
    if profile_arch is not None and arch != profile_arch:
        raise BuildError(f"installer: {machined} is built for {arch}, but the profile is for {profile_arch}")
    return arch


def _layer_files(
    assets: BootAssets, disk_raw: Path, machined: Path, arch: str, work: Path
) -> list[tuple[str, str, dict[str, tuple[Path, int]]]]:
    """The image's layers in order as (role, what it holds, member -> (file, mode)): the kernel, initramfs and
    release.json (and a Secure Boot release's slot UKIs), the gzip'd disk (made in `work`), the installer."""
    disk_gz = work / "disk.raw.gz"
    gzip_with_size(disk_raw, disk_gz)
    release = work / "release.json"
    release.write_bytes(release_info(assets, arch))
    boot_files = {f"{SHARE}/initramfs.zst": (assets.initramfs, 0o644), RELEASE_MEMBER: (release, 0o644)}
    boot_files |= slot_ukis(assets, work)
    return [
        ("kernel", "kernel", {f"{SHARE}/vmlinuz": (assets.vmlinuz, 0o644)}),
        ("boot", "initramfs and release", boot_files),
        ("disk", "disk image", {DISK_MEMBER: (disk_gz, 0o644)}),
        ("installer", "installer (machined install)", {ENTRYPOINT: (machined, 0o755)}),
    ]


def _image_config(version: str, arch: str, created: str, diff_ids: list[str], history: list[str]) -> dict[str, Any]:
    """The image's config: machined as the entrypoint, the layers' diff_ids, a history line per layer."""
    return {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": ["/" + ENTRYPOINT],
            "Env": ["PATH=/usr/bin"],
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "Kiln installer", "org.opencontainers.image.version": version},
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": created, "created_by": f"kiln: {what}"} for what in history],
    }


def _write_index(layout: Path, manifests: list[dict[str, Any]]) -> None:
    """The layout's index.json, listing `manifests`, and its oci-layout."""
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": manifests}
    (layout / "index.json").write_bytes(_canonical(index))
    (layout / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))


def build_installer_index(layouts: list[Path], out_dir: Path, name: str, epoch: int) -> tuple[Path, Path]:
    """One image index over several single-arch installer layouts (as build_installer writes them):
    out_dir/<name>-oci/ (an OCI image layout whose index.json lists each layout's image manifest with
    its platform, in arch order) and out_dir/<name>-index.tar (the same, tarred as _archive does:
    sorted, 0:0, mtimes at `epoch`). Each blob is stored once, by digest (hard-linked from the
    layouts where the filesystem allows). There is no docker-archive manifest.json: docker 20.10's
    `docker load` reads one image per tag; it takes the single-arch tarballs. Returns both paths.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=".installer-index-", dir=out_dir) as tmp:
        layout = Path(tmp) / "layout"
        (layout / "blobs/sha256").mkdir(parents=True)
        for source in layouts:
            for entry in json.loads((source / "index.json").read_bytes())["manifests"]:
                platform = entry.get("platform") or {}
                arch = platform.get("architecture")
                if entry.get("mediaType") != MANIFEST_TYPE or platform.get("os") != "linux" or not arch:
                    raise BuildError(f"installer index: {source}/index.json names something other than a linux image")
                if arch in entries:
                    raise BuildError(f"installer index: two images for linux/{arch} ({source} and another layout)")
                manifest = json.loads((source / _blob(entry, source).path).read_bytes())
                for descriptor in (entry, manifest["config"], *manifest["layers"]):
                    blob = _blob(descriptor, source)
                    _share(source / blob.path, layout / blob.path)
                entries[arch] = entry
        _write_index(layout, [entries[a] for a in sorted(entries)])
        tar_tmp = Path(tmp) / "index.tar"
        _archive(layout, {}, epoch, tar_tmp)
        return _publish(layout, tar_tmp, out_dir / f"{name}-oci", out_dir / f"{name}-index.tar")


def slot_ukis(assets: BootAssets, work: Path) -> dict[str, tuple[Path, int]]:
    """A Secure Boot release's signed UKI for each slot (<slot>.efi, its command line naming the slot):
    `machined install --upgrade` writes the one of the slot it fills. None without Secure Boot."""
    if assets.keys is None:
        return {}
    from kiln.image.outputs import secureboot

    return {f"{SHARE}/{slot}.efi": (secureboot.slot_uki(assets, slot, work), 0o644) for slot in SLOTS}


def _publish(layout: Path, tar: Path, layout_out: Path, tar_out: Path) -> tuple[Path, Path]:
    """Move a finished layout and its tarball to their final names, replacing what was there."""
    if layout_out.is_dir() and not layout_out.is_symlink():
        shutil.rmtree(layout_out)
    else:
        layout_out.unlink(missing_ok=True)
    layout.rename(layout_out)
    tar.replace(tar_out)
    return layout_out, tar_out


def _blob(descriptor: dict[str, Any], layout: Path) -> Blob:
    """A descriptor of one of our layouts, its digest checked before it names a path."""
    digest = descriptor.get("digest")
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise BuildError(f"installer index: {layout} names a blob {digest!r}")
    return Blob(descriptor["mediaType"], digest, descriptor["size"])


def _share(source: Path, target: Path) -> None:
    """A blob into another layout: once per digest, a hard link where the filesystem allows, else a copy."""
    if target.exists():
        return
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copyfile(source, target)
        target.chmod(0o644)


def release_info(assets: BootAssets, arch: str) -> bytes:
    """release.json: the version, architecture and kernel command line a slot is written with."""
    return _canonical({"architecture": arch, "cmdline": assets.cmdline, "version": assets.version}) + b"\n"


def static_elf_arch(binary: Path) -> str:
    """The image architecture of a 64-bit ELF; refuses one that needs a dynamic loader (FROM scratch has none)."""
    with binary.open("rb") as stream:
        header = stream.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise InputError(f"installer: {binary} is not a 64-bit little-endian ELF executable")
        machine = struct.unpack_from("<H", header, 18)[0]
        if machine not in ELF_MACHINES:
            raise InputError(f"installer: {binary} is for ELF machine {machine:#x}, not amd64 or arm64")
        phoff = struct.unpack_from("<Q", header, 32)[0]
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        stream.seek(phoff)
        table = stream.read(phentsize * phnum)
    for i in range(phnum):
        if struct.unpack_from("<I", table, i * phentsize)[0] == PT_INTERP:
            raise InputError(
                f"installer: {binary} is dynamically linked; the installer image has no libc "
                "(build machined with CGO_ENABLED=0)"
            )
    return ELF_MACHINES[machine]


def gzip_with_size(raw: Path, out: Path) -> None:
    """gzip `raw` into `out` with no name and mtime 0, and its size in the "KS" FEXTRA subfield."""
    write_gzip(raw, out, extra=b"KS" + struct.pack("<HQ", 8, raw.stat().st_size))


def _tarinfo(name: str, epoch: int, mode: int, size: int = 0, *, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode, info.size, info.mtime = mode, size, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _parents(paths: list[str]) -> list[str]:
    dirs = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    return sorted(dirs)


def _layer(files: dict[str, tuple[Path, int]], epoch: int, layout: Path, work: Path) -> tuple[Blob, str]:
    """A gzip'd tar of `files` (member -> (source, mode)) and its parent directories, stored as a blob.
    Returns the blob and the diff_id (the uncompressed tar's digest)."""
    tar_path = work / "layer.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        entries: list[tuple[str, Path | None, int]] = [(d, None, 0o755) for d in _parents(list(files))]
        entries += [(member, source, mode) for member, (source, mode) in files.items()]
        for member, source, mode in sorted(entries, key=lambda e: e[0]):
            if source is None:
                tar.addfile(_tarinfo(member, epoch, mode, directory=True))
            else:
                with source.open("rb") as stream:
                    tar.addfile(_tarinfo(member, epoch, mode, source.stat().st_size), stream)
    diff_id = hashlib.sha256()
    gz_path = work / "layer.tar.gz"
    # filename="" and mtime=0: gzip -n
    with (
        tar_path.open("rb") as src,
        gz_path.open("wb") as raw_out,
        gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=raw_out, mtime=0) as dst,
    ):
        for block in iter(lambda: src.read(CHUNK), b""):
            diff_id.update(block)
            dst.write(block)
    tar_path.unlink()
    return _store(gz_path, LAYER_TYPE, layout), "sha256:" + diff_id.hexdigest()


def _store(path: Path, media_type: str, layout: Path) -> Blob:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(CHUNK), b""):
            digest.update(block)
    blob = Blob(media_type, "sha256:" + digest.hexdigest(), path.stat().st_size)
    path.replace(layout / blob.path)
    return blob


def _canonical(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _json_blob(document: dict[str, Any], media_type: str, layout: Path) -> Blob:
    data = _canonical(document)
    blob = Blob(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    (layout / blob.path).write_bytes(data)
    return blob


def _archive(layout: Path, extra: dict[str, bytes], epoch: int, out: Path) -> None:
    """Tar the layout directory's contents plus `extra` files, sorted, owner 0:0, at the epoch."""
    members: dict[str, Path | bytes | None] = {name: data for name, data in extra.items()}
    for path in layout.rglob("*"):
        members[path.relative_to(layout).as_posix()] = None if path.is_dir() else path
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            content = members[name]
            if content is None:
                tar.addfile(_tarinfo(name, epoch, 0o755, directory=True))
            elif isinstance(content, bytes):
                tar.addfile(_tarinfo(name, epoch, 0o644, len(content)), io.BytesIO(content))
            else:
                with content.open("rb") as stream:
                    tar.addfile(_tarinfo(name, epoch, 0o644, content.stat().st_size), stream)
