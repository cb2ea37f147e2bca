"""`kiln verify --rebuild`'s parts that build nothing: the provenance read as hostile input, what refuses a
rebuild (a dirty tree, a redacted secret, a name that is not plain), the comparison and its reports, the
command line's errors (exit 2). tests/integration/test_rebuild_release.py does the whole round trip."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kiln.core.errors import InputError, KilnError
from kiln.core.hashing import json_sha256
from kiln.core.secrets import REDACTED
from kiln.signing.rebuild import checkout, compare, recorded
from kiln.signing.rebuild.compare import Difference, Sides
from kiln.signing.rebuild.recorded import Recorded, parse, refusals
from kiln.signing.release import MAX_PROVENANCE, PROVENANCE, SUMS
from tests.conftest import Result

COMMIT = "a2c07153aff0e3e826dd11d8d3384164a9129db7"
PROFILE_SHA = "3f3138b60ac3c57ac96bd5f2fde8f98a439d392539dc2b7268b173df6cc4722d"
ARTIFACT = "initramfs-amd64.zst"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def statement(**external: Any) -> dict[str, Any]:
    """A statement shaped as kiln.image.provenance writes one, for a profile `metal`."""
    given = {
        "profile": {"name": "metal", "platform": "metal", "output": {"kind": "initramfs"}},
        "platforms": ["linux/amd64"],
        "variables": {"kiln_version": "1.4.0"},
        "extensions": [],
        **external,
    }
    dependencies: list[dict[str, Any]] = [
        {"name": "project", "digest": {"gitCommit": COMMIT}, "annotations": {"dirty": False}},
        {"name": "package-tree:pkgs", "digest": {"sha256": "1" * 64}, "annotations": {"kind": "package-tree"}},
        {"name": "kernel", "digest": {"kilnStoreKey": "2" * 64}, "annotations": {"kind": "package"}},
        {"name": "profile", "digest": {"sha256": PROFILE_SHA}},
    ]
    if "schematic" in given:
        dependencies.append({"name": "schematic", "digest": {"sha256": given["schematic"]["id"]}})
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": ARTIFACT, "digest": {"sha256": sha(b"artifact")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://kiln.invalid/buildtypes/image/v1",
                "externalParameters": given,
                "internalParameters": {"sourceDateEpoch": 1704067200},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": "https://kiln.invalid/builders/sandbox", "version": {"kiln": "1.4.0"}},
                "metadata": {"startedOn": "2026-01-01T00:00:00Z", "finishedOn": "2026-01-01T00:01:00Z"},
            },
        },
    }


def read(document: dict[str, Any], directory: Path = Path("/release/metal")) -> Recorded:
    return parse(directory, json.dumps(document).encode())


def problems(document: dict[str, Any]) -> str:
    with pytest.raises(KilnError) as caught:
        read(document)
    return str(caught.value)


def given(document: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = document["predicate"]["buildDefinition"]["externalParameters"]
    return result


def test_a_statement_kiln_image_writes_reads_as_the_build_to_replay() -> None:
    found = read(statement(extensions=["iscsi-tools"], variables={"kiln_version": "1.4.0", "jobs": "4"}))
    assert (found.name, found.commit, found.dirty, found.profile_sha256) == ("metal", COMMIT, False, PROFILE_SHA)
    assert found.platforms == ("linux/amd64",) and found.runner == "sandbox" and found.kiln_version == "1.4.0"
    assert found.variables == (("jobs", "4"), ("kiln_version", "1.4.0"))
    assert found.given_extensions == ("iscsi-tools",)
    assert found.subjects == {ARTIFACT: sha(b"artifact")}
    assert found.dependencies["kernel"] == {"kilnStoreKey": "2" * 64}
    assert refusals(found, allow_dirty=False, schematic_given=False) == []


def test_the_reader_keeps_the_rules_it_copies_in_step_with_their_owners() -> None:
    from kiln.image import provenance
    from kiln.image.schematic import Schematic

    schema = json.loads((Path(provenance.__file__).parent / "profile.schema.json").read_text())
    pattern = schema["properties"]["name"]["pattern"]
    assert pattern.startswith("^" + recorded.PROFILE_NAME.pattern.split("{")[0])
    assert recorded.BUILD_TYPE == provenance.BUILD_TYPE
    assert f"{provenance.KILN_URI}/builders/" == recorded.BUILDERS
    fields = {"kernel_args": ["quiet"], "machine_config": {"hostname": "a"}}
    assert recorded.Schematic(Schematic(fields).id, fields).replayable


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "", "Metal", "-rf", "a\nb", "x" * 200, 7])
def test_a_profile_name_that_is_not_plain_is_refused(name: object) -> None:
    document = statement()
    given(document)["profile"]["name"] = name
    assert "not a plain profile name" in problems(document)


@pytest.mark.parametrize("name", ["metal", "s-iso.v2", "aws_1", "0"])
def test_plain_profile_names_are_taken(name: str) -> None:
    document = statement()
    given(document)["profile"]["name"] = name
    assert read(document).name == name


def test_without_a_name_the_directory_names_the_profile_and_must_be_plain() -> None:
    document = statement()
    del given(document)["profile"]["name"]
    assert read(document, Path("/r/aws")).name == "aws"
    with pytest.raises(KilnError, match="not a plain profile name"):
        read(document, Path("/r/My Release"))


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("resolvedDependencies", 0, "digest", "gitCommit"), "HEAD; rm -rf /", "not a git object name"),
        (("resolvedDependencies", 0, "digest", "gitCommit"), "--upload-pack=x", "not a git object name"),
        (("resolvedDependencies", 0, "annotations", "dirty"), "no", "annotations.dirty"),
        (("externalParameters", "platforms"), ["linux/../amd64"], "platforms"),
        (("externalParameters", "platforms"), ["linux/amd64", "linux/amd64"], "platforms"),
        (("externalParameters", "variables"), {"a b": "x"}, "not identifier = text"),
        (("externalParameters", "variables"), {"jobs": "1\x1b[2J"}, "not identifier = text"),
        (("externalParameters", "variables"), {"jobs": 4}, "not identifier = text"),
        (("externalParameters", "extensions"), ["ok", "bad\x00"], "printable strings"),
        (("externalParameters", "profile"), "metal", "profile: missing, or not an object"),
        (("resolvedDependencies",), {"profile": 1}, "resolvedDependencies"),
        (("buildType",), "https://example.com/other", "buildType"),
    ],
)
def test_hostile_fields_are_refused_by_name(path: tuple[Any, ...], value: Any, expected: str) -> None:
    document = statement()
    place: Any = document["predicate"]["buildDefinition"]
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    assert expected in problems(document)


def test_an_unknown_runner_and_a_bad_subject_are_refused_together() -> None:
    document = statement()
    document["predicate"]["runDetails"]["builder"]["id"] = "https://kiln.invalid/builders/$(reboot)"
    document["subject"] = [{"name": "../../etc/passwd", "digest": {"sha256": "0" * 64}}]
    found = problems(document)
    assert "names no runner Kiln has" in found and "'..' component" in found


@pytest.mark.parametrize("data", [b"not json", b"[" * 200_000, b"\xff\xfe", b"[]", b"{}"])
def test_malformed_statements_are_input_errors_not_tracebacks(data: bytes) -> None:
    with pytest.raises(KilnError) as caught:
        parse(Path("/r/metal"), data)
    assert caught.value.exit_code == 2


def test_a_dirty_tree_is_refused_in_one_line_unless_allowed() -> None:
    document = statement()
    document["predicate"]["buildDefinition"]["resolvedDependencies"][0]["annotations"]["dirty"] = True
    found = read(document)
    reasons = refusals(found, allow_dirty=False, schematic_given=False)
    assert len(reasons) == 1 and "\n" not in reasons[0]
    assert f"dirty tree at {COMMIT[:12]}" in reasons[0] and "--allow-dirty" in reasons[0]
    assert refusals(found, allow_dirty=True, schematic_given=False) == []


def test_a_release_made_outside_git_has_no_commit_to_check_out() -> None:
    document = statement()
    del document["predicate"]["buildDefinition"]["resolvedDependencies"][0]
    found = read(document)
    assert found.commit is None
    assert "records no commit" in refusals(found, allow_dirty=True, schematic_given=False)[0]


def test_a_schematic_whose_secret_was_redacted_cannot_be_replayed_without_the_original() -> None:
    fields = {"machine_config": {"services": [{"name": "agent", "env": {"API_KEY": "s3cret"}}]}}
    shown: dict[str, Any] = copy.deepcopy(fields)
    shown["machine_config"]["services"][0]["env"]["API_KEY"] = REDACTED
    found = read(statement(schematic={"id": json_sha256(fields), "fields": shown}))
    assert found.schematic is not None and not found.schematic.replayable
    reasons = refusals(found, allow_dirty=False, schematic_given=False)
    assert "machine_config.services.0.env.API_KEY" in reasons[0] and "--schematic FILE" in reasons[0]
    assert refusals(found, allow_dirty=False, schematic_given=True) == []
    plain = read(
        statement(schematic={"id": json_sha256({"kernel_args": ["quiet"]}), "fields": {"kernel_args": ["quiet"]}})
    )
    assert refusals(plain, allow_dirty=False, schematic_given=False) == []


def test_a_redacted_variable_cannot_be_replayed() -> None:
    found = read(statement(variables={"kiln_version": "1.4.0", "registry_token": REDACTED}))
    assert "--set registry_token cannot be replayed" in refusals(found, allow_dirty=False, schematic_given=False)[0]


@pytest.mark.parametrize(
    ("own", "extensions", "expected"),
    [
        ([], [], ()),
        (["a"], ["a", "b"], ("b",)),
        (["a", "a"], ["a", "a", "b"], ("b",)),  # no schematic: the profile's list as written
        (["a", "a"], ["a", "b", "c"], ("b", "c")),  # a schematic's: without repeats
    ],
)
def test_the_extensions_given_on_the_command_line_are_what_follows_the_profiles_own(
    own: list[str], extensions: list[str], expected: tuple[str, ...]
) -> None:
    document = statement(extensions=extensions)
    given(document)["profile"]["input"] = {"extensions": own}
    assert read(document).given_extensions == expected


def test_extensions_that_do_not_start_with_the_profiles_own_are_refused() -> None:
    document = statement(extensions=["b"])
    given(document)["profile"]["input"] = {"extensions": ["a"]}
    assert "input.extensions" in problems(document)


def write_release(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / PROVENANCE).write_text(json.dumps(statement()))
    return root


def test_output_directories_are_the_release_or_those_in_it_that_hold_a_provenance(tmp_path: Path) -> None:
    release = write_release(tmp_path / "release", ["metal", "iso"])
    (release / "empty").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / PROVENANCE).write_text("{}")
    (release / "linked").symlink_to(tmp_path / "elsewhere")
    assert recorded.output_directories(release) == [release / "iso", release / "metal"]
    assert recorded.output_directories(release / "metal") == [release / "metal"]
    with pytest.raises(InputError, match="nothing records how it was made"):
        recorded.output_directories(release / "empty")


def test_a_provenance_that_is_a_link_or_too_large_is_not_read(tmp_path: Path) -> None:
    directory = tmp_path / "metal"
    directory.mkdir()
    (tmp_path / "target.json").write_text(json.dumps(statement()))
    (directory / PROVENANCE).symlink_to(tmp_path / "target.json")
    with pytest.raises(InputError, match="symbolic link is not followed"):
        recorded.read_statement(directory, None)
    (directory / PROVENANCE).unlink()
    with (directory / PROVENANCE).open("wb") as handle:
        handle.truncate(MAX_PROVENANCE + 1)
    with pytest.raises(InputError, match="larger than"):
        recorded.read_statement(directory, None)


def sides(**changes: Any) -> Sides:
    digest = sha(b"artifact")
    base: dict[str, Any] = {
        "listed": {ARTIFACT: digest, "manifest.json": "m" * 64},
        "on_disk": {ARTIFACT: digest, "manifest.json": "m" * 64},
        "rebuilt": {ARTIFACT: digest, "manifest.json": "m" * 64},
        "subjects": {ARTIFACT: digest, "manifest.json": "m" * 64},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return Sides(**base)


def test_all_equal_is_the_same() -> None:
    assert compare.differences(sides()) == ([ARTIFACT, "manifest.json"], [])


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"rebuilt": {ARTIFACT: "0" * 64}}, "the rebuild's sha256 0000000000000000 is not the"),
        ({"on_disk": {ARTIFACT: "0" * 64}}, "the file changed after the release was made"),
        ({"on_disk": {ARTIFACT: None}}, "missing from the release directory"),
        ({"rebuilt": {"extra.efi": "0" * 64}}, "made by the rebuild, not listed in the release"),
        ({"subjects": {ARTIFACT: "0" * 64}}, "its provenance's subjects disagree"),
    ],
)
def test_each_disagreement_names_the_artifact_and_what_disagrees(changes: dict[str, Any], expected: str) -> None:
    same, found = compare.differences(sides(**changes))
    assert len(found) == 1 and expected in "; ".join(found[0].what)
    assert found[0].artifact in (ARTIFACT, "extra.efi") and "manifest.json" in same


def test_a_file_the_rebuild_did_not_make_is_named() -> None:
    rebuilt = {ARTIFACT: sha(b"artifact")}
    _, found = compare.differences(Sides({ARTIFACT: "a" * 64, "b": "b" * 64}, {ARTIFACT: "a" * 64, "b": "b" * 64},
                                         rebuilt, {ARTIFACT: "a" * 64, "b": "b" * 64}))  # fmt: skip
    assert {d.artifact for d in found} == {ARTIFACT, "b"}
    assert "listed in the release, not made by the rebuild" in next(d for d in found if d.artifact == "b").what


def test_report_names_are_one_component_and_distinct() -> None:
    names = ["boot/vmlinuz", "boot%2Fvmlinuz", "boot_vmlinuz", "metal.raw.zst"]
    reports = [compare.report_name(n) for n in names]
    assert len(set(reports)) == len(reports) and not any("/" in r for r in reports)
    assert reports[0] == "boot%2Fvmlinuz.diffoscope.txt" and reports[1] == "boot%252Fvmlinuz.diffoscope.txt"


def test_a_report_is_written_for_each_differing_file_and_none_through_a_link(tmp_path: Path) -> None:
    release, rebuilt, reports = tmp_path / "release", tmp_path / "rebuilt", tmp_path / "reports"
    for top, byte in ((release, b"a"), (rebuilt, b"b")):
        (top / "boot").mkdir(parents=True)
        (top / "boot" / "vmlinuz").write_bytes(b"kernel " + byte + b" tail")
    (tmp_path / "secret").write_bytes(b"not the release's")
    (release / "linked.img").symlink_to(tmp_path / "secret")
    (rebuilt / "linked.img").write_bytes(b"rebuilt")
    found = [Difference("boot/vmlinuz", ["differs"]), Difference("linked.img", ["differs"])]
    compare.write_reports(release, rebuilt, found, reports, tmp_path / "scratch")
    assert found[0].first_offset == len(b"kernel ")
    if shutil.which("diffoscope"):
        assert found[0].report == str(reports / "boot%2Fvmlinuz.diffoscope.txt")
        assert "vmlinuz" in Path(found[0].report).read_text()
    assert found[1].report is None and found[1].first_offset is None
    assert not list((tmp_path / "scratch").rglob("*.img")), "the copy of the release's file was left behind"


def test_listed_digests_come_from_the_directory_then_the_release_then_the_subjects(tmp_path: Path) -> None:
    release = tmp_path / "release"
    (release / "metal").mkdir(parents=True)
    subjects = {ARTIFACT: "s" * 64}
    assert compare.listed_digests(release / "metal", release, subjects) == subjects
    (release / SUMS).write_text(f"{'a' * 64}  metal/{ARTIFACT}\n{'b' * 64}  iso/iso.iso\n")
    assert compare.listed_digests(release / "metal", release, subjects) == {ARTIFACT: "a" * 64}
    (release / "metal" / SUMS).write_text(f"{'c' * 64}  {ARTIFACT}\n")
    assert compare.listed_digests(release / "metal", release, subjects) == {ARTIFACT: "c" * 64}


def test_kiln_image_gets_each_recorded_value_as_one_argument() -> None:
    document = statement(variables={"kiln_version": "1.4.0", "motd": "a b; $(reboot)"}, extensions=["x"])
    found = read(document)
    argv = checkout.image_argv(found, Path("/c/profiles/metal.yaml"), Path("/w/out"), runner="sandbox",
                               schematic=None, no_cache=False)  # fmt: skip
    assert argv == [
        "image",
        "/c/profiles/metal.yaml",
        "--platform=linux/amd64",
        "--out=/w/out",
        "--set=kiln_version=1.4.0",
        "--set=motd=a b; $(reboot)",
        "--extension=x",
    ]
    more = checkout.image_argv(found, Path("/p"), Path("/o"), runner="docker", schematic=Path("/s.json"), no_cache=True)
    assert more[-3:] == ["--schematic=/s.json", "--runner=docker", "--cache-from="]


def git_repo(root: Path, files: dict[str, bytes]) -> str:
    """A repository at root with `files` committed; its commit."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fixture"]):
        subprocess.run(["git", "-C", str(root), *argv], check=True, env=env)
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_the_profile_is_the_commits_file_with_the_recorded_sha256(tmp_path: Path) -> None:
    profile = b'{"name": "metal"}\n'
    commit = git_repo(tmp_path / "repo", {"profiles/metal.yaml": b"edited later\n", "ci/metal-release.yaml": profile})
    repo = checkout.repository(tmp_path / "repo")
    checkout.require_commit(repo, commit)
    document = statement()
    document["predicate"]["buildDefinition"]["resolvedDependencies"][3]["digest"]["sha256"] = sha(profile)
    assert checkout.find_profile(tmp_path / "repo", repo, read(document)) == tmp_path / "repo/ci/metal-release.yaml"
    with pytest.raises(InputError, match="a profile from outside the repository cannot be rebuilt"):
        checkout.find_profile(tmp_path / "repo", repo, read(statement()))
    with pytest.raises(InputError, match="is not in the repository"):
        checkout.require_commit(repo, "0" * 40)


def test_the_checkouts_own_kiln_runs_when_it_holds_one(tmp_path: Path) -> None:
    (tmp_path / "src/kiln").mkdir(parents=True)
    assert checkout.kiln_of(tmp_path).whose == "the running"
    (tmp_path / "src/kiln/cli.py").write_text("")
    mine = checkout.kiln_of(tmp_path)
    assert mine.whose == "the checkout's" and mine.pythonpath == str(tmp_path / "src")
    (tmp_path / "src/kiln/cli.py").unlink()
    (tmp_path / "src/kiln/cli.py").symlink_to("/etc/hostname")
    assert checkout.kiln_of(tmp_path).whose == "the running"


Kiln = Callable[..., Result]


def test_rebuild_options_without_rebuild_are_a_usage_error(kiln: Kiln, tmp_path: Path) -> None:
    result = kiln("verify", str(tmp_path), "--store", str(tmp_path / "s"), "--keep", "--key", "k.pub")
    assert result.code == 2 and "--store, --keep: only with --rebuild" in result.err


def test_rebuild_of_what_is_not_a_release_is_a_usage_error(kiln: Kiln, tmp_path: Path) -> None:
    result = kiln("verify", "--rebuild", str(tmp_path / "missing"))
    assert result.code == 2 and "not a directory" in result.err and "Traceback" not in result.err
    (tmp_path / "empty").mkdir()
    result = kiln("verify", "--rebuild", str(tmp_path / "empty"), "--json")
    assert result.code == 2 and json.loads(result.out)["ok"] is False


def test_an_unknown_runner_is_a_usage_error(kiln: Kiln, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        kiln("verify", "--rebuild", str(tmp_path), "--runner", "podman")
    assert exited.value.code == 2


def test_a_dirty_provenance_is_refused_with_exit_2_before_anything_runs(kiln: Kiln, tmp_path: Path) -> None:
    document = statement()
    document["predicate"]["buildDefinition"]["resolvedDependencies"][0]["annotations"]["dirty"] = True
    (tmp_path / "release/metal").mkdir(parents=True)
    (tmp_path / "release/metal" / PROVENANCE).write_text(json.dumps(document))
    before = set(Path(tempfile.gettempdir()).glob("kiln-rebuild-*"))
    result = kiln("verify", "--rebuild", str(tmp_path / "release"))
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert "made from a dirty tree" in result.err and "--allow-dirty" in result.err
    assert set(Path(tempfile.gettempdir()).glob("kiln-rebuild-*")) == before, "a work directory was made"


def test_a_commit_the_repository_lacks_is_refused_with_exit_2(
    kiln: Kiln, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git_repo(tmp_path / "project", {"pkgs/vars.yaml": b"{}\n"})
    (tmp_path / "release/metal").mkdir(parents=True)
    (tmp_path / "release/metal" / PROVENANCE).write_text(json.dumps(statement()))
    monkeypatch.chdir(tmp_path / "project")
    result = kiln("verify", "--rebuild", str(tmp_path / "release"))
    assert result.code == 2 and f"commit {COMMIT} is not in the repository" in result.err


def test_the_default_store_is_refused_as_the_rebuilds_store(
    kiln: Kiln, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    result = kiln("verify", "--rebuild", str(tmp_path), "--store", str(tmp_path / "cache"))
    assert result.code == 2 and "a rebuild needs one of its own" in result.err


def test_kiln_image_takes_the_runner_a_rebuild_names_and_defaults_to_the_sandbox() -> None:
    from kiln.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["image", "metal"]).runner == "sandbox"
    assert parser.parse_args(["image", "metal", "--runner=docker"]).runner == "docker"


def test_an_interrupted_rebuild_stops_its_kiln_even_one_that_ignores_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kiln.signing.rebuild import run

    monkeypatch.setattr(run, "OWN_STOP_SECONDS", 0.1)
    monkeypatch.setattr(run, "STOP_SECONDS", 0.2)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline()  # its handler is set
    began = time.monotonic()
    run._stop(process)
    assert process.returncode == -9 and time.monotonic() - began < 5
