"""System extensions as OCI artifacts: `kiln extension push` and `--extension oci://HOST/REPO:TAG`.

An extension travels as one image manifest (artifactType ARTIFACT_TYPE) whose config blob is
its description (name, version, arch, manifest, the kernel and vermagic it was checked against,
its modules) and whose one layer is the package's output tree as a zstd tar (the store's own
form, kiln.build.remote.pack_tree). An image made with a pulled extension stacks the layer that
the same tree in a package tree would give, byte for byte: the layer is made from the tree here,
not shipped ready-made, so module signing and the modules index work the same.

A pull resolves the tag to a manifest digest (what image manifests record), checks every blob
against its digest, refuses trees that could write outside themselves, and keeps the verified
tree at $KILN_CACHE/extensions/<digest>/ (renamed into place whole), so a digest-pinned
reference needs no registry once pulled: what an air-gapped factory relies on.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packageurl import PackageURL

from kiln.core import registry
from kiln.core.errors import InputError
from kiln.core.paths import cache_dir
from kiln.core.registry import Client, RegistryError
from kiln.rootfs.extension import Manifest, manifest_from_json

SCHEME = "oci://"
ARTIFACT_TYPE = "application/vnd.kiln.extension.v1"
CONFIG_TYPE = "application/vnd.kiln.extension.config.v1+json"
TREE_TYPE = "application/vnd.kiln.extension.tree.v1.tar+zstd"
CONFIG_LIMIT = 1 << 20  # a description is a few hundred bytes; more is not one
_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_REFERENCE = re.compile(
    rf"{SCHEME}(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?"
)
_PUSH_TARGET = re.compile(
    rf"(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*):(?P<tag>{_TAG})"
)


def is_oci(text: str) -> bool:
    """Whether an --extension or a profile's extension names a registry artifact, not a package."""
    return text.startswith(SCHEME)


@dataclass(frozen=True)
class Reference:
    """`oci://HOST[:PORT]/REPO:TAG`, `...@sha256:DIGEST` or both (the digest wins)."""

    repository: registry.Ref
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> Reference:
        match = _REFERENCE.fullmatch(text)
        if not match or not (match.group("tag") or match.group("digest")):
            raise InputError(
                f"invalid extension reference {text!r}: expected oci://HOST[:PORT]/REPOSITORY:TAG or "
                "oci://HOST[:PORT]/REPOSITORY@sha256:DIGEST (lower-case repository)"
            )
        return cls(registry.Ref(match.group("host"), match.group("repo")), match.group("tag"), match.group("digest"))

    @property
    def purl(self) -> str:
        """The package URL of an OCI artifact, as scanners read it:
        pkg:oci/NAME@sha256:DIGEST?repository_url=HOST/REPO[&tag=TAG] (a digest-pinned reference only)."""
        qualifiers = {"repository_url": f"{self.repository.host}/{self.repository.repo}"}
        if self.tag:
            qualifiers["tag"] = self.tag
        name = self.repository.repo.rsplit("/", 1)[-1]
        return PackageURL("oci", None, name, self.digest, qualifiers).to_string()

    def pinned(self, digest: str) -> str:
        """The reference an image manifest records: the tag, if any, and always the digest."""
        tag = f":{self.tag}" if self.tag else ""
        return f"{SCHEME}{self.repository}{tag}@{digest}"


def parse_push_target(text: str) -> tuple[registry.Ref, str]:
    """`HOST[:PORT]/REPO:TAG` (with or without oci://) for `kiln extension push --to`."""
    match = _PUSH_TARGET.fullmatch(text.removeprefix(SCHEME))
    if not match:
        raise InputError(f"--to {text!r}: expected HOST[:PORT]/REPOSITORY:TAG (lower-case repository)")
    return registry.Ref(match.group("host"), match.group("repo")), match.group("tag")


@dataclass(frozen=True)
class Pulled:
    """A verified extension from a registry: its tree, manifest and description, and where it came from."""

    reference: str  # pinned: oci://HOST/REPO[:TAG]@sha256:...
    manifest: Manifest
    tree: Path
    description: dict[str, Any]

    @property
    def name(self) -> str:
        return self.manifest.name


def push(tree: Path, description: dict[str, Any], target: str) -> str:
    """Upload an extension's tree and description; returns the pinned reference of what was pushed."""
    from kiln.build.remote import pack_tree

    repository, tag = parse_push_target(target)
    client = Client(repository)
    with tempfile.TemporaryDirectory(prefix="kiln-extension-push-") as tmp:
        config_file = Path(tmp) / "config.json"
        config_file.write_bytes(_canonical(description))
        blob = Path(tmp) / "tree.tar.zst"
        pack_tree(tree, blob, f"extension {description['name']}")
        config = client.put_blob_file(config_file, CONFIG_TYPE)
        layer = client.put_blob_file(blob, TREE_TYPE)
    annotations = {
        "org.opencontainers.image.title": str(description["name"]),
        "org.opencontainers.image.version": str(description["version"]),
        "io.kiln.arch": str(description["arch"]),
        "io.kiln.kernel": str(description.get("kernel") or ""),
    }
    digest = client.put_manifest(tag, registry.artifact_manifest(ARTIFACT_TYPE, config, [layer], annotations))
    return Reference(repository, tag, None).pinned(digest)


def pull(text: str, arch: str, cache: Path | None = None) -> Pulled:
    """The extension `text` names, verified and cached by digest; refused unless built for `arch`."""
    reference = Reference.parse(text)
    client = Client(reference.repository)
    digest = reference.digest
    if digest is None:  # resolved by a GET: a registry need not send Docker-Content-Digest on a HEAD
        assert reference.tag is not None
        fetched = client.get_manifest(reference.tag)
        if fetched is None:
            raise RegistryError(f"{text}: the registry has no such tag")
        digest = fetched[1]
    place = (cache or cache_dir()) / "extensions" / digest.replace(":", "-")
    if not (place / "tree").is_dir():
        _fetch(client, text, digest, place)
    description = json.loads((place / "description.json").read_text())
    if description.get("arch") != arch:
        raise InputError(f"extension {text} is built for {description.get('arch')}, this image is {arch}")
    manifest = manifest_from_json(description.get("manifest"), text)
    return Pulled(reference.pinned(digest), manifest, place / "tree", description)


def pull_all(texts: list[str], arch: str) -> dict[str, Pulled]:
    """Every distinct reference among `texts`, pulled once; by the text as given."""
    return {text: pull(text, arch) for text in dict.fromkeys(t for t in texts if is_oci(t))}


def extension_layers(
    names: Sequence[str], pulled: dict[str, Pulled], trees: dict[str, Path], package_manifest: Callable[[str], Manifest]
) -> list[tuple[Manifest, str]]:
    """(manifest, tree name) per extension in layer order, packages and pulled ones alike; a pulled
    extension's tree joins `trees` under its own name (which names its layer, as a package's does)."""
    layers: list[tuple[Manifest, str]] = []
    for name in names:
        if name not in pulled:
            layers.append((package_manifest(name), name))
            continue
        layer = pulled[name]
        if layer.name in trees or layer.name in names:
            raise InputError(f"extension {name} is named {layer.name}, as a package of this image already is")
        trees[layer.name] = layer.tree
        layers.append((layer.manifest, layer.name))
    return layers


def _fetch(client: Client, text: str, digest: str, place: Path) -> None:
    """Fetch manifest, description and tree; check them; rename the whole into `place`."""
    from kiln.build.remote import unpack_tree

    fetched = client.get_manifest(digest)
    if fetched is None:
        raise RegistryError(f"{text}: the registry has no manifest {digest}")
    config, layer = _descriptors(fetched[0], text)
    place.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".pull-", dir=place.parent))
    try:
        description = json.loads(client.get_blob(config, work / "description.json").read_bytes())
        if not isinstance(description, dict):
            raise RegistryError(f"{text}: its description is not a JSON object")
        manifest_from_json(description.get("manifest"), text)  # refuse a bad one before unpacking
        (work / "tree").mkdir()
        unpack_tree(client.get_blob(layer, work / "tree.tar.zst"), work / "tree", work)
        (work / "tree.tar.zst").unlink()
        (work / "tree.tar").unlink(missing_ok=True)
        try:
            work.rename(place)
        except OSError:
            if not (place / "tree").is_dir():  # not a concurrent pull of the same digest: a real failure
                raise
    except ValueError:
        raise RegistryError(f"{text}: its description is not JSON") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _descriptors(body: bytes, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and tree descriptors of an extension manifest; anything else is refused."""
    try:
        manifest = json.loads(body)
        config = manifest["config"]
        (layer,) = manifest["layers"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{text} is not a Kiln extension (not a manifest with one layer)") from None
    if not isinstance(config, dict) or not isinstance(layer, dict):
        raise RegistryError(f"{text} is not a Kiln extension (its descriptors are not objects)")
    if manifest.get("artifactType") != ARTIFACT_TYPE or config.get("mediaType") != CONFIG_TYPE:
        raise RegistryError(f"{text} is not a Kiln extension (artifact type {manifest.get('artifactType')!r})")
    if layer.get("mediaType") != TREE_TYPE:
        raise RegistryError(f"{text} is not a Kiln extension (layer type {layer.get('mediaType')!r})")
    size = config.get("size")
    if not isinstance(size, int) or size > CONFIG_LIMIT:
        raise RegistryError(f"{text}: its description is larger than {CONFIG_LIMIT} bytes")
    return config, layer


def _canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
