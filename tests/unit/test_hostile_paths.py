"""Properties over arbitrary input: the loaders only ever raise KilnError, and accepted paths are safe.

Bytes, not printable text: hostile trees hold NULs, invalid UTF-8, escapes and
YAML that parses into odd types. Each example runs in well under a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kiln.core import schema
from kiln.core.errors import InputError, KilnError
from kiln.pkg import codecache
from kiln.pkg.loader import load_tree
from kiln.pkg.paths import contained, path_problem
from kiln.pkg.template import render
from kiln.pkg.variables import Platform, builtins

pytestmark = pytest.mark.timeout(120)

PLATFORM = Platform.parse("linux/amd64")


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Templates that render are cached: keep this module's entries and key out of the user's."""
    base = tmp_path_factory.mktemp("cache")
    saved = {name: os.environ.get(name) for name in ("KILN_CACHE", "KILN_STATE_DIR")}
    os.environ["KILN_CACHE"], os.environ["KILN_STATE_DIR"] = str(base / "cache"), str(base / "state")
    codecache._key.cache_clear()
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    codecache._key.cache_clear()


OK = "name: base\nvariant: stage0\nfinalize:\n  - from: /\n    to: /\n"
FAST = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

# Bytes that look like YAML and Jinja often enough to reach past the first parser error.
FRAGMENTS = st.sampled_from(
    [
        b"name: a\n",
        b"variant: stage0\n",
        b"steps:\n",
        b"  - build: [make]\n",
        b"env: {A: 1}\n",
        b"&a ",
        b"*a ",
        b"[",
        b"]",
        b"{",
        b"}",
        b"{{ arch }}",
        b"{% for i in range(3) %}",
        b"{% endfor %}",
        b"{{",
        b"}}",
        b"{%",
        b"%}",
        b"- ",
        b": ",
        b"\n",
        b"  ",
        b"'",
        b'"',
        b"!!binary ",
        b"!!int ",
        b"2024-13-45",
        b"\xff",
        b"\x00",
        b"\xc3",
        b"\t",
        b"? ",
        b"---\n",
        b"...\n",
        b"\xef\xbb\xbf",
        b"\r\n",
        b"0x",
        b"1e999",
        b"~",
    ]
)
HOSTILE_BYTES = st.one_of(
    st.binary(max_size=400), st.lists(FRAGMENTS | st.binary(max_size=8), max_size=40).map(b"".join)
)


def load_with(files: dict[str, bytes]) -> None:
    """Write files under a fresh pkgs/ and load it; only KilnError may come out, quickly."""
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = Path(tmp) / "pkgs"
        for rel, content in files.items():
            (pkgs / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkgs / rel).write_bytes(content)
        start = time.monotonic()
        try:
            load_tree(pkgs, PLATFORM)
        except KilnError as exc:
            assert str(exc)
        assert time.monotonic() - start < 2


@FAST
@given(HOSTILE_BYTES)
def test_any_pkg_yaml_bytes_give_a_kiln_error(content: bytes) -> None:
    load_with({"base/pkg.yaml": OK.encode(), "a/pkg.yaml": content})


@FAST
@given(HOSTILE_BYTES)
def test_any_vars_yaml_bytes_give_a_kiln_error(content: bytes) -> None:
    load_with(
        {
            "vars.yaml": content,
            "base/pkg.yaml": OK.encode(),
            "a/vars.yaml": content,
            "a/pkg.yaml": b"name: a\nvariant: stage0\nversion: '{{ arch }}'\n",
        }
    )


@FAST
@given(HOSTILE_BYTES)
def test_any_stage0_yaml_bytes_give_a_kiln_error(content: bytes) -> None:
    load_with({"stage0.yaml": content, "base/pkg.yaml": OK.encode()})


@FAST
@given(st.text(max_size=200))
def test_any_template_text_gives_a_kiln_error(source: str) -> None:
    with contextlib.suppress(KilnError):
        render("{{ " + source + " }}", Path("t.yaml"), builtins(PLATFORM))


# --- path checks ------------------------------------------------------------------------------------

PATHISH = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["", ".", "..", "a", "b c", "/", ":", ",", "\n", "\x00", "\x1b", "é", "~"]), max_size=8
    ).map("/".join),
)


@settings(max_examples=400, deadline=None)
@given(PATHISH, st.booleans(), st.booleans())
def test_accepted_paths_are_clean(value: str, absolute: bool, mount: bool) -> None:
    if path_problem(value, absolute=absolute, mount=mount) is not None:
        return
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    assert ".." not in value.split("/")
    assert value.startswith("/") == absolute
    if mount:
        assert ":" not in value and "," not in value


@settings(max_examples=400, deadline=None)
@given(PATHISH)
def test_contained_join_stays_inside_root(value: str) -> None:
    root = Path("/srv/kiln/root")
    try:
        joined = contained(root, value)
    except InputError:
        return
    assert joined == root or root in joined.parents
    assert os.path.normpath(joined) == str(joined)


@settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(PATHISH)
def test_loader_accepts_only_clean_dependency_paths(value: str) -> None:
    """Schema and model together: a `to:` the loader accepts passes the path check too."""
    assume(value)
    spec = f"name: a\nvariant: stage0\ndependencies:\n  - stage: base\n    to: {json.dumps(value)}\n"
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = Path(tmp) / "pkgs"
        (pkgs / "a").mkdir(parents=True)
        (pkgs / "base").mkdir()
        (pkgs / "a/pkg.yaml").write_text(spec)
        (pkgs / "base/pkg.yaml").write_text(OK)
        try:
            tree = load_tree(pkgs, PLATFORM)
        except KilnError:
            return
    to = tree.packages["a"].dependencies[0].to
    assert path_problem(to, absolute=True, mount=True) is None


# --- schema patterns: whole strings only --------------------------------------------------------------

SCHEMAS = [
    ("pkg.schema.json", "kiln.pkg"),
    ("stage0.schema.json", "kiln.pkg"),
    ("profile.schema.json", "kiln.image"),
]
SAMPLES = [
    "a",
    "a1",
    "p.1",
    "/a",
    "/a/b",
    "a/b",
    "x=1.0",
    "a" * 64,
    "0" * 64,
    "1GiB",
    "2 MiB",
    "http://x.org/a",
    "https://x/a",
    "ftp://x/a",
    "file:///a",
    ">=0.1,<0.2",
    "bookworm",
    "A_1",
    "metal",
    "disk.raw",
]


def schema_patterns(node: object) -> list[str]:
    """Every `pattern` in a schema document, however deep."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found += [value] if key == "pattern" and isinstance(value, str) else schema_patterns(value)
    elif isinstance(node, list):
        for item in node:
            found += schema_patterns(item)
    return found


@pytest.mark.parametrize(("name", "package"), SCHEMAS)
def test_no_schema_pattern_accepts_a_trailing_newline(name: str, package: str) -> None:
    """Python's `$` matches before a final newline; jsonschema and fastjsonschema both use re.search."""
    patterns = schema_patterns(schema.load_schema(name, package))
    assert patterns
    for pattern in patterns:
        for sample in SAMPLES:
            if re.search(pattern, sample):
                assert not re.search(pattern, sample + "\n"), (pattern, sample)
                assert not re.search(pattern, sample + "\n/../x"), (pattern, sample)


@pytest.mark.parametrize(
    ("document", "name", "package"),
    [
        ({"name": "a\n"}, "pkg.schema.json", "kiln.pkg"),
        ({"name": "a", "dependencies": [{"stage": "b", "from": "/x\n/../../../../"}]}, "pkg.schema.json", "kiln.pkg"),
        ({"name": "a", "steps": [{"env": {"A\n": "x"}}]}, "pkg.schema.json", "kiln.pkg"),
        ({"suite": "bookworm\n"}, "stage0.schema.json", "kiln.pkg"),
        ({"mirror": "http://x\n"}, "stage0.schema.json", "kiln.pkg"),
    ],
)
def test_both_validators_refuse_a_trailing_newline(document: dict[str, object], name: str, package: str) -> None:
    assert schema.validate(document, name, package)
    assert list(schema._validator(name, package).iter_errors(document))
