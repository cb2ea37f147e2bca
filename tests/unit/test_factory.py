"""The factory's HTTP service and build queue, over real sockets on loopback.

The builds here are a stub runner (it writes a few files in place of `kiln image`, or fails, or
waits on an event), so the service's own rules are tested fast: status codes, build-once, the
queue bound, what a path may reach. tests/e2e/test_factory.py runs the real builder: a real
image built through the factory and booted.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from kiln.factory.builds import Builds, Target
from kiln.factory.catalog import Catalog, Offer
from kiln.factory.guard import Registries
from kiln.factory.server import Limits
from kiln.factory.service import serve
from kiln.factory.state import Factory

TOKEN = "t" * 32
VERSION = "1.4.0"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Stub:
    """A runner standing in for `kiln image`: counts its calls, can be held or made to fail."""

    calls: list[Target] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    fail: bool = False

    def __call__(self, target: Target, out: Path, log: Path) -> None:
        self.calls.append(target)
        log.write_text(f"building {target.profile}\n")
        self.hold.wait(10)
        if self.fail:
            log.write_text("building\nerror: the kernel did not build\n")
            raise RuntimeError("kiln image failed (exit 1)")
        out.mkdir()
        (out / "metal-amd64.iso").write_bytes(b"ISO" * 1000)
        (out / "manifest.json").write_text('{"profile": {}}\n')
        (out / "boot.ipxe").write_text("#!ipxe\nkernel vmlinuz\n")
        (out / "link").symlink_to("/etc/passwd")
        layout = out / "installer-amd64"
        (layout / "blobs/sha256").mkdir(parents=True)
        manifest = json.dumps({"schemaVersion": 2, "layers": []}).encode()
        digest = hashlib.sha256(manifest).hexdigest()
        (layout / "blobs/sha256" / digest).write_bytes(manifest)
        index = {
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{digest}"}]
        }
        (layout / "index.json").write_text(json.dumps(index))


@dataclass
class Running:
    url: str
    stub: Stub
    root: Path

    def post(self, body: str, headers: dict[str, str] | None = None) -> requests.Response:
        given = AUTH if headers is None else headers
        return requests.post(f"{self.url}/schematics", data=body.encode(), headers=given, timeout=30)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=30, **kwargs)


def offers() -> dict[str, Offer]:
    return {
        "iso": Offer("iso", "iso", "metal", "metal-amd64.iso"),
        "pxe": Offer("pxe", "pxe", "metal", ""),
        "installer": Offer("installer", "installer", "metal", ""),
    }


@dataclass
class Clock:
    """A monotonic clock the test moves by hand (backoff windows without sleeping)."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def start(
    tmp_path: Path,
    *,
    queue: int = 8,
    clock: Clock | None = None,
    limits: Limits | None = None,
    waiting: int = 32,
    registries: Registries | None = None,
    tls: ssl.SSLContext | None = None,
) -> Iterator[Running]:
    catalog = Catalog(tmp_path, (), tmp_path, VERSION, offers(), ("acpi-call", "lldpd"))
    stub = Stub()
    builds = Builds(tmp_path / "factory", stub, workers=1, queue=queue, clock=clock or Clock())
    factory = Factory(catalog, builds, TOKEN, registries=registries, waiting=waiting)
    server = serve(factory, "127.0.0.1", 0, limits, tls)
    scheme = "https" if tls else "http"
    try:
        yield Running(f"{scheme}://127.0.0.1:{server.server_address[1]}", stub, tmp_path / "factory")
    finally:
        stub.hold.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Running]:
    yield from start(tmp_path)


def schematic_id(factory: Running, body: str = "extensions: [lldpd]\n") -> str:
    answer = factory.post(body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_schematics_are_written_with_the_token_and_named_by_their_content(factory: Running) -> None:
    assert factory.post("extensions: [lldpd]\n", headers={}).status_code == 401
    assert factory.post("extensions: [lldpd]\n", headers={"Authorization": "Bearer wrong"}).status_code == 401
    first = schematic_id(factory, "extensions: [lldpd]\nkernel_args: [quiet]\n")
    assert schematic_id(factory, '{"kernel_args": ["quiet"], "extensions": ["lldpd"]}') == first
    assert factory.get(f"/schematics/{first}").json() == {"extensions": ["lldpd"], "kernel_args": ["quiet"]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("extensions: lldpd\n", "schematic:1: extensions"),
        ("colour: blue\n", "unknown key 'colour'"),
        ("extensions: [wireguard]\n", "extensions: unknown wireguard (this factory has acpi-call, lldpd)"),
        ("kernel_args: [" + "x," * 40000 + "]", "schematic: larger than 65536 bytes"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_a_bad_schematic_is_a_400_naming_the_field(factory: Running, body: str | bytes, message: str) -> None:
    data = body if isinstance(body, bytes) else body.encode()
    answer = requests.post(f"{factory.url}/schematics", data=data, headers=AUTH, timeout=30)
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["error"]
    assert not factory.stub.calls and list((factory.root / "schematics").iterdir()) == []


def test_unknown_profile_version_or_schematic(factory: Running) -> None:
    sid = schematic_id(factory)
    unknown = factory.get(f"/image/{sid}/{VERSION}/floppy.img")
    assert unknown.status_code == 400 and "unknown profile 'floppy'" in unknown.json()["error"]
    assert factory.get(f"/image/{sid}/9.9.9/iso.iso").status_code == 404
    assert factory.get(f"/image/{'0' * 64}/{VERSION}/iso.iso").status_code == 404
    assert factory.get(f"/image/{sid}/{VERSION}/iso.raw").status_code == 404  # iso is downloaded as iso.iso
    assert not factory.stub.calls


def test_concurrent_requests_build_once_and_the_cache_answers_fast(factory: Running) -> None:
    sid = schematic_id(factory)
    answers: list[requests.Response] = []
    clients = [
        threading.Thread(target=lambda: answers.append(factory.get(f"/image/{sid}/{VERSION}/iso.iso")))
        for _ in range(4)
    ]
    for client in clients:
        client.start()
    while not factory.stub.calls:
        time.sleep(0.01)
    factory.stub.hold.set()
    for client in clients:
        client.join()
    assert [a.status_code for a in answers] == [200] * 4 and all(a.content == b"ISO" * 1000 for a in answers)
    assert len(factory.stub.calls) == 1
    began = time.monotonic()
    cached = factory.get(f"/image/{sid}/{VERSION}/iso.iso")
    assert cached.status_code == 200 and time.monotonic() - began < 1.0
    assert len(factory.stub.calls) == 1
    assert factory.get(f"/image/{sid}/{VERSION}/pxe/boot.ipxe").text.startswith("#!ipxe")


def test_paths_reach_only_regular_files_of_a_finished_output(factory: Running) -> None:
    sid = schematic_id(factory)
    factory.stub.hold.set()
    assert factory.get(f"/image/{sid}/{VERSION}/iso/manifest.json").status_code == 200
    assert factory.get(f"/image/{sid}/{VERSION}/iso/link").status_code == 404  # a symlink, even to a real file
    for path in (
        f"/image/{sid}/{VERSION}/iso/..%2F..%2F..%2Fetc%2Fpasswd",
        f"/image/{sid}/{VERSION}/iso/../../schematics/{sid}.json",
        f"/image/{sid}/..%2F{VERSION}/iso.iso",
        "/logs/..%2Ftoken",
    ):
        assert factory.get(path).status_code in (400, 404), path


def test_a_full_queue_is_a_429_with_retry_after(tmp_path: Path) -> None:
    for running in start(tmp_path, queue=0):
        first, second = (schematic_id(running, f"kernel_args: [n={n}]\n") for n in (1, 2))
        waiting = threading.Thread(target=running.get, args=(f"/image/{first}/{VERSION}/iso.iso",))
        waiting.start()
        while not running.stub.calls:
            time.sleep(0.01)
        refused = running.get(f"/image/{second}/{VERSION}/iso.iso")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        running.stub.hold.set()
        waiting.join()
        assert running.get(f"/image/{second}/{VERSION}/iso.iso").status_code == 200  # room again


def test_a_failed_build_is_a_500_pointing_to_its_log_and_is_tried_again_after_its_window(tmp_path: Path) -> None:
    clock = Clock()
    for factory in start(tmp_path, clock=clock):
        sid = schematic_id(factory)
        factory.stub.fail = True
        factory.stub.hold.set()
        failed = factory.get(f"/image/{sid}/{VERSION}/iso.iso")
        assert failed.status_code == 500 and "the build failed" in failed.json()["error"]
        assert failed.headers["Retry-After"] == "30"
        assert "the kernel did not build" in factory.get(failed.json()["log"]).text
        factory.stub.fail = False
        assert factory.get(f"/image/{sid}/{VERSION}/iso.iso").status_code == 500  # the window stands
        clock.now += 30
        assert factory.get(f"/image/{sid}/{VERSION}/iso.iso").status_code == 200
        assert len(factory.stub.calls) == 2


def test_progress_streams_the_log_until_the_build_ends(factory: Running) -> None:
    sid = schematic_id(factory)
    threading.Timer(0.5, factory.stub.hold.set).start()
    streamed = factory.get(f"/progress/{sid}/{VERSION}/iso").text
    assert streamed.startswith("building iso\n") and streamed.endswith("kiln factory: done\n")


def test_the_installer_is_an_oci_image_over_the_distribution_api(factory: Running) -> None:
    sid = schematic_id(factory)
    factory.stub.hold.set()
    assert factory.get("/v2/").status_code == 200
    manifest = factory.get(f"/v2/{sid}/installer/manifests/{VERSION}")
    assert manifest.status_code == 200 and manifest.json() == {"schemaVersion": 2, "layers": []}
    digest = manifest.headers["Docker-Content-Digest"]
    assert digest == "sha256:" + hashlib.sha256(manifest.content).hexdigest()
    assert factory.get(f"/v2/{sid}/installer/blobs/{digest}").content == manifest.content
    assert factory.get(f"/v2/{sid}/installer/manifests/0.0.1").status_code == 404


def test_the_page_and_the_catalog(factory: Running) -> None:
    page = factory.get("/")
    assert page.status_code == 200 and "Kiln image factory" in page.text
    catalog = factory.get("/v1/catalog").json()
    assert catalog["version"] == VERSION and catalog["extensions"] == ["acpi-call", "lldpd"]
    assert {p["name"]: p["ext"] for p in catalog["profiles"]} == {"iso": "iso", "pxe": "", "installer": ""}


def test_the_real_runner_is_kiln_image_with_the_schematic_and_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argv the factory's builds run (subprocess.run stubbed here to record it; tests/e2e/test_factory.py
    runs it for real): the profile by name, the project's trees, the schematic file, the version, the cache."""
    import subprocess

    from kiln.factory import catalog as catalog_module

    seen: list[list[str]] = []

    def record(command: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append(command)
        (tmp_path / "work/image-out/iso").mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", record)
    catalog = Catalog(tmp_path, (tmp_path / "pkgs",), tmp_path / "profiles", VERSION, offers(), ())
    runner = catalog_module.kiln_image_runner(catalog, tmp_path / "schematics", "oci://127.0.0.1:5000/cache")
    runner(Target("a" * 64, VERSION, "iso"), tmp_path / "work/out", tmp_path / "build.log")
    (command,) = seen
    assert command[3:5] == ["image", "iso"] and (tmp_path / "work/out").is_dir()
    text = " ".join(command)
    for expected in (
        f"--pkgs {tmp_path / 'pkgs'}",
        f"--schematic {tmp_path / 'schematics' / ('a' * 64 + '.json')}",
        f"--release-version {VERSION}",
        "--cache-from oci://127.0.0.1:5000/cache",
    ):
        assert expected in text
