"""The shipped JSON Schema: valid itself, matches every pkg.yaml in pkgs/, documented, fuzzed loader."""

from __future__ import annotations

import re
import string
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core import schema
from kiln.core.errors import KilnError
from kiln.pkg.loader import find_package_files, load_package, load_tree
from kiln.pkg.variables import Platform, builtins

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / "pkgs"


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema.load_schema())


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_every_shipped_pkg_yaml_validates_against_the_schema(platform: str) -> None:
    tree = load_tree(PKGS, Platform.parse(platform))
    validator = jsonschema.Draft202012Validator(schema.load_schema())
    assert tree.packages, "pkgs/ has no packages"
    for package in tree.packages.values():
        validator.validate(package.spec)


def test_docs_describe_every_schema_key() -> None:
    doc = (ROOT / "docs/pkg-yaml.md").read_text()
    data = schema.load_schema()
    keys = set(data["properties"])
    for definition in data["$defs"].values():
        keys |= set(definition.get("properties", {}))
    missing = {k for k in keys if not re.search(rf"`{re.escape(k)}`", doc)}
    assert not missing, f"docs/pkg-yaml.md does not mention {sorted(missing)}"


YAMLISH = st.text(alphabet=string.printable, max_size=300)


@settings(max_examples=300, deadline=None)
@given(YAMLISH)
def test_loader_never_crashes_on_arbitrary_text(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    file = tmp_path_factory.mktemp("fuzz") / "pkg.yaml"
    file.write_text(text)
    try:
        load_package(file, builtins(Platform.parse("linux/amd64")))
    except KilnError as exc:
        assert str(exc)


FIELDS = st.dictionaries(
    st.sampled_from(["name", "variant", "dependencies", "steps", "finalize", "version", "bogus"]),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    ),
)


@settings(max_examples=300, deadline=None)
@given(FIELDS)
def test_schema_errors_always_have_a_message(spec: dict[str, object]) -> None:
    for path, message in schema.validate(spec):
        assert isinstance(path, tuple)
        assert message


def test_package_files_are_found_in_order(tmp_path: Path) -> None:
    for rel in ["b/pkg.yaml", "a/pkg.yaml", "a/nested/pkg.yaml", ".hidden/pkg.yaml"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("name: x\n")
    found = [p.relative_to(tmp_path).as_posix() for p in find_package_files(tmp_path)]
    assert found == ["a/nested/pkg.yaml", "a/pkg.yaml", "b/pkg.yaml"]
