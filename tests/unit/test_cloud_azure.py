"""kiln.cloud.azure's pieces that need no service: the page runs a disk is sent as, the fixed VHD check,
the container URL and its credentials, and the az commands printed for the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cloud.artifact import DEFAULT_NAME, CloudImage
from kiln.cloud.azure import MAX_PUT, PAGE, Container, Options, fixed_vhd, image_commands, page_runs, ranges
from kiln.core.errors import InputError
from kiln.image.outputs.formats import MIB, vhd_checksum


def vhd_footer(size: int, disk_type: int = 2) -> bytes:
    footer = bytearray(512)
    footer[:8] = b"conectix"
    footer[48:56] = size.to_bytes(8, "big")
    footer[60:64] = disk_type.to_bytes(4, "big")
    footer[64:68] = vhd_checksum(footer).to_bytes(4, "big")
    return bytes(footer)


def test_page_runs_are_the_runs_of_pages_that_are_not_all_zeros() -> None:
    data = bytearray(16 * PAGE)
    data[0] = 1  # page 0
    data[3 * PAGE + 511] = 1  # pages 3 and 4: a run
    data[4 * PAGE] = 1
    data[15 * PAGE] = 1  # the last page
    runs = list(page_runs(bytes(data), 1 << 20))
    found = [(offset - (1 << 20), len(run)) for offset, run in runs]
    assert found == [(0, PAGE), (3 * PAGE, 2 * PAGE), (15 * PAGE, PAGE)]
    assert runs[1][1] == bytes(data[3 * PAGE : 5 * PAGE])
    assert list(page_runs(bytes(8 * PAGE), 0)) == []


def test_ranges_never_exceed_one_put_and_skip_holes(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with disk.open("wb") as out:
        out.truncate(3 * MAX_PUT)
        out.seek(MAX_PUT // 2)
        out.write(b"\x07" * (MAX_PUT + PAGE))  # a run across a MAX_PUT boundary
    found = list(ranges(disk))
    assert [(offset, len(data)) for offset, data in found] == [
        (MAX_PUT // 2, MAX_PUT // 2),
        (MAX_PUT, MAX_PUT // 2 + PAGE),
    ]
    assert all(len(data) <= MAX_PUT and offset % PAGE == 0 for offset, data in found)


def test_fixed_vhd_takes_what_azure_takes_and_says_why_not(tmp_path: Path) -> None:
    def vhd(name: str, size: int, footer: bytes) -> Path:
        path = tmp_path / name
        with path.open("wb") as out:
            out.truncate(size)
            out.seek(size)
            out.write(footer)
        return path

    assert fixed_vhd(vhd("good.vhd", 2 * MIB, vhd_footer(2 * MIB))) == 2 * MIB + 512
    cases = {
        "dynamic": (vhd_footer(2 * MIB, disk_type=3), "dynamic or differencing"),
        "odd": (vhd_footer(2 * MIB - 4096), "is not the file's less its footer"),
        "plain": (bytes(512), "no VHD footer"),
    }
    for name, (footer, message) in cases.items():
        with pytest.raises(InputError, match=message):
            fixed_vhd(vhd(f"{name}.vhd", 2 * MIB if name != "odd" else 2 * MIB - 4096, footer))
    broken = bytearray(vhd_footer(2 * MIB))
    broken[64] ^= 1
    with pytest.raises(InputError, match="checksum is wrong"):
        fixed_vhd(vhd("broken.vhd", 2 * MIB, bytes(broken)))
    with pytest.raises(InputError, match="too small"):
        fixed_vhd(vhd("tiny.vhd", 0, b"x"))


def test_container_urls_and_their_credentials() -> None:
    with_sas = Container.parse("https://acct.blob.core.windows.net/images/?sv=1&sig=secret", {})
    assert with_sas.url == "https://acct.blob.core.windows.net/images" and with_sas.sas == "sv=1&sig=secret"
    assert with_sas.name == "images" and with_sas.blob_url("a b.vhd") == f"{with_sas.url}/a%20b.vhd"
    from_env = Container.parse(
        "https://acct.blob.core.windows.net/images", {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct"}
    )
    assert from_env.sas == "" and from_env.connection_string == "AccountName=acct"
    with pytest.raises(InputError, match=r"no credentials for https://acct\.blob\.core\.windows\.net/images:"):
        Container.parse("https://acct.blob.core.windows.net/images", {})
    for bad in ("acct/images", "ftp://acct/images", "https://acct.blob.core.windows.net/"):
        with pytest.raises(InputError, match="expected https://ACCOUNT"):
            Container.parse(bad + "?sig=secret", {})
    with pytest.raises(InputError) as refused:
        Container.parse("file:///images?sig=secret", {})
    assert "secret" not in str(refused.value), "a SAS is never shown"


def image(arch: str = "amd64", version: str = "1.2.3") -> CloudImage:
    return CloudImage(Path("_out/azure"), Path("_out/azure/azure-amd64.vhd"), "azure", "azure", arch, version, "", "0")


def test_commands_for_a_managed_image_and_a_gallery() -> None:
    url = "https://acct.blob.core.windows.net/images/kiln-azure-1.2.3-amd64.vhd"
    [managed] = image_commands(image(), url, "acct", Options("u", resource_group="my rg"))
    assert managed == (
        f"az image create --resource-group 'my rg' --name kiln-azure-1.2.3-amd64 --source {url} "
        "--os-type Linux --hyper-v-generation V2"
    )
    # arm64 needs a gallery; a version Azure cannot take is left to the user, as a variable
    definition, version = image_commands(image("arm64", "1.2.3-dev.4.gabc"), url, "acct", Options("u", DEFAULT_NAME))
    assert '--resource-group "$RESOURCE_GROUP" --gallery-name "$GALLERY"' in definition
    assert "--architecture Arm64" in definition and "--sku arm64" in definition
    assert '--gallery-image-version "$IMAGE_VERSION"' in version and "--os-vhd-storage-account acct" in version
