"""A remote cache: store entries kept as OCI artifacts in a registry (`oci://HOST[:PORT]/REPO`).

One entry is one image manifest tagged with its key: the config blob is the entry's
meta.json, the layers are its manifest.json (the file list with sha256s) and its tree as
a zstd-compressed tar. Pulling checks every blob against its digest while streaming, the
meta's key against the tag, and the unpacked tree against the pushed manifest.json before
the entry is published, so a corrupt or substituted artifact never reaches the store.

This speaks the OCI distribution API with requests rather than through the `oras` package:
oras-py (0.2.x) writes pulled blobs to disk without checking their digests and packs
directories with Python's tarfile on its own terms, and the five calls Kiln needs (HEAD and
GET of manifests and blobs, a monolithic blob upload, PUT of a manifest, and the bearer
token dance) are short enough to keep here and test against a real registry.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests

from kiln.build.store import MANIFEST, META, Entry, Store, check_key
from kiln.core import tools
from kiln.core.errors import BuildError, InputError, KilnError
from kiln.core.hashing import CHUNK

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.kiln.store-entry.v1"
META_TYPE = "application/vnd.kiln.store-entry.meta.v1+json"
FILES_TYPE = "application/vnd.kiln.store-entry.manifest.v1+json"
TREE_TYPE = "application/vnd.kiln.store-entry.tree.v1.tar+zstd"
_REF = re.compile(r"oci://(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)/?")


class RemoteError(KilnError):
    """The registry refused or failed a request, or served something that does not verify."""

    exit_code = 1


@dataclass(frozen=True)
class Ref:
    host: str
    repo: str

    @classmethod
    def parse(cls, text: str) -> Ref:
        match = _REF.fullmatch(text)
        if not match:
            raise InputError(f"invalid cache reference {text!r}: expected oci://HOST[:PORT]/REPOSITORY")
        return cls(match.group("host"), match.group("repo"))

    @property
    def scheme(self) -> str:
        """Plain HTTP for loopback registries (as docker does) and hosts in $KILN_INSECURE_REGISTRIES."""
        name = self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 else self.host
        insecure = {h.strip() for h in os.environ.get("KILN_INSECURE_REGISTRIES", "").split(",") if h.strip()}
        if self.host in insecure or name in insecure or name == "localhost":
            return "http"
        try:
            return "http" if ipaddress.ip_address(name).is_loopback else "https"
        except ValueError:
            return "https"

    def __str__(self) -> str:
        return f"oci://{self.host}/{self.repo}"


class Registry:
    """The entries of one repository; anonymous, basic or bearer-token auth (credentials from docker's config)."""

    def __init__(self, ref: Ref) -> None:
        self.ref = ref
        self.base = f"{ref.scheme}://{ref.host}/v2/{ref.repo}"
        self.http = requests.Session()
        self._auth_header: str | None = None

    # --- HTTP with auth --------------------------------------------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        for attempt in range(2):
            if self._auth_header:
                headers["Authorization"] = self._auth_header
            try:
                response = self.http.request(method, url, headers=headers, timeout=(10, 600), **kwargs)
            except requests.RequestException as exc:
                raise RemoteError(f"{self.ref}: {method} {url} failed: {exc}") from None
            if response.status_code == 401 and attempt == 0 and self._login(response):
                if hasattr(kwargs.get("data"), "seek"):
                    kwargs["data"].seek(0)
                continue
            return response
        return response

    def _login(self, challenge: requests.Response) -> bool:
        """Answer a 401's WWW-Authenticate: Basic with stored credentials, or fetch a Bearer token."""
        header = challenge.headers.get("WWW-Authenticate", "")
        scheme, _, params = header.partition(" ")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        user_pass = _docker_credentials(self.ref.host)
        if scheme.lower() == "basic":
            if user_pass is None:
                return False
            self._auth_header = "Basic " + base64.b64encode(":".join(user_pass).encode()).decode()
            return True
        if scheme.lower() == "bearer" and "realm" in fields:
            query = {k: v for k, v in fields.items() if k in ("service", "scope")}
            query.setdefault("scope", f"repository:{self.ref.repo}:pull,push")
            try:
                token = requests.get(fields["realm"], params=query, auth=user_pass, timeout=30)
            except requests.RequestException as exc:
                raise RemoteError(f"{self.ref}: cannot get a token from {fields['realm']}: {exc}") from None
            if token.status_code != 200:
                return False
            data = token.json()
            self._auth_header = "Bearer " + str(data.get("token") or data.get("access_token"))
            return True
        return False

    def _check(self, response: requests.Response, what: str) -> requests.Response:
        if response.status_code >= 400:
            raise RemoteError(f"{self.ref}: {what}: HTTP {response.status_code} {response.text[:300]}")
        return response

    # --- entries ---------------------------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        response = self._request("HEAD", f"{self.base}/manifests/{check_key(key)}", headers={"Accept": MANIFEST_TYPE})
        if response.status_code == 404:
            return False
        self._check(response, f"looking up {key}")
        return True

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
            _pack(entry, tree_blob)
            config = self._put_blob_file(entry.path / META, META_TYPE)
            files = self._put_blob_file(entry.path / MANIFEST, FILES_TYPE)
            tree = self._put_blob_file(tree_blob, TREE_TYPE)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": config,
            "layers": [files, tree],
            "annotations": {"io.kiln.key": key, "io.kiln.name": entry.name},
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        self._check(
            self._request("PUT", f"{self.base}/manifests/{key}", data=body, headers={"Content-Type": MANIFEST_TYPE}),
            f"pushing the manifest of {key}",
        )
        return True

    def _put_blob_file(self, path: Path, media_type: str) -> dict[str, Any]:
        h = hashlib.sha256()
        size = 0
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
        digest = f"sha256:{h.hexdigest()}"
        descriptor = {"mediaType": media_type, "digest": digest, "size": size}
        head = self._request("HEAD", f"{self.base}/blobs/{digest}")
        if head.status_code == 200:
            return descriptor
        start = self._check(self._request("POST", f"{self.base}/blobs/uploads/"), "starting an upload")
        location = urljoin(f"{self.base}/", start.headers["Location"])
        joiner = "&" if "?" in location else "?"
        with path.open("rb") as handle:
            put = self._request(
                "PUT",
                f"{location}{joiner}digest={digest}",
                data=handle,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            )
        self._check(put, f"uploading {path.name}")
        return descriptor

    def pull(self, store: Store, key: str, source_date_epoch: int) -> Entry | None:
        """Fetch, verify and publish one entry; None if the registry does not have it."""
        check_key(key)
        response = self._request("GET", f"{self.base}/manifests/{key}", headers={"Accept": MANIFEST_TYPE})
        if response.status_code == 404:
            return None
        self._check(response, f"fetching the manifest of {key}")
        served = response.headers.get("Docker-Content-Digest")
        actual = "sha256:" + hashlib.sha256(response.content).hexdigest()
        if served and served != actual:
            raise RemoteError(f"{self.ref}: manifest of {key} has digest {actual}, the registry said {served}")
        try:
            manifest = json.loads(response.content)
            config = manifest["config"]
            files_desc, tree_desc = manifest["layers"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteError(f"{self.ref}: {key} is not a kiln store entry: {exc}") from None
        if config.get("mediaType") != META_TYPE or tree_desc.get("mediaType") != TREE_TYPE:
            raise RemoteError(f"{self.ref}: {key} is not a kiln store entry (media types differ)")
        staging = store.staging(key)
        with store.hold_staging_lock(staging):
            work = Path(tempfile.mkdtemp(dir=store.root / "tmp", prefix="pull-"))
            try:
                meta_path = self._get_blob(config, work / "meta.json")
                files_path = self._get_blob(files_desc, work / "manifest.json")
                tree_path = self._get_blob(tree_desc, work / "tree.tar.zst")
                meta = json.loads(meta_path.read_bytes())
                if meta.get("key") != key:
                    raise RemoteError(f"{self.ref}: the entry tagged {key} says it is {meta.get('key')}")
                _unpack(tree_path, staging / "tree", work)
                info = dict(meta.get("meta", {}))
                info["pulled_from"] = str(self.ref)
                return store.commit(
                    key, staging, str(meta["name"]), info, source_date_epoch, expect_manifest=files_path.read_bytes()
                )
            finally:
                subprocess.run(["rm", "-rf", str(work)], check=False)

    def _get_blob(self, descriptor: dict[str, Any], dest: Path) -> Path:
        """Stream a blob to `dest`, refusing it unless its sha256 and size match the descriptor."""
        digest = str(descriptor.get("digest", ""))
        algo, _, want = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", want):
            raise RemoteError(f"{self.ref}: unsupported blob digest {digest!r}")
        wanted = descriptor.get("size")
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            raise RemoteError(f"{self.ref}: blob {digest} has no valid size in its descriptor")
        response = self._check(
            self._request("GET", f"{self.base}/blobs/{digest}", stream=True), f"fetching blob {digest}"
        )
        h = hashlib.sha256()
        size = 0
        with dest.open("wb") as out:
            for chunk in response.iter_content(CHUNK):
                h.update(chunk)
                size += len(chunk)
                if size > wanted:  # a registry serving more than the descriptor says does not fill the disk
                    break
                out.write(chunk)
        if h.hexdigest() != want or size != wanted:
            raise RemoteError(
                f"{self.ref}: blob {digest} does not match its digest (got sha256:{h.hexdigest()}, {size} bytes)"
            )
        return dest


def _docker_credentials(host: str) -> tuple[str, str] | None:
    """user, password for `host` from $DOCKER_CONFIG/config.json (or ~/.docker), if stored there in plain form."""
    config = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for name in (host, f"https://{host}", f"http://{host}"):
        encoded = auths.get(name, {}).get("auth")
        if encoded:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
            return user, password
    return None


def _pack(entry: Entry, dest: Path) -> None:
    """The entry's tree as a tar (sorted, numeric owners, clamped times) compressed with zstd.

    tar's output is piped straight into zstd: two argv lists, no shell.
    """
    tar = [
        "tar",
        "-C",
        str(entry.tree),
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
                raise BuildError(f"cannot pack {entry.name} {entry.key}: {tool}: {said}")


def _unpack(blob: Path, tree: Path, work: Path) -> None:
    """Decompress, refuse what check_archive refuses (read to a clean end, nothing out of the tree,
    no devices), then unpack with GNU tar into the empty staging tree."""
    from kiln.build.sources.archives import check_archive
    from kiln.build.sources.errors import FetchError

    plain = work / "tree.tar"
    tools.run(
        ["zstd", "-q", "-d", "-f", "-o", str(plain), "--", str(blob)],
        what="decompressing a pulled tree",
        error=RemoteError,
    )
    try:
        if check_archive(plain, "pulled tree", strip_components=0) != "tar":
            raise RemoteError("a pulled tree is not a tar archive")
    except FetchError as exc:
        raise RemoteError(exc.message) from None
    if any(tree.iterdir()):
        raise RemoteError(f"cannot unpack a pulled tree: {tree} is not empty")
    tools.run(
        ["tar", "-xpf", str(plain), "--numeric-owner", "--no-overwrite-dir", "-C", str(tree)],
        what="unpacking a pulled tree",
        error=RemoteError,
    )
