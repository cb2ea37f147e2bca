"""Hostile specs against real sandbox builds: the runners' own defences, behind the loader's.

The loader refuses these specs, so each test loads a harmless package and swaps in the
hostile finalize or dependency list (dataclasses.replace, past Package.from_spec) to prove
the second line: no shell runs spec text, no symlink of a build root is followed with the
host's view, no spec text reaches mount options, no spec path is joined onto a host path
unchecked. Canary files and directories on the host show that nothing outside changed.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest

from kiln.build.progress import PlainProgress
from kiln.build.scheduler import BUILT, FAILED, Outcome
from kiln.build.session import Session
from kiln.core.errors import KilnError
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.model import Dependency, Finalize
from kiln.pkg.variables import Platform
from tests.integration import services
from tests.integration.conftest import Project

pytestmark = pytest.mark.integration

DEP = """
name: dep-a
variant: stage0
steps:
  - build:
      - mkdir -p /out && echo dep > /out/dep-file
finalize: [{from: /out, to: /}]
"""


def add(project: Project, name: str, text: str) -> None:
    (project.pkgs / name).mkdir()
    (project.pkgs / name / "pkg.yaml").write_text(text)


@pytest.fixture(params=["sandbox", "docker"])
def runner(request: pytest.FixtureRequest) -> str:
    """Finalize is one rule on every runner: the docker runner's copy-out path is checked too."""
    if request.param == "docker" and not services.engine_answers():
        services.unavailable("a Docker engine", "start `dockerd &` as root (scripts/ci-services.sh does)")
    return str(request.param)


def build(
    project: Project, monkeypatch: pytest.MonkeyPatch, name: str, runner: str = "sandbox", **swap: object
) -> tuple[Outcome, Session]:
    """Build `name` in this process with some of its fields swapped for hostile ones."""
    monkeypatch.setenv("KILN_CACHE", str(project.cache))
    tree = load_tree(project.pkgs, Platform.parse("linux/amd64"))
    tree.packages[name] = dataclasses.replace(tree.packages[name], **swap)  # type: ignore[arg-type]
    session = Session.open(Graph(tree), runner=runner, make_jobs=2)
    outcomes = session.build([name], jobs=1, no_cache=False, keep_going=False, progress=PlainProgress(io.StringIO()))
    return outcomes[name], session


def output(session: Session, name: str) -> Path:
    return session.store.tree(session.keys[name])


def failed_cleanly(outcome: Outcome, text: str) -> None:
    assert outcome.status == FAILED
    assert isinstance(outcome.error, KilnError), outcome.error
    assert text in str(outcome.error), str(outcome.error)


def host_state(top: Path) -> dict[str, bytes | str]:
    """Every path below `top` with its content (or link target): what must not change."""
    found: dict[str, bytes | str] = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        found[rel] = str(path.readlink()) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return found


def test_finalize_paths_never_reach_a_shell(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runner: str
) -> None:
    add(
        project,
        "fin",
        "name: fin\nvariant: stage0\nsteps:\n  - build: [mkdir -p /out]\nfinalize: [{from: /out, to: /}]\n",
    )
    canaries = [tmp_path / "canary1", tmp_path / "canary2", tmp_path / "canary3"]
    hostile = (
        Finalize(f"/$(touch {canaries[0]})", "/"),
        Finalize(f'/out";touch {canaries[1]};"', "/"),
        Finalize("/out", f"/`touch {canaries[2]}`"),
    )
    for entry in hostile:
        outcome, _ = build(project, monkeypatch, "fin", runner, finalize=(entry,))
        if entry.to == "/":
            failed_cleanly(outcome, f"finalize: {entry.source} does not exist in the build root")
        else:  # an odd but harmless name inside the output
            assert outcome.status == BUILT, outcome.error
    assert not any(c.exists() for c in canaries)


def test_symlinks_in_the_root_are_copied_as_links_never_followed(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runner: str
) -> None:
    secret_dir = tmp_path / "host-secret"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("HOST-SECRET\n")
    add(
        project,
        "reader",
        f"""
name: reader
variant: stage0
steps:
  - build:
      - mkdir -p /out {secret_dir}
      - ln -s {secret_dir} /out/dirlink
      - ln -s {secret_dir}/secret /out/filelink
      - ln -s {secret_dir} /evil
      - echo inside > {secret_dir}/secret
finalize: [{{from: /out, to: /}}]
""",
    )
    finalize = (
        Finalize("/out", "/"),
        Finalize("/evil/secret", "/s"),
        Finalize("/evil", "/evil"),
        Finalize("/out/filelink", "/f"),
    )
    outcome, session = build(project, monkeypatch, "reader", runner, finalize=finalize)
    assert outcome.status == BUILT, outcome.error
    tree = output(session, "reader")
    assert (tree / "dirlink").readlink() == secret_dir
    assert (tree / "filelink").readlink() == secret_dir / "secret"
    assert (tree / "evil").readlink() == secret_dir
    assert (tree / "f").readlink() == secret_dir / "secret"
    assert (tree / "s").read_text() == "inside\n"  # /evil resolved inside the root, as chroot would
    for path in tree.rglob("*"):
        assert path.is_symlink() or not path.is_file() or b"HOST-SECRET" not in path.read_bytes()


def test_finalize_cannot_write_through_a_link_an_earlier_entry_copied(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runner: str
) -> None:
    victim = tmp_path / "host-victim"
    victim.mkdir()
    (victim / "file").write_text("original\n")
    before = host_state(victim)
    add(
        project,
        "writer",
        f"""
name: writer
variant: stage0
steps:
  - build:
      - mkdir -p /out /payload/sub
      - ln -s {victim} /out/etc
      - ln -s {victim}/file /out/flink
      - echo pwned > /payload/sub/new && echo pwned > /payload/file
finalize: [{{from: /out, to: /}}]
""",
    )
    finalize = (
        Finalize("/out", "/"),
        Finalize("/payload", "/etc"),
        Finalize("/payload/file", "/flink"),
        Finalize("/payload/file", "/etc/file"),
    )
    outcome, session = build(project, monkeypatch, "writer", runner, finalize=finalize)
    assert host_state(victim) == before
    assert outcome.status == BUILT, outcome.error
    tree = output(session, "writer")
    inside = tree / str(victim).lstrip("/")  # out/etc -> victim, resolved inside the output
    assert (inside / "sub/new").read_text() == "pwned\n"
    assert (inside / "file").read_text() == "pwned\n"
    assert not (tree / "flink").is_symlink() and (tree / "flink").read_text() == "pwned\n"


def test_dependency_to_never_reaches_mount_options(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "marker").write_text("HOST\n")
    before = host_state(host_dir)
    add(project, "dep-a", DEP)
    add(project, "dep-b", DEP.replace("dep-a", "dep-b"))
    colon, pipe = f"/x:{host_dir}", f"/p|{host_dir}"
    add(
        project,
        "mounter",
        f"""
name: mounter
variant: stage0
dependencies: [{{stage: dep-a, to: /a}}, {{stage: dep-b, to: /b}}]
steps:
  - build:
      - if cat '{colon}/marker' '{pipe}/marker'; then exit 1; fi
      - test -f '{colon}/dep-file' && test -f '{pipe}/dep-file'
      - mkdir -p /out && touch '{colon}/written' '{pipe}/written' && echo ok > /out/result
finalize: [{{from: /out, to: /}}]
""",
    )
    deps = (Dependency("dep-a", "/", colon), Dependency("dep-b", "/", pipe))
    outcome, session = build(project, monkeypatch, "mounter", dependencies=deps)
    assert outcome.status == BUILT, outcome.error
    assert (output(session, "mounter") / "result").read_text() == "ok\n"
    assert host_state(host_dir) == before


@pytest.mark.parametrize("source", ["/x\n/../../../../", "/../../../..", "/ok/\x7f"])
def test_dependency_from_is_joined_inside_its_tree(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str
) -> None:
    add(project, "dep-a", DEP)
    add(
        project,
        "joiner",
        """
name: joiner
variant: stage0
dependencies: [{stage: dep-a, to: /hostroot}]
steps:
  - build:
      - mkdir -p /out && ls /hostroot > /out/leak
finalize: [{from: /out, to: /}]
""",
    )
    outcome, session = build(project, monkeypatch, "joiner", dependencies=(Dependency("dep-a", source, "/hostroot"),))
    failed_cleanly(outcome, "dependency 'dep-a' 'from'")
    assert not session.store.has(session.keys["joiner"])


def test_dependency_from_through_a_link_stays_in_the_tree(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A dependency's output may hold a link to a host path: `from` through it resolves inside the output."""
    add(
        project,
        "dep-link",
        f"""
name: dep-link
variant: stage0
steps:
  - build:
      - mkdir -p /out/{tmp_path}/inside && echo stored > /out/{tmp_path}/inside/f && ln -s {tmp_path} /out/up
finalize: [{{from: /out, to: /}}]
""",
    )
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "f").write_text("HOST\n")
    add(
        project,
        "linker",
        """
name: linker
variant: stage0
dependencies: [{stage: dep-link, from: /up/inside, to: /dep}]
steps:
  - build:
      - mkdir -p /out && cp /dep/f /out/f
finalize: [{from: /out, to: /}]
""",
    )
    outcome, session = build(project, monkeypatch, "linker")
    assert outcome.status == BUILT, outcome.error
    assert (output(session, "linker") / "f").read_text() == "stored\n"
