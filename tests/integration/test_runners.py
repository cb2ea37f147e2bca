"""The docker and buildkit runners and the registry cache, against real engines and a real registry."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration import services
from tests.integration.conftest import Project, seed_into

pytestmark = pytest.mark.integration

FIXTURE_PACKAGES = {"greet-lib", "greet-conf-src", "greet-conf", "greet-app", "greet-test"}


@pytest.fixture(scope="session")
def engine() -> None:
    """The engine at DOCKER_HOST (or the local socket) must answer."""
    if not services.engine_answers():
        services.unavailable("a Docker engine", "start `dockerd &` as root (scripts/ci-services.sh does)")


@pytest.fixture(scope="session")
def buildkit(engine: None) -> None:
    from kiln.build.runners.buildkit import find_client
    from kiln.core.errors import BuildError

    try:
        find_client()
    except BuildError as exc:
        services.unavailable("a BuildKit-capable docker client", str(exc))


@pytest.fixture
def second_engine(engine: None) -> Iterator[str]:
    yield from services.second_dockerd()


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


def other_store(project: Project, seed_store: Path, name: str) -> Project:
    """The same project with a second, fresh store (a second builder)."""
    cache = project.root.parent / name
    seed_into(seed_store, cache, project.pkgs)
    return Project(project.root, cache)


def statuses(out: str) -> dict[str, str]:
    return {name: info["status"] for name, info in json.loads(out)["packages"].items()}


def manifests(project: Project) -> dict[str, bytes]:
    """Store key -> manifest.json bytes, for every entry but the seed."""
    found = {}
    for meta in (project.cache / "store").glob("*/meta.json"):
        if json.loads(meta.read_text())["name"] != "stage0":
            found[meta.parent.name] = (meta.parent / "manifest.json").read_bytes()
    return found


def runner_of(project: Project) -> set[str]:
    return {
        json.loads(m.read_text())["meta"].get("runner")
        for m in (project.cache / "store").glob("*/meta.json")
        if json.loads(m.read_text())["name"] != "stage0"
    }


# A toolchain package and one of variant toolchain; a dependency's sub-tree at a nested `to`; step env
# with a space; a step cache (bound by the sandbox, an empty directory on docker, a cache mount on
# BuildKit); a symlink, an odd mode and file finalize paths.
TOOLCHAIN = """
name: toolchain
variant: stage0
steps:
  - build:
      - mkdir -p /out/toolchain/bin /out/toolchain/share
      - printf '#!/bin/sh\\necho "tool $*"\\n' > /out/toolchain/bin/kiln-tool
      - chmod 755 /out/toolchain/bin/kiln-tool
      - echo data > /out/toolchain/share/data
finalize: [{from: /out, to: /}]
"""
USES_TOOLCHAIN = """
name: uses-tc
variant: toolchain
dependencies:
  - stage: greet-lib
    from: /include
    to: /usr/include/greet
steps:
  - env: {GREETING: hi there}
    cache: [/var/cache/uses-tc]
    scratch: [/tmp/build/unpacked]
    prepare:
      - echo "$GREETING" > /tmp/build/unpacked/word
    build:
      - test -d /var/cache/uses-tc && touch /var/cache/uses-tc/seen
      - mkdir res && kiln-tool "$(cat /tmp/build/unpacked/word)" > res/result
      - test -f /usr/include/greet/greet.h
      - ln -s result res/link && chmod 640 res/result
finalize:
  - {from: /tmp/build/res, to: /res}
  - {from: /toolchain/share/data, to: /share/data}
"""
EVERY = FIXTURE_PACKAGES | {"toolchain", "uses-tc"}


def test_same_output_on_every_runner(project: Project, seed_store: Path, buildkit: None) -> None:
    for name, text in (("toolchain", TOOLCHAIN), ("uses-tc", USES_TOOLCHAIN)):
        (project.pkgs / name).mkdir()
        (project.pkgs / name / "pkg.yaml").write_text(text)
    targets = ["greet-test", "uses-tc"]
    sandbox = project.kiln("build", *targets, "--json", check=True)
    assert statuses(sandbox.out) == {n: "built" for n in EVERY}
    docker_store = other_store(project, seed_store, "docker-cache")
    docker = docker_store.kiln("build", *targets, "--runner", "docker", "--json", check=True)
    assert statuses(docker.out) == {n: "built" for n in EVERY}
    bk_store = other_store(project, seed_store, "buildkit-cache")
    # --no-cache: BuildKit solves every stage now, not from an earlier test's cache.
    bk = bk_store.kiln("build", *targets, "--runner", "buildkit", "--no-cache", "--json", check=True)
    assert statuses(bk.out) == {n: "built" for n in EVERY}
    tree = project.cache / "store" / json.loads(sandbox.out)["packages"]["uses-tc"]["key"] / "tree"
    assert (tree / "res/result").read_text() == "tool hi there\n"
    assert (tree / "res/link").is_symlink()

    assert runner_of(project) == {"sandbox"}
    assert runner_of(docker_store) == {"docker"}
    assert runner_of(bk_store) == {"buildkit"}
    expected = manifests(project)
    assert len(expected) == len(EVERY)
    assert manifests(docker_store) == expected
    assert manifests(bk_store) == expected
    for store in (docker_store, bk_store):
        assert "0 damaged" in store.kiln("cache", "verify", check=True).out
    # Per-package logs exist on BuildKit too, split out of its progress output.
    assert "RUN" in bk_store.kiln("log", "greet-lib", check=True).out


def test_docker_runner_on_a_remote_engine(project: Project, second_engine: str) -> None:
    import docker

    env = {"DOCKER_HOST": second_engine}
    result = run_with_env(project, env, "build", "greet-test", "--runner", "docker", "--json", "--out", "out")
    assert result.returncode == 0, result.stderr
    assert statuses(result.stdout) == {n: "built" for n in FIXTURE_PACKAGES}
    assert (project.root / "out/greet-test/result.txt").read_text() == "Howdy, kiln!\n"
    remote = docker.DockerClient(base_url=second_engine)
    tags = {tag for image in remote.images.list() for tag in image.tags}
    assert any(tag.startswith("kiln/stage0:") for tag in tags), tags
    assert not remote.containers.list(all=True), "build containers must be removed"


def test_shell_on_the_docker_runner(project: Project, engine: None) -> None:
    result = project.kiln(
        "shell",
        "--runner",
        "docker",
        "greet-app",
        "--",
        "sh",
        "-c",
        "ls /deps/lib /tmp/build/src; cat /etc/greet.conf; id -u",
    )
    assert result.code == 0, result.err
    assert "libgreet.a" in result.out and "main.c" in result.out and "Howdy" in result.out
    assert result.out.split()[-1] == "0"


def run_with_env(project: Project, extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from tests.integration.conftest import KILN

    return subprocess.run(
        [*KILN, *args], cwd=project.root, env={**project.env(), **extra}, capture_output=True, text=True, timeout=900
    )


NETWORK_PROBE = """
name: probe-net
variant: stage0
steps:
  - build:
      - test "$(ls /sys/class/net)" = lo
      - mkdir -p /out && echo isolated > /out/none
  - network: default
    build:
      - test "$(ls /sys/class/net | wc -l)" -gt 1
      - echo connected > /out/default
finalize: [{from: /out, to: /}]
"""


def test_docker_steps_get_a_network_only_when_declared(project: Project, engine: None) -> None:
    (project.pkgs / "probe-net").mkdir()
    (project.pkgs / "probe-net/pkg.yaml").write_text(NETWORK_PROBE)
    result = project.kiln("build", "probe-net", "--runner", "docker", "--out", "out")
    assert result.code == 0, result.err
    assert sorted(p.name for p in (project.root / "out/probe-net").iterdir()) == ["default", "none"]


def test_buildkit_isolates_steps_or_refuses_to_build(project: Project, buildkit: None) -> None:
    isolated = NETWORK_PROBE.split("  - network: default")[0] + "finalize: [{from: /out, to: /}]\n"
    (project.pkgs / "probe-net").mkdir()
    (project.pkgs / "probe-net/pkg.yaml").write_text(isolated)
    result = project.kiln("build", "probe-net", "--runner", "buildkit", "--no-cache")
    assert result.code == 0, result.err
    again = project.kiln("build", "probe-net", "--runner", "buildkit", "--no-cache", "--json")  # replaces the entry
    assert statuses(again.out) == {"probe-net": "built"}, again.err
    (project.pkgs / "probe-net/pkg.yaml").write_text(NETWORK_PROBE)
    mixed = project.kiln("build", "probe-net", "--runner", "buildkit")
    features = json.loads((project.cache / "buildkit/features.json").read_text())
    if True in features.values():  # a frontend with RUN --network: each step gets what it declares
        assert mixed.code == 0, mixed.err
    else:
        assert mixed.code == 1
        assert "probe-net declare network: default" in mixed.err


def test_failed_buildkit_step_names_the_package(project: Project, buildkit: None) -> None:
    (project.pkgs / "broken").mkdir()
    (project.pkgs / "broken/pkg.yaml").write_text("""
name: broken
variant: stage0
steps:
  - build:
      - echo about to fail >&2; exit 7
finalize: [{from: /out, to: /}]
""")
    result = project.kiln("build", "broken", "--runner", "buildkit", "--json")
    assert result.code == 1
    assert statuses(result.out) == {"broken": "failed"}
    assert "package 'broken' failed on buildkit" in result.err
    assert "about to fail" in project.kiln("log", "broken").out


def test_exported_dockerfile_builds_with_docker_build_and_checks_sources(
    project: Project, buildkit: None, tmp_path: Path
) -> None:
    from kiln.build.runners.buildkit import find_client

    context = tmp_path / "ctx"
    project.kiln("bootstrap", check=True)
    # The seed as stage0.tar in the context (`kiln build --runner buildkit` covers the seed as an image).
    exported = project.kiln(
        "export", "dockerfile", "greet-app", "--out", str(context), "--no-network-flags", "--stage0", "tar", check=True
    )
    assert "wrote" in exported.out
    dockerfile = (context / "Dockerfile").read_text()
    assert "FROM scratch AS kiln-stage0\nADD stage0.tar /" in dockerfile
    assert "FROM kiln-stage0 AS build-greet-lib" in dockerfile
    assert "sha256sum -c" in dockerfile
    client = find_client()
    out = tmp_path / "out"
    build = subprocess.run(
        [
            *client.argv,
            "--network",
            "none",
            "--target",
            "kiln-outputs",
            "--output",
            f"type=local,dest={out}",
            str(context),
        ],
        env=client.environ(),
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (out / "greet-app/usr/bin/greet").stat().st_mode & 0o111
    sandbox = project.kiln("build", "greet-app", "--out", "sandbox-out", check=True)
    assert sandbox.code == 0
    binary = (project.root / "sandbox-out/greet-app/usr/bin/greet").read_bytes()
    assert (out / "greet-app/usr/bin/greet").read_bytes() == binary
    # A source altered after export fails its sha256 check inside the build.
    main_c = context / "sources/greet-app/tree/src/main.c"
    main_c.write_text(main_c.read_text() + "\n/* changed */\n")
    tampered = subprocess.run(
        [
            *client.argv,
            "--network",
            "none",
            "--target",
            "kiln-outputs",
            "--output",
            f"type=local,dest={tmp_path / 'out2'}",
            str(context),
        ],
        env=client.environ(),
        capture_output=True,
        text=True,
    )
    assert tampered.returncode != 0
    assert "FAILED" in tampered.stdout + tampered.stderr


def test_registry_cache_feeds_a_second_builder(project: Project, seed_store: Path, registry: tuple[str, Path]) -> None:
    host, _ = registry
    ref = f"oci://{host}/kiln/cache"
    first = project.kiln("build", "greet-test", "--cache-to", ref, "--json", check=True)
    assert statuses(first.out) == {n: "built" for n in FIXTURE_PACKAGES}
    assert "pushed 5 of 5" in first.err

    second = other_store(project, seed_store, "second-builder")
    again = second.kiln("build", "greet-test", "--cache-from", ref, "--json", "--out", "out2", check=True)
    assert statuses(again.out) == {n: "cached" for n in FIXTURE_PACKAGES}
    assert not (second.cache / "logs" / "greet-lib").exists(), "nothing may be rebuilt"
    assert manifests(second) == manifests(project)
    assert (project.root / "out2/greet-test/result.txt").read_text() == "Howdy, kiln!\n"
    assert "0 damaged" in second.kiln("cache", "verify", check=True).out

    # `kiln cache pull` fetches a target's closure, and nothing else.
    third = other_store(project, seed_store, "third-builder")
    pulled = third.kiln("cache", "pull", ref, "greet-app", check=True)
    assert "pulled 4 entries" in pulled.out
    listed = {e["name"] for e in json.loads(third.kiln("cache", "ls", "--json", check=True).out)}
    assert listed == {"stage0", "greet-app", "greet-lib", "greet-conf", "greet-conf-src"}
    assert "pushed 0 of 1" in third.kiln("cache", "push", ref, "greet-app", check=True).out


def test_registry_blob_that_does_not_match_its_digest_is_refused(
    project: Project, seed_store: Path, registry: tuple[str, Path]
) -> None:
    host, storage = registry
    ref = f"oci://{host}/kiln/cache"
    project.kiln("build", "greet-conf-src", check=True)
    project.kiln("cache", "push", ref, "greet-conf-src", check=True)
    key = json.loads(project.kiln("cache", "ls", "--json", check=True).out)
    key = next(e["key"] for e in key if e["name"] == "greet-conf-src")
    manifest = requests.get(
        f"http://{host}/v2/kiln/cache/manifests/{key}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=10,
    ).json()
    digest = manifest["layers"][1]["digest"].split(":")[1]  # the tree's tar.zst
    tree_blob = storage / "docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
    data = bytearray(tree_blob.read_bytes())
    data[-5] ^= 0xFF
    tree_blob.write_bytes(bytes(data))
    second = other_store(project, seed_store, "second-builder")
    result = second.kiln("cache", "pull", ref, "greet-conf-src")
    assert result.code == 1
    assert "does not match its digest" in result.err
    names = [json.loads(m.read_text())["name"] for m in (second.cache / "store").glob("*/meta.json")]
    assert names == ["stage0"]
    assert not [p for p in (second.cache / "tmp").iterdir() if not p.name.endswith(".lock")]
