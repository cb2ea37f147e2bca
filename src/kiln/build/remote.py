"""A remote cache: store entries kept as OCI artifacts in a registry (`oci://HOST[:PORT]/REPO`).

One entry is one image manifest tagged with its key: the config blob is the entry's
meta.json, the layers are its manifest.json (the file list with sha256s) and its tree as
a zstd-compressed tar. Pulling checks every blob against its digest while streaming, the
meta's key against the tag, and the unpacked tree against the pushed manifest.json before
the entry is published, so a corrupt or substituted artifact never reaches the store.

The registry calls themselves (auth, blobs, manifests) are kiln.core.registry's; this module
keeps what makes a store entry an artifact and back.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kiln.build.store import MANIFEST, META, Entry, Store, check_key
from kiln.core import registry, tools
from kiln.core.errors import BuildError, InputError
from kiln.core.registry import MANIFEST_TYPE, Client
from kiln.core.registry import RegistryError as RemoteError

ARTIFACT_TYPE = "application/vnd.kiln.store-entry.v1"
META_TYPE = "application/vnd.kiln.store-entry.meta.v1+json"
FILES_TYPE = "application/vnd.kiln.store-entry.manifest.v1+json"
TREE_TYPE = "application/vnd.kiln.store-entry.tree.v1.tar+zstd"
_REF = re.compile("oci://" + registry.NAME_PATTERN)

__all__ = ["MANIFEST_TYPE", "Ref", "Registry", "RemoteError"]


@dataclass(frozen=True)
class Ref(registry.Ref):
    """A cache reference: `oci://HOST[:PORT]/REPO`."""

    @classmethod
    def parse(cls, text: str) -> Ref:
        match = _REF.fullmatch(text)
        if not match:
            raise InputError(f"invalid cache reference {text!r}: expected oci://HOST[:PORT]/REPOSITORY")
        return cls(match.group("host"), match.group("repo"))

    def __str__(self) -> str:
        return f"oci://{self.host}/{self.repo}"


class Registry(Client):
    """The store entries of one repository."""

    # --- entries ---------------------------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return self.manifest_digest(check_key(key)) is not None

    def push_all(self, store: Store, keys: list[str]) -> int:
        """Upload every entry of `keys` the registry lacks; returns how many were uploaded."""
        return sum(1 for key in keys if self.push(store, key))

    def push(self, store: Store, key: str) -> bool:
        """Upload one entry unless the registry has it; True if it was uploaded."""
        if self.has(key):
            return False
        entry = store.entry(key)
        with store.use(key), tempfile.TemporaryDirectory(dir=store.root / "tmp", prefix="push-") as tmp:
            tree_blob = Path(tmp) / "tree.tar.zst"
            pack_tree(entry.tree, tree_blob, f"{entry.name} {entry.key}")
            config = self.put_blob_file(entry.path / META, META_TYPE)
            files = self.put_blob_file(entry.path / MANIFEST, FILES_TYPE)
            tree = self.put_blob_file(tree_blob, TREE_TYPE)
        annotations = {"io.kiln.key": key, "io.kiln.name": entry.name}
        self.put_manifest(key, registry.artifact_manifest(ARTIFACT_TYPE, config, [files, tree], annotations))
        return True

    def pull(self, store: Store, key: str, source_date_epoch: int) -> Entry | None:
        """Fetch, verify and publish one entry; None if the registry does not have it."""
        check_key(key)
        fetched = self.get_manifest(key)
        if fetched is None:
            return None
        try:
            manifest = json.loads(fetched[0])
            config = manifest["config"]
            files_desc, tree_desc = manifest["layers"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteError(f"{self.ref}: {key} is not a kiln store entry: {exc}") from None
        if not isinstance(config, dict) or not isinstance(tree_desc, dict) or not isinstance(files_desc, dict):
            raise RemoteError(f"{self.ref}: {key} is not a kiln store entry (its descriptors are not objects)")
        if config.get("mediaType") != META_TYPE or tree_desc.get("mediaType") != TREE_TYPE:
            raise RemoteError(f"{self.ref}: {key} is not a kiln store entry (media types differ)")
        staging = store.staging(key)
        with store.hold_staging_lock(staging):
            work = Path(tempfile.mkdtemp(dir=store.root / "tmp", prefix="pull-"))
            try:
                meta_path = self.get_blob(config, work / "meta.json")
                files_path = self.get_blob(files_desc, work / "manifest.json")
                tree_path = self.get_blob(tree_desc, work / "tree.tar.zst")
                meta = json.loads(meta_path.read_bytes())
                if meta.get("key") != key:
                    raise RemoteError(f"{self.ref}: the entry tagged {key} says it is {meta.get('key')}")
                unpack_tree(tree_path, staging / "tree", work)
                info = dict(meta.get("meta", {}))
                info["pulled_from"] = str(self.ref)
                return store.commit(
                    key, staging, str(meta["name"]), info, source_date_epoch, expect_manifest=files_path.read_bytes()
                )
            finally:
                subprocess.run(["rm", "-rf", str(work)], check=False)


def pack_tree(tree: Path, dest: Path, what: str) -> None:
    """A stored tree as a tar (sorted, numeric owners, no atime or ctime) compressed with zstd.

    tar's output is piped straight into zstd: two argv lists, no shell. Also the form of an
    extension pushed to a registry (kiln.image.oci_extension).
    """
    tar = [
        "tar",
        "-C",
        str(tree),
        "--sort=name",
        "--numeric-owner",
        "--format=posix",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        "-cf",
        "-",
        ".",
    ]
    with tempfile.TemporaryFile() as tar_err, tempfile.TemporaryFile() as zstd_err:
        packer = subprocess.Popen(tar, stdout=subprocess.PIPE, stderr=tar_err, stdin=subprocess.DEVNULL)
        assert packer.stdout is not None
        try:
            compressor = subprocess.run(
                ["zstd", "-q", "-T0", "-3", "-f", "-o", str(dest)], stdin=packer.stdout, stderr=zstd_err, check=False
            )
        finally:
            packer.stdout.close()
            packed = packer.wait()
        for code, err, tool in ((packed, tar_err, "tar"), (compressor.returncode, zstd_err, "zstd")):
            if code != 0:
                err.seek(0)
                said = err.read().decode(errors="replace").strip()
                raise BuildError(f"cannot pack {what}: {tool}: {said}")


def unpack_tree(blob: Path, tree: Path, work: Path) -> None:
    """Decompress, refuse what check_tree_archive refuses (read to a clean end, nothing written out
    of the tree or through its own symlinks, no devices), then unpack with GNU tar into the empty
    staging tree. Its symlinks may point anywhere: they are the stored tree's own."""
    from kiln.build.sources.archives import check_tree_archive
    from kiln.build.sources.errors import FetchError

    plain = work / "tree.tar"
    tools.run(
        ["zstd", "-q", "-d", "-f", "-o", str(plain), "--", str(blob)],
        what="decompressing a pulled tree",
        error=RemoteError,
    )
    try:
        check_tree_archive(plain, "pulled tree")
    except FetchError as exc:
        raise RemoteError(exc.message) from None
    if any(tree.iterdir()):
        raise RemoteError(f"cannot unpack a pulled tree: {tree} is not empty")
    tools.run(
        ["tar", "-xpf", str(plain), "--numeric-owner", "--no-overwrite-dir", "-C", str(tree)],
        what="unpacking a pulled tree",
        error=RemoteError,
    )
