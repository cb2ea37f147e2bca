"""A small client of the OCI distribution API: what Kiln's remote cache and `kiln release push` share.

A repository is named `HOST[:PORT]/REPO`. Requests go over HTTPS except to loopback hosts (as
docker does) and to hosts listed in $KILN_INSECURE_REGISTRIES. A 401 is answered once: Basic with
the credentials docker stored for the host ($DOCKER_CONFIG/config.json, plain `auth` entries), or
a Bearer token fetched from the challenge's realm with them (anonymous when there are none).

The calls: HEAD of a blob, a monolithic blob upload from a file, GET of a blob streamed to a file
and checked against its descriptor, HEAD, GET (bounded) and PUT of a manifest, and the tags list.
It speaks the API with requests rather than through the `oras` package: oras-py (0.2.x) writes
pulled blobs to disk without checking their digests, and these few calls are short enough to keep
here and test against a real registry.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin

import requests

from kiln.core.errors import InputError, KilnError
from kiln.core.hashing import CHUNK

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_LIMIT = 4 << 20  # the distribution spec's limit a registry may enforce on a manifest
TAGS_LIMIT = 100  # pages of the tags list followed at most

_HOST = r"[A-Za-z0-9.-]+(?::[0-9]+)?"
_REPO = r"[a-z0-9]+(?:[._/-][a-z0-9]+)*"
NAME_PATTERN = rf"(?P<host>{_HOST})/(?P<repo>{_REPO})/?"  # HOST[:PORT]/REPO
_NAME = re.compile(NAME_PATTERN)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NEXT = re.compile(r"<([^>]+)>\s*;\s*rel=\"?next\"?")


class RegistryError(KilnError):
    """The registry refused or failed a request, or served something that does not verify."""

    exit_code = 1


@dataclass(frozen=True)
class Ref:
    """A repository in a registry: `HOST[:PORT]/REPO`."""

    host: str
    repo: str

    @classmethod
    def parse(cls, text: str) -> Ref:
        match = _NAME.fullmatch(text)
        if not match:
            raise InputError(
                f"invalid repository {text!r}: expected HOST[:PORT]/REPOSITORY (lower-case path, no tag or digest)"
            )
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
        return f"{self.host}/{self.repo}"


def check_digest(digest: str) -> str:
    """`digest` if it is a sha256 digest in canonical form, else a RegistryError."""
    if not _DIGEST.fullmatch(digest):
        raise RegistryError(f"unsupported digest {digest!r}: expected sha256:<64 lower-case hex digits>")
    return digest


def digest_of(body: bytes) -> str:
    """The sha256 digest of bytes held in memory (a manifest, an index), in the API's form."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def artifact_manifest(
    artifact_type: str, config: dict[str, Any], layers: list[dict[str, Any]], annotations: dict[str, str]
) -> bytes:
    """The image manifest of a Kiln artifact (a store entry, an extension) in canonical JSON: the same
    blobs and annotations give the same bytes, so pushing again keeps the digest."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": artifact_type,
        "config": config,
        "layers": layers,
        "annotations": annotations,
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def file_digest(path: Path) -> tuple[str, int]:
    """The sha256 digest and size of a file."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return f"sha256:{h.hexdigest()}", size


class Client:
    """One repository of a registry; anonymous, basic or bearer-token auth (credentials from docker's config)."""

    def __init__(self, ref: Ref) -> None:
        self.ref = ref
        self.base = f"{ref.scheme}://{ref.host}/v2/{ref.repo}"
        self.http = requests.Session()
        self._auth_header: str | None = None

    # --- HTTP with auth --------------------------------------------------------------------------------------------

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One request, logged in once on a 401 (a file body is rewound for the retry)."""
        headers = dict(kwargs.pop("headers", {}))
        for attempt in range(2):
            if self._auth_header:
                headers["Authorization"] = self._auth_header
            try:
                response = self.http.request(method, url, headers=headers, timeout=(10, 600), **kwargs)
            except requests.RequestException as exc:
                raise RegistryError(f"{self.ref}: {method} {url} failed: {exc}") from None
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
        user_pass = docker_credentials(self.ref.host)
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
                raise RegistryError(f"{self.ref}: cannot get a token from {fields['realm']}: {exc}") from None
            if token.status_code != 200:
                return False
            try:
                data = token.json()
            except ValueError:
                return False
            self._auth_header = "Bearer " + str(data.get("token") or data.get("access_token"))
            return True
        return False

    def check(self, response: requests.Response, what: str) -> requests.Response:
        """`response` if it succeeded, else a RegistryError saying what was being done."""
        if response.status_code >= 400:
            raise RegistryError(f"{self.ref}: {what}: HTTP {response.status_code} {response.text[:300]}")
        return response

    # --- blobs -----------------------------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        response = self.request("HEAD", f"{self.base}/blobs/{check_digest(digest)}")
        if response.status_code == 404:
            return False
        self.check(response, f"looking up blob {digest}")
        return True

    def upload_blob(self, data: IO[bytes], digest: str, size: int, what: str = "a blob") -> None:
        """A monolithic upload (POST, then PUT with the digest) of `size` bytes read from `data`.

        The registry checks the bytes against `digest` and refuses the upload when they differ.
        """
        check_digest(digest)
        start = self.check(self.request("POST", f"{self.base}/blobs/uploads/"), f"starting the upload of {what}")
        if "Location" not in start.headers:
            raise RegistryError(f"{self.ref}: starting the upload of {what}: the registry gave no upload location")
        location = urljoin(f"{self.base}/", start.headers["Location"])
        joiner = "&" if "?" in location else "?"
        put = self.request(
            "PUT",
            f"{location}{joiner}digest={digest}",
            data=data if size else b"",  # requests sends an empty file chunked, and the PUT never ends
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        self.check(put, f"uploading {what}")

    def put_blob_file(self, path: Path, media_type: str) -> dict[str, Any]:
        """Upload a file unless the registry has it already; returns its descriptor."""
        digest, size = file_digest(path)
        descriptor = {"mediaType": media_type, "digest": digest, "size": size}
        if not self.has_blob(digest):
            with path.open("rb") as handle:
                self.upload_blob(handle, digest, size, path.name)
        return descriptor

    def get_blob(self, descriptor: dict[str, Any], dest: Path) -> Path:
        """Stream a blob to `dest`, refusing it unless its sha256 and size match the descriptor."""
        digest = str(descriptor.get("digest", ""))
        if not _DIGEST.fullmatch(digest):
            raise RegistryError(f"{self.ref}: unsupported blob digest {digest!r}")
        want = digest.removeprefix("sha256:")
        wanted = descriptor.get("size")
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            raise RegistryError(f"{self.ref}: blob {digest} has no valid size in its descriptor")
        response = self.check(
            self.request("GET", f"{self.base}/blobs/{digest}", stream=True), f"fetching blob {digest}"
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
            raise RegistryError(
                f"{self.ref}: blob {digest} does not match its digest (got sha256:{h.hexdigest()}, {size} bytes)"
            )
        return dest

    # --- manifests and tags ----------------------------------------------------------------------------------------

    def manifest_digest(self, reference: str, accept: str = MANIFEST_TYPE) -> str | None:
        """The digest the registry gives for a tag or digest (HEAD), None if it has none."""
        response = self.request("HEAD", f"{self.base}/manifests/{reference}", headers={"Accept": accept})
        if response.status_code == 404:
            return None
        self.check(response, f"looking up {reference}")
        return response.headers.get("Docker-Content-Digest") or ""

    def get_manifest(
        self, reference: str, accept: str = MANIFEST_TYPE, limit: int = MANIFEST_LIMIT
    ) -> tuple[bytes, str] | None:
        """A manifest's bytes and digest, at most `limit` bytes, checked against the digest the registry
        names (and against `reference` when that is a digest); None if the registry does not have it."""
        response = self.request("GET", f"{self.base}/manifests/{reference}", headers={"Accept": accept}, stream=True)
        if response.status_code == 404:
            return None
        self.check(response, f"fetching the manifest of {reference}")
        body = self._read_bounded(response, limit, f"the manifest of {reference}")
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        served = response.headers.get("Docker-Content-Digest")
        if served and served != actual:
            raise RegistryError(f"{self.ref}: manifest of {reference} has digest {actual}, the registry said {served}")
        if reference.startswith("sha256:") and reference != actual:
            raise RegistryError(f"{self.ref}: asked for manifest {reference}, got one with digest {actual}")
        return bytes(body), actual

    def put_manifest(self, reference: str, body: bytes, media_type: str = MANIFEST_TYPE) -> str:
        """PUT a manifest under a tag (or its digest); returns its digest, checked against the registry's."""
        if len(body) > MANIFEST_LIMIT:
            raise RegistryError(f"{self.ref}: a manifest of {len(body)} bytes is over the {MANIFEST_LIMIT} limit")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        response = self.request(
            "PUT", f"{self.base}/manifests/{reference}", data=body, headers={"Content-Type": media_type}
        )
        self.check(response, f"pushing the manifest of {reference}")
        served = response.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryError(f"{self.ref}: pushed manifest {digest} of {reference}, the registry says {served}")
        return digest

    def tags(self) -> list[str]:
        """Every tag of the repository (following the list's pages); none when the repository does not exist."""
        url: str | None = f"{self.base}/tags/list"
        found: list[str] = []
        for _ in range(TAGS_LIMIT):
            if url is None:
                return found
            response = self.request("GET", url, stream=True)
            if response.status_code == 404:
                return found
            self.check(response, "listing tags")
            body = self._read_bounded(response, MANIFEST_LIMIT, "a page of the tags list")
            try:
                page = json.loads(body).get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(f"{self.ref}: the tags list is not a JSON object") from None
            if not isinstance(page, list) or not all(isinstance(t, str) for t in page):
                raise RegistryError(f"{self.ref}: the tags list holds something other than names")
            found += page
            link = _NEXT.search(response.headers.get("Link", ""))
            url = urljoin(url, link.group(1)) if link else None
        raise RegistryError(f"{self.ref}: the tags list has more than {TAGS_LIMIT} pages")

    def _read_bounded(self, response: requests.Response, limit: int, what: str) -> bytes:
        body = bytearray()
        for chunk in response.iter_content(64 << 10):
            body += chunk
            if len(body) > limit:
                response.close()
                raise RegistryError(f"{self.ref}: {what} is larger than {limit} bytes")
        return bytes(body)


def docker_credentials(host: str) -> tuple[str, str] | None:
    """user, password for `host` from $DOCKER_CONFIG/config.json (or ~/.docker), if stored there in plain form."""
    config = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths", {})
    except (OSError, ValueError, AttributeError):
        return None
    for name in (host, f"https://{host}", f"http://{host}"):
        entry = auths.get(name) if isinstance(auths, dict) else None
        encoded = entry.get("auth") if isinstance(entry, dict) else None
        if encoded:
            try:
                user, _, password = base64.b64decode(encoded).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return user, password
    return None
