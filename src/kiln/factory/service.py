"""`kiln factory serve`: schematics in, images out, over HTTP, from one project's tree and one store.

Routes (reads are public; the one write needs `Authorization: Bearer <token>`):

    GET  /                                        the schematic builder page
    GET  /v1/catalog                              version, profiles (with their download), extensions
    POST /schematics                              a schematic (YAML or JSON) -> {"id": ...}
    GET  /schematics/<id>                         its canonical form
    GET  /image/<id>/<version>/<profile>.<ext>    the profile's artifact, built on first request
    GET  /image/<id>/<version>/<profile>/<file>   any file of that output (manifest.json, SBOMs, PXE:
                                                  boot.ipxe, vmlinuz, initramfs.zst: chain the script)
    GET  /progress/<id>/<version>/<profile>       the build's log as it is written, until it ends
    GET  /logs/<id>-<version>-<profile>           the last build's log
    GET  /v2/<id>/installer/manifests/<version>   the installer as an OCI image (distribution API,
    GET  /v2/<id>/installer/blobs/<digest>        read-only): `docker pull HOST/<id>/installer:<version>`

Every name in a request is checked against a pattern and the catalogue before it touches a path;
files are served only from a finished output directory and only as regular files inside it.
Errors are JSON `{"error": ...}`: 400 for a bad schematic (naming the field), an unknown profile
or extension, a secret or a refused registry; 401 for a write without the token; 403 for a write
over plain HTTP from another host (the token would cross the network in clear); 404 for what is
not there; 429 with Retry-After when the build queue, the waiting requests or the client's rate
are full; 500 for a failed build, pointing to its log (with Retry-After: its backoff window).
Connections, threads and per-client rates are bounded by the server (kiln.factory.server).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import ssl
import threading
from contextlib import nullcontext
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError
from kiln.core.registry import digest_of
from kiln.factory.builds import Job, Target
from kiln.factory.server import Limits, PooledServer, client_key, retry_after
from kiln.factory.state import Factory, Refusal
from kiln.image import schematic as schematics

ID = r"[0-9a-f]{64}"
VERSION = r"[0-9A-Za-z.+-]{1,64}"
NAME = r"[a-z0-9][a-z0-9._-]{0,63}"
FILE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
PROFILE = r"[a-z0-9][a-z0-9_-]{0,63}"  # no dot: it ends where the download's extension starts
ROUTES = {
    "image": re.compile(
        rf"/image/(?P<id>{ID})/(?P<version>{VERSION})/(?P<profile>[a-z0-9][a-z0-9_-]{{0,63}})\.(?P<ext>[a-z0-9.]{{1,16}})"
    ),
    "file": re.compile(rf"/image/(?P<id>{ID})/(?P<version>{VERSION})/(?P<profile>{NAME})/(?P<file>{FILE})"),
    "progress": re.compile(rf"/progress/(?P<id>{ID})/(?P<version>{VERSION})/(?P<profile>{NAME})"),
    "log": re.compile(rf"/logs/(?P<label>{ID}-{VERSION}-{NAME})"),
    "schematic": re.compile(rf"/schematics/(?P<id>{ID})"),
    "manifest": re.compile(rf"/v2/(?P<id>{ID})/installer/manifests/(?P<ref>{VERSION}|sha256:[0-9a-f]{{64}})"),
    "blob": re.compile(rf"/v2/(?P<id>{ID})/installer/blobs/(?P<digest>sha256:[0-9a-f]{{64}})"),
}
PROGRESS_POLL = 0.2
IDLE_TIMEOUT = 15  # seconds a connection may take to send a request's head (and idle between requests)


class Handler(BaseHTTPRequestHandler):
    server_version = "kiln-factory"
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds a socket read or write may stall: a silent client does not hold a thread forever
    factory: Factory  # set on the subclass made by serve()
    server: PooledServer

    def handle_one_request(self) -> None:
        self.connection.settimeout(IDLE_TIMEOUT)  # an idle or dribbling client gives its thread back soon
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(self.timeout)  # the head is in: a download or upload may take longer
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the factory prints its own lines; a request log would be noise on the console

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_HEAD(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _answer(self, route: Any) -> None:
        try:
            wait = self.server.buckets.take(client_key(self.client_address[0]))
            if wait:
                raise Refusal(429, "too many requests from this address", retry_after=retry_after(wait))
            route()
        except Refusal as refusal:
            self.close_connection = True  # a refused POST's body may still be unread on this connection
            body = {"error": refusal.message, **({"log": refusal.extra["log"]} if "log" in refusal.extra else {})}
            headers = {"Retry-After": str(refusal.extra["retry_after"])} if "retry_after" in refusal.extra else {}
            self._json(refusal.status, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away: nothing to answer

    # --- routes ----------------------------------------------------------------------------------------------------

    def _post(self) -> None:
        if self.path != "/schematics":
            raise Refusal(404, f"nothing to POST at {self.path}")
        if self.server.tls is None and not _loopback(self.client_address[0]):
            raise Refusal(
                403, "writes need TLS (kiln factory serve --tls-cert/--tls-key): the token would travel in clear"
            )
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.factory.token}".encode()):
            raise Refusal(401, "writes need Authorization: Bearer <the factory's token>")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise Refusal(411, "a schematic needs a Content-Length")
        if int(length) > schematics.MAX_BYTES:
            raise Refusal(400, f"schematic: larger than {schematics.MAX_BYTES} bytes")
        body = self.rfile.read(int(length))
        self._json(201, {"id": self.factory.post_schematic(body)})

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            page = resources.files("kiln.factory").joinpath("page.html").read_bytes()
            self._bytes(200, page, "text/html; charset=utf-8")
            return
        if path == "/v1/catalog":
            self._json(200, self._catalog())
            return
        if path == "/v2/" or path == "/v2":
            self._json(200, {})
            return
        for name, pattern in ROUTES.items():
            match = pattern.fullmatch(path)
            if match:
                getattr(self, f"_get_{name}")(match)
                return
        raise Refusal(404, f"no such path {path}")

    def _catalog(self) -> dict[str, Any]:
        catalog = self.factory.catalog
        return {
            "version": catalog.version,
            "extensions": list(catalog.extensions),
            "profiles": [vars(offer) | {"ext": offer.extension} for offer in catalog.offers.values()],
        }

    def _get_schematic(self, match: re.Match[str]) -> None:
        self._file(self.factory.stored(match["id"]), "application/json")

    def _get_image(self, match: re.Match[str]) -> None:
        target = self.factory.target(match)
        offer = self.factory.catalog.offers[target.profile]
        if not offer.download or match["ext"] != offer.extension:
            wanted = f"{target.profile}.{offer.extension}" if offer.download else f"{target.profile}/<file>"
            raise Refusal(404, f"profile {target.profile} ({offer.kind}) is downloaded as {wanted}")
        job = self.factory.built(target)
        disposition = f'attachment; filename="{offer.download}"'  # a browser saves it under the artifact's name
        self._file(job.output / offer.download, "application/octet-stream", {"Content-Disposition": disposition})

    def _get_file(self, match: re.Match[str]) -> None:
        job = self.factory.built(self.factory.target(match))
        self._file(job.output / match["file"], _content_type(match["file"]))

    def _get_progress(self, match: re.Match[str]) -> None:
        job = self.factory.job(self.factory.target(match))
        with self.factory.waiting_for(job) if not job.finished.is_set() else nullcontext():
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command == "HEAD":
                self._chunk(b"")
                return
            self._stream_log(job)
            self._chunk(f"kiln factory: {job.state}{': ' + job.error if job.error else ''}\n".encode())
            self._chunk(b"")

    def _stream_log(self, job: Job) -> None:
        offset = 0
        while True:
            ended = job.finished.is_set()  # read after this: the log is complete when it says so
            if job.log.is_file():
                with job.log.open("rb") as log:
                    log.seek(offset)
                    data = log.read()
                offset += len(data)
                if data:
                    self._chunk(data)
            if ended:
                return
            job.finished.wait(PROGRESS_POLL)

    def _get_log(self, match: re.Match[str]) -> None:
        path = self.factory.builds.root / "logs" / f"{match['label']}.log"
        if not path.is_file():
            raise Refusal(404, f"no log {match['label']}")
        self._file(path, "text/plain; charset=utf-8")

    def _installer(self, match: re.Match[str]) -> Path:
        """The OCI layout of the installer profile's output for this schematic (built on first request)."""
        offers = [o for o in self.factory.catalog.offers.values() if o.kind == "installer"]
        if not offers:
            raise Refusal(404, "this factory has no installer profile")
        profile = offers[0].name
        target = Target(match["id"], self.factory.catalog.version, profile)
        self.factory.stored(target.schematic)
        layouts = sorted(p for p in self.factory.built(target).output.glob("installer-*") if p.is_dir())
        if not layouts:
            raise Refusal(500, "the installer output has no OCI layout")
        return layouts[0]

    def _get_manifest(self, match: re.Match[str]) -> None:
        reference = match["ref"]
        if not reference.startswith("sha256:") and reference != self.factory.catalog.version:
            raise Refusal(404, f"no installer {reference}: this factory serves version {self.factory.catalog.version}")
        layout = self._installer(match)
        index = json.loads((layout / "index.json").read_bytes())
        found = [
            d for d in index.get("manifests", []) if not reference.startswith("sha256:") or d["digest"] == reference
        ]
        if not found:
            raise Refusal(404, f"no manifest {reference}")
        descriptor = found[0] if len(index["manifests"]) == 1 or reference.startswith("sha256:") else None
        if descriptor is None:  # several manifests: the index is the image
            body, media = (layout / "index.json").read_bytes(), index.get("mediaType", "")
        else:
            body = (layout / "blobs/sha256" / descriptor["digest"].split(":", 1)[1]).read_bytes()
            media = descriptor["mediaType"]
        self._bytes(200, body, media, {"Docker-Content-Digest": digest_of(body)})

    def _get_blob(self, match: re.Match[str]) -> None:
        blob = self._installer(match) / "blobs/sha256" / match["digest"].split(":", 1)[1]
        self._file(blob, "application/octet-stream", {"Docker-Content-Digest": match["digest"]})

    # --- answers ---------------------------------------------------------------------------------------------------

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self._bytes(status, json.dumps(data, indent=2).encode() + b"\n", "application/json", headers)

    def _bytes(self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _file(self, path: Path, kind: str, headers: dict[str, str] | None = None) -> None:
        """A regular file (never a link) inside a finished output, sent with sendfile."""
        if path.is_symlink() or not path.is_file():
            raise Refusal(404, f"no such file {path.name}")
        with path.open("rb") as handle:
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(size))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.flush()
                self.connection.sendfile(handle)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _content_type(name: str) -> str:
    if name.endswith(".json"):
        return "application/json"
    if name.endswith((".ipxe", ".cfg", ".log")) or name == "SHA256SUMS":
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def serve(
    factory: Factory, host: str, port: int, limits: Limits | None = None, tls: ssl.SSLContext | None = None
) -> PooledServer:
    """A started server (its own thread); .server_address has the port when 0 was asked for."""
    handler = type("FactoryHandler", (Handler,), {"factory": factory})
    server = PooledServer((host, port), handler, limits or Limits(), tls)
    threading.Thread(target=server.serve_forever, name="factory accept", daemon=True).start()
    return server


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context with the certificate chain and key (TLS 1.2 at least: the stdlib's defaults)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"--tls-cert {cert} / --tls-key {key}: {exc}") from None
    return context
