"""`kiln build` for real: bubblewrap, a debootstrap seed, gcc, the content-addressed store."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.integration.conftest import Project

pytestmark = pytest.mark.integration

FIXTURE_PACKAGES = {"greet-lib", "greet-conf-src", "greet-conf", "greet-app", "greet-test"}


def statuses(run_out: str) -> dict[str, str]:
    return {name: info["status"] for name, info in json.loads(run_out)["packages"].items()}


def test_cold_cached_and_incremental_builds(project: Project) -> None:
    out = project.root / "_out"
    cold = project.kiln("build", "greet-test", "--json", "--out", str(out), check=True)
    assert statuses(cold.out) == {name: "built" for name in FIXTURE_PACKAGES}
    assert (out / "greet-test/result.txt").read_text() == "Howdy, kiln!\n"
    binary = out / "greet-test"
    assert binary.is_dir()

    logs_before = sorted(p.name for p in (project.cache / "logs").rglob("*.log"))
    warm = project.kiln("build", "greet-test", "--json", check=True)
    assert statuses(warm.out) == {name: "cached" for name in FIXTURE_PACKAGES}
    assert sorted(p.name for p in (project.cache / "logs").rglob("*.log")) == logs_before

    lib = project.pkgs / "greet-lib/pkg.yaml"
    lib.write_text(lib.read_text().replace("gcc -O2 -c", "gcc -O1 -c"))
    again = project.kiln("build", "greet-test", "--json", check=True)
    assert statuses(again.out) == {
        "greet-lib": "built",
        "greet-app": "built",
        "greet-test": "built",
        "greet-conf-src": "cached",
        "greet-conf": "cached",
    }
    verify = project.kiln("cache", "verify", check=True)
    assert "0 damaged" in verify.out


def test_outputs_are_root_owned_and_clamped(project: Project) -> None:
    project.kiln("build", "greet-app", "--out", "out", check=True)
    binary = project.root / "out/greet-app/usr/bin/greet"
    info = binary.stat()
    assert (info.st_uid, info.st_gid) == (0, 0)
    assert info.st_mtime <= 1704067200
    assert info.st_mode & 0o777 == 0o755


def add_package(project: Project, name: str, text: str) -> None:
    (project.pkgs / name).mkdir()
    (project.pkgs / name / "pkg.yaml").write_text(text)


def test_step_cannot_reach_host_loopback(project: Project) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    add_package(
        project,
        "probe-net",
        f"""
name: probe-net
variant: stage0
steps:
  - build:
      - |
        if python3 -c "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"; then
          echo REACHED; exit 1
        fi
        mkdir -p /out && echo isolated > /out/result
finalize: [{{from: /out, to: /}}]
""",
    )
    result = project.kiln("build", "probe-net")
    try:
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert result.code == 0, result.err


def test_step_cannot_see_host_files(project: Project, tmp_path: Path) -> None:
    canary = Path("/tmp") / f"kiln-canary-{os.getpid()}"
    canary.write_text("secret")
    try:
        add_package(
            project,
            "probe-fs",
            f"""
name: probe-fs
variant: stage0
steps:
  - build:
      - test ! -e {canary}
      - test ! -e {project.root}
      - test ! -e {project.cache}
      - mkdir -p /out && echo ok > /out/result
finalize: [{{from: /out, to: /}}]
""",
        )
        result = project.kiln("build", "probe-fs")
        assert result.code == 0, result.err
    finally:
        canary.unlink()


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Files served over real HTTP on loopback, as an upstream would."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def evil_tar(kind: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("pkg/README")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
        if kind == "dotdot":
            info = tarfile.TarInfo("pkg/../../escape")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        elif kind == "absolute":
            info = tarfile.TarInfo("/etc/escape")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        elif kind == "symlink":
            info = tarfile.TarInfo("pkg/link")
            info.type = tarfile.SYMTYPE
            info.linkname = "../../../etc/passwd"
            tar.addfile(info)
    return buffer.getvalue()


def source_package(name: str, url: str, sha: str) -> str:
    return f"""
name: {name}
variant: stage0
steps:
  - sources:
      - url: {url}
        destination: src.tar.gz
        sha256: {sha}
    build:
      - tar -xzf src.tar.gz
      - mkdir -p /out && cp -r pkg /out/
finalize: [{{from: /out, to: /}}]
"""


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_escaping_tarball_is_refused(project: Project, http_dir: tuple[Path, str], kind: str) -> None:
    root, base = http_dir
    data = evil_tar(kind)
    (root / "evil.tar.gz").write_bytes(data)
    add_package(project, "evil", source_package("evil", f"{base}/evil.tar.gz", hashlib.sha256(data).hexdigest()))
    result = project.kiln("build", "evil")
    assert result.code != 0
    assert "evil" in result.err
    assert any(word in result.err for word in ("escape", "outside", "absolute", ".."))
    assert not list((project.cache / "store").glob("*/meta.json")) or all(
        json.loads(p.read_text()).get("name") != "evil" for p in (project.cache / "store").glob("*/meta.json")
    )


def test_checksum_mismatch_names_url_and_hashes(project: Project, http_dir: tuple[Path, str]) -> None:
    root, base = http_dir
    data = evil_tar("none")
    (root / "good.tar.gz").write_bytes(data)
    wrong = "ab" * 32
    add_package(project, "mismatch", source_package("mismatch", f"{base}/good.tar.gz", wrong))
    result = project.kiln("build", "mismatch")
    assert result.code != 0
    assert f"{base}/good.tar.gz" in result.err
    assert wrong in result.err
    assert hashlib.sha256(data).hexdigest() in result.err
    assert not (project.cache / "sources" / wrong).exists()


def test_failed_step_reports_package_step_snippet_and_log(project: Project) -> None:
    add_package(
        project,
        "broken",
        """
name: broken
variant: stage0
steps:
  - build:
      - echo compiling things
      - echo about to fail >&2; exit 7
finalize: [{from: /out, to: /}]
""",
    )
    result = project.kiln("build", "broken", "greet-lib", "--keep-going", "--json")
    assert result.code == 1
    assert "package 'broken' failed in step 1 (build), exit code 7:" in result.err
    assert "echo about to fail >&2; exit 7" in result.err
    assert "about to fail" in result.err
    assert "--- last" in result.err and ".log ---" in result.err
    assert statuses(result.out) == {"broken": "failed", "greet-lib": "built"}
    log = project.kiln("log", "broken")
    assert "compiling things" in log.out


def test_concurrent_builds_share_one_store(project: Project) -> None:
    first = project.popen("build", "greet-test", "--json")
    second = project.popen("build", "greet-test", "--json")
    out1, err1 = first.communicate(timeout=900)
    out2, err2 = second.communicate(timeout=900)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    built = [name for out in (out1, out2) for name, status in statuses(out).items() if status == "built"]
    assert sorted(built) == sorted(FIXTURE_PACKAGES)
    assert "0 damaged" in project.kiln("cache", "verify", check=True).out


def test_sigkill_leaves_no_partial_entry(project: Project) -> None:
    add_package(
        project,
        "slow",
        """
name: slow
variant: stage0
steps:
  - build:
      - mkdir -p /out && echo started > /out/first
      - sleep 4
      - echo done > /out/second
finalize: [{from: /out, to: /}]
""",
    )
    process = project.popen("build", "slow")
    deadline = time.monotonic() + 120
    log = None
    while time.monotonic() < deadline:
        logs = list((project.cache / "logs" / "slow").glob("*.log")) if (project.cache / "logs/slow").exists() else []
        if logs and "sleep 4" in logs[0].read_text():
            log = logs[0]
            break
        time.sleep(0.1)
    assert log is not None, "the slow step never started"
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(0.5)
    names = [json.loads(p.read_text()).get("name") for p in (project.cache / "store").glob("*/meta.json")]
    assert "slow" not in names
    assert list((project.cache / "tmp").iterdir()), "the killed build's staging dir should be left for gc"
    rerun = project.kiln("build", "slow", "--json", check=True)
    assert statuses(rerun.out) == {"slow": "built"}
    project.kiln("cache", "gc", check=True)
    assert not [p for p in (project.cache / "tmp").iterdir() if not p.name.endswith(".lock")]
    assert "0 damaged" in project.kiln("cache", "verify", check=True).out


def test_shell_sees_dependencies_and_sources(project: Project) -> None:
    result = project.kiln("shell", "greet-app", "--", "sh", "-c", "ls /deps/lib /tmp/build/src; cat /etc/greet.conf")
    assert result.code == 0, result.err
    assert "libgreet.a" in result.out
    assert "main.c" in result.out
    assert "Howdy" in result.out
