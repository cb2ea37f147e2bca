"""End-to-end: the real factory (`kiln factory serve`) over the e2e tier's store.

Its page runs in Debian's Chromium, driven by Playwright (no browser is downloaded): it makes a
schematic with lldpd, and the ISO it links to is built by the real `kiln image`, downloaded
through the page, and boots to ready with lldpd and the schematic's ID. The same download again
comes from the factory's cache in well under a second; the installer answers as an OCI image.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from kiln.boot.qemu import READY, boot, machine_for
from tests.e2e.conftest import KILN, ROOT
from tests.integration.services import free_port

pytestmark = pytest.mark.e2e

TOKEN = "e2e-factory-token-0123456789"
CHROMIUM = "/usr/bin/chromium"
BUILD_TIMEOUT = 900.0  # an ISO from stored packages takes seconds; the packages are the e2e tier's


@pytest.fixture(scope="module")
def factory(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The factory on a free loopback port, with its own directory (image_dir: the packages are stored)."""
    base = tmp_path_factory.mktemp("factory")
    (base / "token").write_text(TOKEN + "\n")
    port = free_port()
    command = [*KILN, "factory", "serve", "--listen", f"127.0.0.1:{port}", "--root", str(base / "root")]
    with (base / "factory.log").open("wb") as log:
        process = subprocess.Popen(
            [*command, "--token-file", str(base / "token")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/v1/catalog", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        assert process.poll() is None, (base / "factory.log").read_text()
        yield url
    finally:
        process.terminate()
        process.wait(30)


def test_the_page_makes_a_schematic_whose_iso_boots(factory: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(accept_downloads=True)
            page.goto(factory)
            page.check("input[name=extension][value=lldpd]")
            page.select_option("#platform", "metal")
            page.fill("#token", TOKEN)
            page.click("#create")
            page.wait_for_selector("#result:not([hidden])")
            schematic_id = (page.text_content("#schematic-id") or "").strip()
            with page.expect_download(timeout=BUILD_TIMEOUT * 1000) as download:
                page.click("a[data-profile=iso]")
            iso = tmp_path / "metal-amd64.iso"
            download.value.save_as(iso)
        finally:
            browser.close()
    assert len(schematic_id) == 64
    stored = requests.get(f"{factory}/schematics/{schematic_id}", timeout=30).json()
    assert stored == {"extensions": ["lldpd"]}
    began = time.monotonic()
    again = requests.get(f"{factory}/image/{schematic_id}/{version(factory)}/iso.iso", timeout=30)
    assert again.status_code == 200 and time.monotonic() - began < 1.0
    assert again.content == iso.read_bytes()
    manifest = requests.get(f"{factory}/image/{schematic_id}/{version(factory)}/iso/manifest.json", timeout=30)
    assert manifest.json()["profile"]["schematic"] == schematic_id
    log = tmp_path / "console.log"
    result = boot(machine_for(iso), READY, 240.0, log)
    lines = log.read_text(errors="replace").splitlines()
    assert result.ok, "\n".join(result.tail)
    assert any(f"machined: schematic {schematic_id}" in line for line in lines)
    assert any(READY in line and "extensions=[lldpd]" in line for line in lines)


def version(factory: str) -> str:
    return str(requests.get(f"{factory}/v1/catalog", timeout=30).json()["version"])


def test_bad_requests_cost_nothing(factory: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bad = requests.post(f"{factory}/schematics", data=b"extensions: [wireguard]\n", headers=auth, timeout=30)
    assert bad.status_code == 400 and "unknown wireguard" in bad.json()["error"]
    made = requests.post(f"{factory}/schematics", data=json.dumps({"kernel_args": ["quiet"]}), headers=auth, timeout=30)
    sid = made.json()["id"]
    unknown = requests.get(f"{factory}/image/{sid}/{version(factory)}/floppy.img", timeout=30)
    assert unknown.status_code == 400 and "unknown profile 'floppy'" in unknown.json()["error"]
    assert requests.get(f"{factory}/image/{sid}/0.0.0-nope/iso.iso", timeout=30).status_code == 404
