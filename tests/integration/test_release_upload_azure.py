"""`kiln release upload azure` against Azurite: Microsoft's Azure Storage emulator (npm, installed by
scripts/setup-host.sh), a real local HTTP server speaking the Blob service's API, reached with a SAS in
the container's URL or a connection string, as Azure is.

Each module starts its own Azurite, blob service only, on a free port with its data in a temporary
directory, and waits until a real request (making the test's container) succeeds. Without azurite
the tests skip, unless CI is set: there they fail, as setup-host.sh should have installed it.

The output directory is made here, not by `kiln image` (which takes minutes): a sparse 64 MiB raw disk
with a few runs of data (one longer than a Put Page takes), made a fixed VHD by Kiln's own writer
(kiln.image.outputs.formats, qemu-img and the footer patch), beside a manifest.json in kiln image's shape.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kiln.cloud.azure import DIGEST_KEY, MAX_PUT, PAGE, PENDING_KEY
from kiln.core.hashing import file_sha256
from kiln.image.assets import BootAssets
from kiln.image.outputs.formats import convert
from tests.integration import services
from tests.integration.conftest import ROOT
from tests.integration.services import AZURITE_ACCOUNT, AZURITE_KEY, Azurite

pytestmark = pytest.mark.integration

blob = pytest.importorskip("azure.storage.blob")

DISK = 64 << 20
# byte offset -> bytes written there: a first sector, a run longer than one Put Page takes, a write that
# straddles two pages, and the disk's last sector (the VHD's footer follows it)
FILLED = {0: b"\x01" * 16, 8 << 20: b"kiln" * ((MAX_PUT + 3 * PAGE) // 4), (20 << 20) + 500: b"\xff" * 40}
FILLED[DISK - PAGE] = b"end"
CONTAINER = "images"


def sas_url(emulator: Azurite, container: str = CONTAINER, permission: str = "rcw") -> str:
    """The container's URL with a SAS of `permission` (r read, c create, w write) in it."""
    sas = blob.generate_container_sas(
        AZURITE_ACCOUNT,
        container,
        account_key=AZURITE_KEY,
        permission=blob.ContainerSasPermissions.from_string(permission),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    return f"{emulator.account_url}/{container}?{sas}"


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azurite]:
    yield from services.azurite(CONTAINER)


def fake_assets(root: Path) -> BootAssets:
    """What Kiln's VHD writer takes from the boot assets: the epoch and seed its footer is stamped with."""
    root.mkdir(parents=True, exist_ok=True)
    kernel, initrd = root / "vmlinuz", root / "initramfs.zst"
    kernel.write_bytes(b"fake kernel\n")
    initrd.write_bytes(b"fake initramfs\n")
    return BootAssets.make(kernel, initrd, "console=ttyS0 kiln.platform=azure", "0.1.0", 1704067200)


def output_dir(where: Path, version: str = "1.2.3", *, compressed: bool = False, fmt: str = "vhd") -> Path:
    """An azure output directory as kiln image writes one: the fixed VHD (zstd-compressed when asked)
    and manifest.json listing it with its sha256."""
    where.mkdir(parents=True)
    raw = where.parent / f"{where.name}.raw"
    with raw.open("wb") as disk:
        disk.truncate(DISK)
        for offset, data in FILLED.items():
            disk.seek(offset)
            disk.write(data)
    artifact = where / "azure-amd64.vhd"
    if fmt == "vhd":
        convert(raw, "vhd", artifact, fake_assets(where.parent / f"{where.name}-assets"))
    elif fmt == "dynamic":  # what qemu-img makes of a vpc by default
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "vpc", str(raw), str(artifact)], check=True)
    else:  # the raw disk under a .vhd name
        shutil.copyfile(raw, artifact)
    raw.unlink()
    if compressed:
        subprocess.run(["zstd", "-q", "--rm", str(artifact)], check=True)
        artifact = artifact.with_name(artifact.name + ".zst")
    manifest = {
        "profile": {"arch": "amd64", "kind": "image", "name": "azure", "platform": "azure", "version": version},
        "artifacts": [{"path": artifact.name, "sha256": file_sha256(artifact), "size": artifact.stat().st_size}],
        "inputs": {},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    return where


def vhd_bytes(directory: Path) -> bytes:
    """The directory's VHD as Azure must hold it: decompressed."""
    [artifact] = [p for p in directory.iterdir() if p.name.startswith("azure-amd64.vhd")]
    if artifact.suffix == ".zst":
        return subprocess.run(["zstd", "-dcq", str(artifact)], capture_output=True, check=True).stdout
    return artifact.read_bytes()


def kiln(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "AZURE_STORAGE_CONNECTION_STRING"}
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", "release", "upload", "azure", *args],
        cwd=ROOT,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def nonzero_pages(data: bytes) -> set[int]:
    zero = bytes(PAGE)
    return {at // PAGE for at in range(0, len(data), PAGE) if data[at : at + PAGE] != zero}


def reported_pages(client: Any) -> set[int]:
    """The pages Azurite says the blob has written, from its page ranges."""
    pages: set[int] = set()
    for written in client.list_page_ranges():
        assert written["start"] % PAGE == 0 and (written["end"] + 1) % PAGE == 0
        pages.update(range(written["start"] // PAGE, (written["end"] + 1) // PAGE))
    return pages


@pytest.mark.parametrize("compressed", [False, True], ids=["vhd", "vhd.zst"])
def test_an_upload_writes_only_the_pages_that_hold_data(azurite: Azurite, tmp_path: Path, compressed: bool) -> None:
    version = "1.2.4" if compressed else "1.2.3"
    directory = output_dir(tmp_path / "azure", version, compressed=compressed)
    first = kiln(str(directory), "--container", sas_url(azurite), "--resource-group", "rg", "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    result = json.loads(first.stdout)
    name = f"kiln-azure-{version}-amd64.vhd"
    assert result["blob"] == f"{azurite.account_url}/{CONTAINER}/{name}" and result["reused"] is False
    assert "sig=" not in first.stdout + first.stderr, "the SAS is never shown"

    expected = vhd_bytes(directory)
    client = azurite.service().get_blob_client(CONTAINER, name)
    assert client.download_blob().readall() == expected  # byte for byte
    written = nonzero_pages(expected)
    assert reported_pages(client) == written  # only the pages holding data were put
    assert result["disk_bytes"] == DISK + 512 == len(expected)
    assert result["bytes_sent"] == len(written) * PAGE < result["disk_bytes"] // 10
    # one put per run of data; the run longer than MAX_PUT in two, and the disk's last sector and the
    # footer after it in two too (each put lies within one MAX_PUT-aligned read)
    assert result["ranges_sent"] == 6 and set(result["seconds"]) == {"upload", "total"}
    properties = client.get_blob_properties()
    assert properties.blob_type == blob.BlobType.PAGEBLOB
    manifest = json.loads((directory / "manifest.json").read_text())
    assert properties.metadata[DIGEST_KEY] == manifest["artifacts"][0]["sha256"]
    assert PENDING_KEY not in properties.metadata and properties.metadata["kiln_version"] == version
    assert result["commands"] == [
        f"az image create --resource-group rg --name kiln-azure-{version}-amd64 --source {result['blob']} "
        "--os-type Linux --hyper-v-generation V2"
    ]

    # the same image again, this time with the connection string: found by its digest, nothing written
    again = kiln(str(directory), "--container", f"{azurite.account_url}/{CONTAINER}", "--json",
                 env={"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string()})  # fmt: skip
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["reused"] is True and second["bytes_sent"] == 0 and second["blob"] == result["blob"]
    assert "is this image already" in again.stderr
    assert client.get_blob_properties().etag == properties.etag, "the blob was not touched"


def test_the_printed_commands_make_a_gallery_image_version(azurite: Azurite, tmp_path: Path) -> None:
    directory = output_dir(tmp_path / "azure", "2.0.0")
    done = kiln(str(directory), "--container", sas_url(azurite), "--gallery", "kiln", "--name-template", "k-{arch}")
    assert done.returncode == 0, done.stderr
    url, comment, definition, version = done.stdout.splitlines()
    assert url == f"{azurite.account_url}/{CONTAINER}/k-amd64.vhd" and comment.startswith("#")
    where = '--resource-group "$RESOURCE_GROUP" --gallery-name kiln --gallery-image-definition kiln-azure-amd64'
    assert definition.startswith(f"az sig image-definition create {where} ") and "--architecture x64" in definition
    assert version == (
        f"az sig image-version create {where} --gallery-image-version 2.0.0 --os-vhd-uri {url} "
        f"--os-vhd-storage-account {AZURITE_ACCOUNT}"
    )


def test_an_unfinished_upload_is_written_again(azurite: Azurite, tmp_path: Path) -> None:
    """A SAS that may create but not write: the blob is made, its first page refused (exit 2, the
    credentials), and left marked unfinished; the next run with a full SAS writes it whole."""
    directory = output_dir(tmp_path / "azure", "3.0.0")
    refused = kiln(str(directory), "--container", sas_url(azurite, permission="rc"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Azure refused the credentials" in refused.stderr and "Traceback" not in refused.stderr
    assert "is unfinished" in refused.stderr
    client = azurite.service().get_blob_client(CONTAINER, "kiln-azure-3.0.0-amd64.vhd")
    left = client.get_blob_properties().metadata
    assert DIGEST_KEY not in left and left[PENDING_KEY] == file_sha256(directory / "azure-amd64.vhd")

    again = kiln(str(directory), "--container", sas_url(azurite), "--json")
    assert again.returncode == 0, again.stderr
    assert "an unfinished upload of this image; writing it again" in again.stderr
    assert json.loads(again.stdout)["reused"] is False
    assert client.download_blob().readall() == vhd_bytes(directory)
    assert DIGEST_KEY in client.get_blob_properties().metadata


def test_bad_artifacts_are_refused_before_anything_is_sent(azurite: Azurite, tmp_path: Path) -> None:
    url = sas_url(azurite)
    before = {b.name for b in azurite.service().get_container_client(CONTAINER).list_blobs()}

    def refused(directory: Path, message: str) -> None:
        run = kiln(str(directory), "--container", url)
        assert run.returncode == 2 and message in run.stderr, run.stdout + run.stderr
        assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1

    refused(tmp_path / "nowhere", "no manifest.json")
    refused(output_dir(tmp_path / "raw", fmt="raw"), "no VHD footer at its end: not a fixed VHD")
    refused(output_dir(tmp_path / "dynamic", fmt="dynamic"), "a dynamic or differencing VHD")
    changed = output_dir(tmp_path / "changed")
    with (changed / "azure-amd64.vhd").open("r+b") as vhd:
        vhd.write(b"\x02")
    refused(changed, "is not the one kiln image wrote")
    aws = output_dir(tmp_path / "aws")
    manifest = json.loads((aws / "manifest.json").read_text())
    manifest["profile"]["platform"] = "aws"
    (aws / "manifest.json").write_text(json.dumps(manifest))
    refused(aws, "for platform 'aws', not 'azure'")
    after = {b.name for b in azurite.service().get_container_client(CONTAINER).list_blobs()}
    assert after == before, "nothing reached the container"


def test_containers_credentials_and_options_that_are_wrong(azurite: Azurite, tmp_path: Path) -> None:
    directory = output_dir(tmp_path / "azure", "4.0.0")

    def refused(message: str, *args: str, env: dict[str, str] | None = None) -> None:
        run = kiln(str(directory), *args, env=env)
        assert run.returncode == 2 and message in run.stderr, run.stdout + run.stderr
        assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
        assert "SECRET" not in run.stderr and not re.search(r"sig=(?!\.\.\.)", run.stderr), "no SAS is shown"

    refused(f"container {azurite.account_url}/missing does not exist", "--container", sas_url(azurite, "missing"))
    wrong_key = azurite.connection_string(key="A" * 86 + "==")
    plain = f"{azurite.account_url}/{CONTAINER}"
    refused("Azure refused the credentials", "--container", plain, env={"AZURE_STORAGE_CONNECTION_STRING": wrong_key})
    forged = sas_url(azurite).replace("sig=", "sig=AA")
    refused("Azure refused the credentials", "--container", forged)
    refused("no credentials for", "--container", plain)
    port = services.free_port()  # where nothing listens
    nobody = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}/{CONTAINER}?sv=1&sig=SECRET"
    refused(f"cannot reach http://127.0.0.1:{port}/", "--container", nobody)
    other = f"http://127.0.0.1:{azurite.port}/otheraccount/{CONTAINER}"
    refused("is for", "--container", other, env={"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string()})
    refused("needs --container URL")
    refused("--regions is for kiln release upload aws, not azure", "--container", plain, "--regions", "eu-west-1")

    # a blob of that name holding another image is never overwritten
    taken = azurite.service().get_blob_client(CONTAINER, "kiln-azure-4.0.0-amd64.vhd")
    taken.upload_blob(b"someone else's", metadata={DIGEST_KEY: "f" * 64})
    refused("exists and is another image", "--container", sas_url(azurite))
    assert taken.download_blob().readall() == b"someone else's"


def test_the_aws_verb_refuses_azure_options(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "release", "upload", "aws", str(tmp_path), "--container", "http://x/a/b"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--container is for kiln release upload azure, not aws" in run.stderr
