"""The release's one version: where it comes from, and git describe turned into a semantic version.

The git tests run the real git in a repository of their own (tests/conftest.py pins $KILN_VERSION
for every other test; these remove it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln import __version__
from kiln.core.errors import InputError
from kiln.core.release_version import VERSION_ENV, from_describe, git_version, release_version
from kiln.core.semver import SemVer
from tests.conftest import Result, write_tree


@pytest.mark.parametrize(
    ("describe", "dirty", "version"),
    [
        ("v1.4.0-0-gabc123456789", False, "1.4.0"),
        ("1.4.0-0-gabc123456789", True, "1.4.0-dirty"),
        ("v1.4.0-3-gabc123456789", False, "1.4.1-dev.3.gabc123456789"),
        ("v1.4.0-3-gabc123456789", True, "1.4.1-dev.3.gabc123456789.dirty"),
        ("v1.5.0-rc.1-2-gabc123456789", False, "1.5.0-rc.1.dev.2.gabc123456789"),
        ("v1.5.0-rc.1-0-gabc123456789", True, "1.5.0-rc.1.dirty"),
        ("release-7-3-gabc123456789", False, None),
    ],
)
def test_a_describe_becomes_a_semantic_version(describe: str, dirty: bool, version: str | None) -> None:
    assert from_describe(describe, dirty=dirty) == version


def test_a_version_after_a_tag_sorts_after_it_and_before_the_next_release() -> None:
    tag, later, later_still, dirty, next_release = (
        SemVer.parse(v) for v in ("1.4.0", "1.4.1-dev.3.gabc", "1.4.1-dev.12.gabc", "1.4.1-dev.12.gabc.dirty", "1.4.1")
    )
    assert tag < later < later_still < next_release
    assert later_still <= dirty < next_release


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "file").write_text("one\n")
    git(repo, "add", "file")
    git(repo, "commit", "-q", "-m", "one")
    return repo


def test_the_default_is_the_git_describe_of_the_project(repo: Path) -> None:
    untagged = git_version(repo)
    assert untagged is not None and untagged.startswith("0.0.0-dev.1.g") and not untagged.endswith("dirty")
    git(repo, "tag", "v2.3.0")
    assert release_version(repo) == "2.3.0"
    (repo / "file").write_text("two\n")
    assert release_version(repo) == "2.3.0-dirty"
    git(repo, "commit", "-q", "-am", "two")
    assert release_version(repo).startswith("2.3.1-dev.1.g")


def test_outside_git_the_version_is_kilns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    assert release_version(tmp_path) == __version__


def test_the_flag_then_set_then_the_environment_then_the_project_file(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git(repo, "tag", "v2.3.0")
    assert release_version(repo, project_version="3.0.0") == "3.0.0"
    monkeypatch.setenv(VERSION_ENV, "4.0.0")
    assert release_version(repo, project_version="3.0.0") == "4.0.0"
    assert release_version(repo, overrides={"kiln_version": "5.0.0"}) == "5.0.0"
    assert release_version(repo, "6.0.0", {"kiln_version": "6.0.0"}) == "6.0.0"
    with pytest.raises(InputError, match="disagree: a release has one version"):
        release_version(repo, "6.0.0", {"kiln_version": "5.0.0"})
    with pytest.raises(InputError, match="'v6' is not a semantic version"):
        release_version(repo, "v6")


def test_the_release_version_reaches_the_tree_from_the_flag_or_the_project_file(
    kiln: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every template sees one kiln_version; the project file's version: is checked at its line."""
    monkeypatch.delenv(VERSION_ENV, raising=False)
    write_tree(tmp_path, {"a/pkg.yaml": "name: a\nversion: '{{ kiln_version }}'\nvariant: scratch\n"})
    (tmp_path / "kiln-project.yaml").write_text("version: 1.2.0\n")
    result = kiln("eval", "a", "{{ kiln_version }}")
    assert (result.code, result.out.strip()) == (0, "1.2.0")
    result = kiln("--release-version", "1.3.0", "eval", "a", "{{ kiln_version }}")
    assert (result.code, result.out.strip()) == (0, "1.3.0")
    (tmp_path / "kiln-project.yaml").write_text("jobs: 2\nversion: one\n")
    result = kiln("eval", "a", "{{ kiln_version }}")
    assert result.code == 2
    assert "kiln-project.yaml:2: version: 'one' is not a semantic version" in result.err
