"""The project: its root found by walking up, and kiln-project.yaml's settings as the flags' defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.cli import apply_project, build_parser
from kiln.core.errors import InputError, InputErrors
from kiln.core.project import find_root, load_project
from tests.conftest import Result, write_tree


def test_the_root_is_the_nearest_directory_up_with_the_project_file_else_with_pkgs(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    assert find_root(deep) == deep  # nothing up there: where the user stands
    (tmp_path / "a" / "pkgs").mkdir()
    assert find_root(deep) == tmp_path / "a"
    (tmp_path / "kiln-project.yaml").write_text("jobs: 3\n")
    assert find_root(deep) == tmp_path  # the project file marks the root, even above a pkgs/


def test_settings_are_read_and_every_bad_one_is_reported_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "kiln-project.yaml").write_text(
        "version: 1.0.0\njobs: 4\nrunner: docker\ncache_from: oci://r/c\nprofiles: [metal, iso]\nmirrors: [debian]\n"
    )
    project = load_project(tmp_path)
    assert (project.version, project.jobs, project.runner, project.cache_from, project.profiles) == (
        "1.0.0",
        4,
        "docker",
        "oci://r/c",
        ("metal", "iso"),
    )
    (tmp_path / "kiln-project.yaml").write_text("jobz: 4\nrunner: podman\njobs: 0\nprofiles: metal\n")
    with pytest.raises(InputErrors) as info:
        load_project(tmp_path)
    assert [(e.location.line if e.location else 0, str(e).split(": ", 1)[1]) for e in info.value.errors] == [
        (1, "unknown setting 'jobz' (did you mean 'jobs'?)"),
        (2, "runner must be one of sandbox, docker, buildkit, not 'podman'"),
        (3, "jobs must be at least 1, not 0"),
        (4, "profiles must be a list of profile names, not 'metal'"),
    ]
    (tmp_path / "kiln-project.yaml").write_text("- jobs\n")
    with pytest.raises(InputError, match="must be a mapping"):
        load_project(tmp_path)


def test_flags_win_over_the_project_file_which_wins_over_the_builtin_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    args = build_parser().parse_args(["build", "x"])
    apply_project(args)
    assert (args.jobs, args.runner, args.cache_from, args.pkgs) == (2, "sandbox", None, [str(tmp_path / "sub/pkgs")])
    (tmp_path / "kiln-project.yaml").write_text("jobs: 5\nrunner: docker\ncache_to: oci://r/c\n")
    args = build_parser().parse_args(["build", "x"])
    apply_project(args)
    assert (args.jobs, args.runner, args.cache_to, args.pkgs) == (5, "docker", "oci://r/c", [str(tmp_path / "pkgs")])
    args = build_parser().parse_args(["build", "x", "-j", "1", "--runner", "sandbox", "--pkgs", "other"])
    apply_project(args)
    assert (args.jobs, args.runner, args.pkgs) == (1, "sandbox", ["other"])
    args = build_parser().parse_args(["image", "metal"])
    apply_project(args)
    assert (args.jobs, args.profiles_dir) == (5, str(tmp_path / "profiles"))


def test_kiln_finds_the_tree_from_a_subdirectory(
    kiln: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path, {"a/pkg.yaml": "name: a\nvariant: scratch\n"})
    (tmp_path / "pkgs" / "a" / "deeper").mkdir()
    monkeypatch.chdir(tmp_path / "pkgs" / "a" / "deeper")
    result = kiln("validate", "--json")
    assert result.code == 0 and '"packages": 1' in result.out


def test_kiln_image_without_profiles_builds_the_project_files_profiles(
    kiln: Callable[..., Result], tmp_path: Path
) -> None:
    write_tree(tmp_path, {"a/pkg.yaml": "name: a\nvariant: scratch\n"})
    (tmp_path / "kiln-project.yaml").write_text("profiles: [no-such-profile]\n")
    result = kiln("image")
    assert result.code == 2 and "no-such-profile" in result.err
