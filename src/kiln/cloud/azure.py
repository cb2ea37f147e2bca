"""An Azure page blob from a `kiln image` azure output directory, and the az commands that make an image of it.

Azure makes a VM image (a managed image, or an Azure Compute Gallery image version) from a fixed VHD
in a page blob. The VHD goes up as it is: Put Blob makes an empty page blob of the disk's size, then
one Put Page per run of 512-byte pages that hold anything but zeros (at most 4 MiB a put, as the API
allows), in parallel, each with its MD5, which the service checks. A new page blob reads as zeros, so
zero pages are never sent: a 1 GiB disk holds about 25 MiB of data.

The blob's metadata names the image: kiln_artifact_sha256 (the VHD's sha256 as manifest.json lists
it) is set only once every page is written, so a blob that has it is this image, whole, and a second
run does nothing; an upload cut short leaves kiln_pending_sha256 instead, and the next run writes the
blob again. Images and galleries live in Azure's management API, which has no emulator to test
against: Kiln prints the az command that makes the image instead of calling it.

Credentials: a SAS in the container's URL, else the connection string in AZURE_STORAGE_CONNECTION_STRING
(its account must be the URL's). The SAS never reaches a message or the result.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from kiln.cloud.artifact import DEFAULT_NAME, CloudImage, UploadFailed, image_name, send_in_parallel
from kiln.cloud.result import result_json
from kiln.core import sparse
from kiln.core.errors import InputError, KilnError
from kiln.image.outputs.formats import MIB, VHD_FOOTER, vhd_checksum

if TYPE_CHECKING:
    from azure.core.exceptions import AzureError
    from azure.storage.blob import BlobClient

PAGE = 512  # a page blob's unit: every put starts and ends on one
MAX_PUT = 4 << 20  # the most one Put Page takes
DIGEST_KEY = "kiln_artifact_sha256"  # metadata names are C# identifiers: no colons or dashes
PENDING_KEY = "kiln_pending_sha256"
CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ARCHITECTURES = {"amd64": "x64", "arm64": "Arm64"}
GALLERY_VERSION = re.compile(r"\d{1,9}\.\d{1,9}\.\d{1,9}")  # what a gallery image version may be called
_SIGNATURE = re.compile(r"(sig=)[^&\s'\"]+", re.IGNORECASE)  # a SAS's secret, as it may appear in a URL
# The SDK's retries, sooner than its defaults (15 s, then 18, 24): a put the service drops is tried
# again within seconds, and an endpoint that does not answer is said in about 10 s, not a minute.
RETRIES: dict[str, Any] = {"retry_total": 3, "initial_backoff": 1, "increment_base": 2}
_ZERO_PAGE = bytes(PAGE)
T = TypeVar("T")


@dataclass
class Options:
    container: str  # https://ACCOUNT.blob.core.windows.net/CONTAINER[?SAS]
    name_template: str = DEFAULT_NAME
    resource_group: str | None = None  # only for the printed commands
    gallery: str | None = None
    workers: int = 8


@dataclass
class Result:
    """What an upload wrote or found, for `--json` (the aws result's conventions)."""

    blob: str = ""  # its URL, without the SAS
    reused: bool = False  # the blob held this image already: nothing was uploaded
    bytes_sent: int = 0
    ranges_sent: int = 0  # Put Page calls
    disk_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)  # the az commands that make the image

    def as_json(self) -> dict[str, Any]:
        return result_json(self)


def fixed_vhd(vhd: Path) -> int:
    """The VHD's size when it is what Azure takes (a fixed VHD of a whole number of MiB, its footer
    intact); InputError otherwise, before anything is uploaded."""
    size = vhd.stat().st_size
    if size < MIB + VHD_FOOTER:
        raise InputError(f"{vhd.name}: {size} bytes is too small to be a disk image's fixed VHD")
    with vhd.open("rb") as stream:
        stream.seek(-VHD_FOOTER, 2)
        footer = stream.read(VHD_FOOTER)
    if footer[:8] != b"conectix":
        raise InputError(f"{vhd.name}: no VHD footer at its end: not a fixed VHD")
    if int.from_bytes(footer[60:64], "big") != 2:
        raise InputError(f"{vhd.name}: a dynamic or differencing VHD: Azure takes fixed VHDs only")
    if int.from_bytes(footer[64:68], "big") != vhd_checksum(footer):
        raise InputError(f"{vhd.name}: the VHD footer's checksum is wrong: the file is damaged")
    current = int.from_bytes(footer[48:56], "big")
    if current != size - VHD_FOOTER or current % MIB:
        raise InputError(f"{vhd.name}: disk size {current} is not the file's less its footer, in whole MiB")
    return size


def page_runs(data: bytes, offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of each run of pages in `data` that are not all zeros; `offset` is data's own."""
    start = -1
    for at in range(0, len(data), PAGE):
        zero = data[at : at + PAGE] == _ZERO_PAGE
        if zero and start >= 0:
            yield offset + start, data[start:at]
            start = -1
        elif not zero and start < 0:
            start = at
    if start >= 0:
        yield offset + start, data[start:]


def ranges(vhd: Path) -> Iterator[tuple[int, bytes]]:
    """Every run of non-zero pages of the file, none longer than MAX_PUT; holes are never read."""
    offset = 0
    for length, data in sparse.chunks(vhd, MAX_PUT):
        if data is not None:
            yield from page_runs(data, offset)
        offset += length


@dataclass(frozen=True)
class Container:
    """The container a blob goes to: its URL (without a query: what messages show) and a credential."""

    url: str
    sas: str = ""  # the URL's query, when it has one
    connection_string: str = ""

    @classmethod
    def parse(cls, url: str, environ: Mapping[str, str]) -> Container:
        parts = urlsplit(url)
        plain = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        if parts.scheme not in ("http", "https") or not parts.netloc or not parts.path.strip("/"):
            raise InputError(f"--container {plain}: expected https://ACCOUNT.blob.core.windows.net/CONTAINER[?SAS]")
        if parts.query:
            return cls(plain, sas=parts.query)
        if environ.get(CONNECTION_STRING):
            return cls(plain, connection_string=environ[CONNECTION_STRING])
        raise InputError(
            f"no credentials for {plain}: add a SAS to its URL (...?sv=...&sig=...) or set {CONNECTION_STRING}"
        )

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[1]

    def blob_url(self, blob: str) -> str:
        return f"{self.url}/{quote(blob)}"

    def client(self, blob: str) -> BlobClient:
        """A new client of the blob, with its own HTTP session: one per thread that uploads."""
        from azure.storage.blob import BlobClient, BlobServiceClient  # an optional extra (kiln[azure])

        if self.sas:
            return BlobClient.from_blob_url(f"{self.blob_url(blob)}?{self.sas}", **RETRIES)
        try:
            service = BlobServiceClient.from_connection_string(self.connection_string, **RETRIES)
        except ValueError:
            raise InputError(f"{CONNECTION_STRING} is not a storage connection string") from None
        account = self.url.rsplit("/", 1)[0]
        if service.url.rstrip("/") != account:
            raise InputError(f"{CONNECTION_STRING} is for {service.url.rstrip('/')}, not {account} (--container)")
        return service.get_blob_client(self.name, blob)


def error_code(exc: AzureError) -> str:
    """The storage service's error code (ContainerNotFound, AuthenticationFailed, ...), "" without one."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def refusal(exc: AzureError, container: Container, what: str, left: str = "") -> KilnError:
    """The error to show for a failed call: bad input (no such container, credentials refused,
    no answer) exits 2; anything else 1, saying what the run left."""
    from azure.core.exceptions import HttpResponseError, ServiceRequestError

    code = error_code(exc)
    status = getattr(exc, "status_code", None)
    if isinstance(exc, HttpResponseError) and code == "ContainerNotFound":
        return InputError(f"container {container.url} does not exist: create it first (az storage container create)")
    if isinstance(exc, HttpResponseError) and status in (401, 403):
        return InputError(
            f"Azure refused the credentials for {container.url} ({code or status}): the SAS needs read, create "
            f"and write on the container, or {CONNECTION_STRING} an account key of its account"
            + (f"; {left}" if left else "")
        )
    first_line = _SIGNATURE.sub(r"\1...", (str(exc).splitlines() or [""])[0])  # a library's message may hold the URL
    if isinstance(exc, ServiceRequestError):
        return InputError(f"cannot reach {container.url}: {first_line}")
    detail = f"{status} {code}".strip() or first_line
    return UploadFailed(f"{what} failed: {detail}" + (f"; {left}" if left else ""))


def call(container: Container, what: str, action: Callable[[], T], left: str = "") -> T:
    """`action()`, its failure as refusal() says."""
    from azure.core.exceptions import AzureError

    try:
        return action()
    except AzureError as exc:
        raise refusal(exc, container, what, left) from None


def upload(image: CloudImage, options: Options, work: Path, say: Callable[[str], None]) -> Result:
    """Write (or find) the image's page blob in the container; the result names it and the commands."""
    began = time.monotonic()
    container = Container.parse(options.container, os.environ)
    name = image_name(options.name_template, image) + ".vhd"
    image.check_digest()
    vhd = image.raw(work)
    result = Result(blob=container.blob_url(name), disk_bytes=fixed_vhd(vhd))
    blob = container.client(name)
    if already_there(blob, container, image, say):
        say(f"{result.blob} is this image already ({DIGEST_KEY}); nothing to upload")
        result.reused = True
    else:
        write_blob(container, blob, vhd, image, options.workers, result, say)
        result.seconds["upload"] = time.monotonic() - began
    result.commands = image_commands(image, result.blob, blob.account_name or "", options)
    result.seconds["total"] = time.monotonic() - began
    return result


def already_there(blob: BlobClient, container: Container, image: CloudImage, say: Callable[[str], None]) -> bool:
    """Whether the blob holds this image, whole. A blob that holds something else is refused, never
    overwritten; one an earlier upload of this image left unfinished is written again."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    try:
        metadata = blob.get_blob_properties().metadata or {}
    except ResourceNotFoundError as exc:
        if error_code(exc) == "BlobNotFound":
            return False
        raise refusal(exc, container, "reading the blob") from None
    except AzureError as exc:
        raise refusal(exc, container, "reading the blob") from None
    if metadata.get(DIGEST_KEY) == image.artifact_sha256:
        return True
    if metadata.get(PENDING_KEY) == image.artifact_sha256:
        say(f"{container.blob_url(blob.blob_name)}: an unfinished upload of this image; writing it again")
        return False
    held = metadata.get(DIGEST_KEY) or metadata.get(PENDING_KEY) or "no kiln digest"
    raise InputError(
        f"{container.blob_url(blob.blob_name)} exists and is another image ({held[:16]}): "
        "give another --name-template, or delete the blob"
    )


def metadata(image: CloudImage, *, done: bool) -> dict[str, str]:
    digest = {DIGEST_KEY if done else PENDING_KEY: image.artifact_sha256}
    return {
        **digest,
        "kiln_manifest_sha256": image.manifest_sha256,
        "kiln_version": image.version,
        "kiln_profile": image.profile,
        "kiln_arch": image.arch,
        "kiln_schematic": image.schematic or "none",
    }


def write_blob(
    container: Container,
    blob: BlobClient,
    vhd: Path,
    image: CloudImage,
    workers: int,
    result: Result,
    say: Callable[[str], None],
) -> None:
    """The page blob: made empty at the disk's size, its non-zero pages put in parallel, then named
    by its digest (only now, so a blob with the digest is a whole one)."""
    size = result.disk_bytes
    call(container, "creating the page blob", lambda: blob.create_page_blob(size, metadata=metadata(image, done=False)))
    clients: queue.Queue[BlobClient] = queue.Queue()  # one per worker: a client's HTTP session is not shared
    for _ in range(workers):
        clients.put(container.client(blob.blob_name))
    left = f"{result.blob} is unfinished (no {DIGEST_KEY}); the next run writes it again"

    def put(offset: int, data: bytes) -> None:
        client = clients.get()
        try:
            what = f"Put Page at {offset}"
            call(container, what, lambda: client.upload_page(data, offset, len(data), validate_content="md5"), left)
        finally:
            clients.put(client)

    result.ranges_sent, result.bytes_sent = send_in_parallel(ranges(vhd), put, workers)
    call(container, "setting the blob's metadata", lambda: blob.set_blob_metadata(metadata(image, done=True)), left)
    while not clients.empty():
        clients.get().close()
    sent, skipped = result.bytes_sent // 1024, (size - result.bytes_sent) // MIB
    say(f"{result.blob}: {result.ranges_sent} ranges, {sent} KiB sent; {skipped} MiB of zeros skipped")


def image_commands(image: CloudImage, blob_url: str, account: str, options: Options) -> list[str]:
    """The az commands that make an image of the blob. A managed image on amd64 unless a gallery is named;
    arm64 needs a gallery (managed images are x64 only). What the options leave open is a shell variable."""
    group = shlex.quote(options.resource_group) if options.resource_group else '"$RESOURCE_GROUP"'
    name = shlex.quote(image_name(options.name_template, image))
    if not options.gallery and image.arch == "amd64":
        return [
            f"az image create --resource-group {group} --name {name} --source {shlex.quote(blob_url)} "
            "--os-type Linux --hyper-v-generation V2"
        ]
    gallery = shlex.quote(options.gallery) if options.gallery else '"$GALLERY"'
    definition = shlex.quote(f"kiln-{image.profile}-{image.arch}")
    version = image.version if GALLERY_VERSION.fullmatch(image.version) else '"$IMAGE_VERSION"'
    where = f"--resource-group {group} --gallery-name {gallery} --gallery-image-definition {definition}"
    return [
        f"az sig image-definition create {where} --publisher kiln --offer {shlex.quote(image.profile)} "
        f"--sku {image.arch} --os-type Linux --os-state Generalized --hyper-v-generation V2 "
        f"--architecture {ARCHITECTURES[image.arch]}",
        f"az sig image-version create {where} --gallery-image-version {version} "
        f"--os-vhd-uri {shlex.quote(blob_url)} --os-vhd-storage-account {shlex.quote(account)}",
    ]
