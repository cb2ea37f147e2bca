"""Hostile package trees: `kiln validate` answers `file:line: message` and exit 2, in bounded time.

Kiln runs as root and loads trees other people write, so each case here is an
attack or a mistake that used to run code, hang, eat memory or print a traceback.
Every case also checks that nothing was written outside the error: no canary file,
no template cache.
"""

from __future__ import annotations

import hashlib
import hmac
import marshal
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jinja2
import jinja2.bccache
import pytest
import yaml

from kiln.build.sources.mirrors import load_mirrors
from kiln.core import yamlfile
from kiln.core.errors import InputError, KilnError
from kiln.core.yamlfile import read_yaml_file
from kiln.image.profile import load_profile
from kiln.pkg import codecache, template
from tests.conftest import Result, write_tree

pytestmark = pytest.mark.timeout(30)

OK = "name: base\nvariant: stage0\nfinalize:\n  - from: /\n    to: /\n"
FIN = "finalize: [{from: /, to: /}]\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private KILN_CACHE and template signing key, so the test sees everything written."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE", str(directory))
    monkeypatch.setenv("KILN_STATE_DIR", str(tmp_path / "state"))
    codecache._key.cache_clear()
    template._COMPILED.clear()
    yield directory
    codecache._key.cache_clear()
    template._COMPILED.clear()


def validate(kiln: Callable[..., Result], *args: str) -> tuple[Result, float]:
    """Run `kiln validate` in-process; returns its result and the CPU seconds it used.

    CPU time, not wall time, is what the refusals bound (no quadratic parse, no huge read): other
    work on the machine cannot make it fail. A hang uses no CPU, so the wall time is bounded too,
    generously.
    """
    wall, cpu = time.monotonic(), time.process_time()
    result = kiln("validate", *args)
    assert time.monotonic() - wall < 60, "kiln validate hung"
    return result, time.process_time() - cpu


def assert_refused(result: Result, elapsed: float, *expected: str) -> None:
    """Exit 2, each expected `file:line: message` prefix on its own line, no traceback, quick."""
    assert result.code == 2, result.err
    lines = result.err.splitlines()
    for want in expected:
        assert any(line.startswith(want) for line in lines), (want, result.err)
    assert "Traceback" not in result.err
    assert elapsed < 5, elapsed


def assert_nothing_written(tmp_path: Path, cache: Path) -> None:
    """No canary, no Jinja bytecode cache, and no signed entry for a template that failed."""
    assert not (tmp_path / "canary").exists()
    assert not (cache / "jinja").exists()
    assert not (cache / "templates").exists() or not any((cache / "templates").iterdir())


# --- templates ------------------------------------------------------------------------------------

TEMPLATE_CASES: dict[str, tuple[str, str]] = {
    "cycler globals (RCE on plain Jinja)": (
        "name: a\nvariant: stage0\ndescription: \"{{ cycler.__init__.__globals__.os.system('touch canary') }}\"\n",
        "pkgs/a/pkg.yaml:3: template error: access to attribute '__init__' of 'StrictUndefined' object is unsafe",
    ),
    "dunder walk": (
        "name: a\nvariant: stage0\n\ndescription: \"{{ ''.__class__.__mro__[1].__subclasses__() }}\"\n",
        "pkgs/a/pkg.yaml:4: template error: access to attribute '__class__' of 'str' object is unsafe",
    ),
    "range 10**9": (
        "name: a\nvariant: stage0\n{% for i in range(10**9) %}\n{% endfor %}\n",
        "pkgs/a/pkg.yaml:3: template error: range() of more than 10000 items",
    ),
    "nested loops": (
        "name: a\nvariant: stage0\n{% for i in range(10000) %}{% for j in range(10000) %}\n{% endfor %}{% endfor %}\n",
        "pkgs/a/pkg.yaml:3: template error: loops ran more than 100000 iterations",
    ),
    "recursive macro": (
        "name: a\nvariant: stage0\n{% macro f(n) %}{{ f(n) }}{% endmacro %}\ndescription: '{{ f(1) }}'\n",
        "pkgs/a/pkg.yaml:3: template error: calls nested more than 32 deep (a recursive macro?)",
    ),
    "string doubling": (
        "name: a\nvariant: stage0\n{% macro f(s, n) %}{{ f(s ~ s, n - 1) if n else s|length }}{% endmacro %}\n"
        "description: '{{ f(\"ab\", 60) }}'\n",
        "pkgs/a/pkg.yaml:3: template error: the '~' result would be larger than",
    ),
    "huge power": (
        "name: a\nvariant: stage0\ndescription: '{{ 7 ** 100000000 }}'\n",
        "pkgs/a/pkg.yaml:3: template error: 7 ** 100000000 is larger than 4096 bits",
    ),
    "huge repetition": (
        "name: a\nvariant: stage0\ndescription: '{{ \"x\" * 10**10 }}'\n",
        "pkgs/a/pkg.yaml:3: template error: the repeated value would be larger than",
    ),
    "huge format width": (
        "name: a\nvariant: stage0\ndescription: '{{ \"%0999999999d\" % 1 }}'\n",
        "pkgs/a/pkg.yaml:3: template error: format widths of 10000 or more",
    ),
    "huge center": (
        "name: a\nvariant: stage0\ndescription: '{{ \"x\"|center(10**9) }}'\n",
        "pkgs/a/pkg.yaml:3: template error: filter center: argument 1000000000 is larger than 10000",
    ),
    "division by zero": (
        "name: a\nvariant: stage0\ndescription: '{{ 1 / 0 }}'\n",
        "pkgs/a/pkg.yaml:3: template error: ZeroDivisionError: division by zero",
    ),
    "include": (
        "name: a\nvariant: stage0\n{% include '/etc/passwd' %}\n",
        "pkgs/a/pkg.yaml:3: {% include %} is not supported in Kiln templates",
    ),
    "import": (
        "name: a\n\n{% import 'x.j2' as x %}\nvariant: stage0\n",
        "pkgs/a/pkg.yaml:3: {% import %} is not supported in Kiln templates",
    ),
    "from import": (
        "name: a\nvariant: stage0\n{% if arch %}\n{% from 'x.j2' import y %}\n{% endif %}\n",
        "pkgs/a/pkg.yaml:4: {% from ... import %} is not supported in Kiln templates",
    ),
    "extends": (
        "{% extends '../../etc/passwd' %}\nname: a\n",
        "pkgs/a/pkg.yaml:1: {% extends %} is not supported in Kiln templates",
    ),
    "deeply nested expression": (
        "name: a\nvariant: stage0\ndescription: '{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}'\n",
        "pkgs/a/pkg.yaml:1: template too complex",
    ),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_CASES))
def test_hostile_template_is_refused(case: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    source, expected = TEMPLATE_CASES[case]
    write_tree(tmp_path, {"a/pkg.yaml": source})
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, expected)
    assert_nothing_written(tmp_path, cache)


def test_ordinary_templates_still_render(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    """The guards refuse growth, not big numbers or the usual filters."""
    source = (
        "name: a\nvariant: stage0\n{% set v = {'amd64': 'x86'}[arch] %}\n"
        "version: '{{ source_date_epoch|string }}-{{ missing|default(65536) }}-{{ v|upper }}'\n"
        "description: '{{ ['a', 'b']|join(',') ~ (\"%05d\" % 7) ~ \"{}\".format(1) ~ (\"x\" * 3) }}'\n"
        "steps:\n{% for i in range(3) %}\n  - build: ['make -j{{ jobs }} {{ i }}']\n{% endfor %}\n" + FIN
    )
    write_tree(tmp_path, {"a/pkg.yaml": source})
    result = kiln("eval", "a", "{{ source_date_epoch|string }} {{ 2 ** 64 }} {{ 'ab'|center(6) }}|")
    assert result.code == 0, result.err
    assert result.out.strip() == "1704067200 18446744073709551616   ab  |"
    result = kiln("validate")
    assert result.code == 0, result.err
    assert not (tmp_path / "canary").exists()


def test_planted_bytecode_cache_never_runs(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    """A marshalled code object where jinja's FileSystemBytecodeCache would look for it is ignored."""
    source = "name: a\nvariant: stage0\nversion: '{% if arch %}1{% endif %}'\n" + FIN
    pkgs = write_tree(tmp_path, {"a/pkg.yaml": source})
    file = str((pkgs / "a/pkg.yaml").resolve())
    planted = cache / "jinja"
    planted.mkdir(parents=True)
    bcc = jinja2.FileSystemBytecodeCache(str(planted))
    bucket = jinja2.bccache.Bucket(jinja2.Environment(), bcc.get_cache_key(file), bcc.get_source_checksum(source))
    bucket.code = compile(f"open({str(tmp_path / 'canary')!r}, 'w').write('pwned')", file, "exec")
    bcc.dump_bytecode(bucket)
    assert any(planted.iterdir()) and marshal.version  # the plant is in place
    result = kiln("validate")
    assert result.code == 0, result.err
    assert not (tmp_path / "canary").exists()


# --- YAML -------------------------------------------------------------------------------------------

BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)

YAML_CASES: dict[str, tuple[dict[str, str | bytes], str]] = {
    "recursive alias": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nx: &x [*x]\n"},
        "pkgs/a/pkg.yaml:3: YAML anchors (&x) are not allowed in Kiln files",
    ),
    "alias bomb": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\n" + BILLION_LAUGHS},
        "pkgs/a/pkg.yaml:3: YAML anchors (&a) are not allowed in Kiln files",
    ),
    "alias without anchor": ({"a/pkg.yaml": "name: a\nvariant: stage0\n\nx: *y\n"}, "pkgs/a/pkg.yaml:4: "),
    "deep flow nesting": (
        {"a/pkg.yaml": "name: a\nx: " + "[" * 20000 + "]" * 20000 + "\n"},
        "pkgs/a/pkg.yaml:2: nested more than 64 levels deep",
    ),
    "deep block nesting": (
        {"a/pkg.yaml": "name: a\nx:\n" + "".join(" " * i + "- \n" for i in range(1, 3000))},
        "pkgs/a/pkg.yaml:",
    ),
    "non-UTF-8": (
        {"a/pkg.yaml": b"name: a\nvariant: stage0\ndescription: \xff\xfe\n"},
        "pkgs/a/pkg.yaml:3: pkg.yaml is not valid UTF-8",
    ),
    "huge file": ({"a/pkg.yaml": "name: a\n" + "# padding\n" * 120000}, "pkgs/a/pkg.yaml:1: pkg.yaml is too large"),
    "bad timestamp": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\n\nversion: 2024-13-45\n"},
        "pkgs/a/pkg.yaml:4: bad value '2024-13-45'",
    ),
    "two documents": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\n---\nname: b\n"},
        "pkgs/a/pkg.yaml:3: expected a single YAML document",
    ),
    "vars.yaml alias": (
        {"vars.yaml": "a: &a 1\nb: *a\n", "a/pkg.yaml": OK},
        "pkgs/vars.yaml:1: YAML anchors (&a) are not allowed",
    ),
    "vars.yaml non-UTF-8": (
        {"vars.yaml": b"a: 1\nb: \xc3\x28\n", "a/pkg.yaml": OK},
        "pkgs/vars.yaml:2: vars file is not valid UTF-8",
    ),
    "package vars.yaml deep": (
        {"a/vars.yaml": "x: " + "{a: " * 100 + "}" * 100 + "\n", "a/pkg.yaml": OK},
        "pkgs/a/vars.yaml:1: nested more than 64 levels deep",
    ),
    "stage0.yaml bomb": (
        {"stage0.yaml": BILLION_LAUGHS, "a/pkg.yaml": OK},
        "pkgs/stage0.yaml:1: YAML anchors (&a) are not allowed",
    ),
    "stage0.yaml huge": (
        {"stage0.yaml": "#" * (2 << 20), "a/pkg.yaml": OK},
        "pkgs/stage0.yaml:1: stage0.yaml is too large",
    ),
}


def write_raw(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    pkgs = tmp_path / "pkgs"
    for rel, content in files.items():
        path = pkgs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return pkgs


@pytest.mark.parametrize("case", sorted(YAML_CASES))
def test_hostile_yaml_is_refused(case: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    files, expected = YAML_CASES[case]
    write_raw(tmp_path, files)
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, expected)
    assert_nothing_written(tmp_path, cache)


@pytest.mark.parametrize("loader", [getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader])
@pytest.mark.parametrize(
    "text", ["[" * 20000 + "]" * 20000, "{a: " * 20000 + "}" * 20000, "".join(" " * i + "- \n" for i in range(5000))]
)
def test_deep_nesting_is_an_error_with_both_loaders(text: str, loader: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C parser and the pure-Python one both stop at the cap, well before their quadratic cost."""
    monkeypatch.setattr(yamlfile, "_Loader", loader)
    start = time.process_time()  # CPU seconds: what a quadratic parse would burn, whatever else runs
    with pytest.raises(yamlfile.YamlProblem, match="nested more than 64 levels deep"):
        yamlfile.parse(text)
    assert time.process_time() - start < 3


def test_dangling_symlink_pkg_yaml(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    pkgs = write_tree(tmp_path, {"base/pkg.yaml": OK})
    (pkgs / "a").mkdir()
    (pkgs / "a/pkg.yaml").symlink_to(pkgs / "nowhere")
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, "pkgs/a/pkg.yaml:1: cannot read pkg.yaml: No such file or directory")
    assert_nothing_written(tmp_path, cache)


@pytest.mark.parametrize("name", ["a/pkg.yaml", "vars.yaml", "base/vars.yaml", "stage0.yaml"])
def test_fifo_is_refused_without_hanging(name: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    """Nobody ever writes to this FIFO: opening it blocking would hang kiln forever."""
    pkgs = write_tree(tmp_path, {"base/pkg.yaml": OK})
    (pkgs / name).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(pkgs / name)
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, f"pkgs/{name}:1: ")
    assert "is not a regular file" in result.err
    assert_nothing_written(tmp_path, cache)


def test_device_as_pkg_yaml_is_refused(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    pkgs = write_tree(tmp_path, {"base/pkg.yaml": OK})
    (pkgs / "a").mkdir()
    (pkgs / "a/pkg.yaml").symlink_to(pkgs / "zero")
    os.mknod(pkgs / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers, inside the tree
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, "pkgs/a/pkg.yaml:1: pkg.yaml is not a regular file")


@pytest.mark.parametrize("name", ["a/pkg.yaml", "vars.yaml", "base/vars.yaml", "stage0.yaml"])
@pytest.mark.parametrize("target", ["/etc/passwd", "/dev/zero", "outside.yaml"])
def test_links_out_of_the_tree_are_refused(
    name: str, target: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]
) -> None:
    """A tree's pkg.yaml linked to a root-only file would have its lines quoted back in errors."""
    (tmp_path / "outside.yaml").write_text("name: secret-content\n")
    pkgs = write_tree(tmp_path, {"base/pkg.yaml": OK})
    (pkgs / name).parent.mkdir(parents=True, exist_ok=True)
    (pkgs / name).symlink_to(target if target.startswith("/") else tmp_path / target)
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, f"pkgs/{name}:1: ")
    assert "links to a file outside the package tree" in result.err
    assert "root:" not in result.err and "secret" not in result.err


# --- values YAML 1.1 would change, names and paths ---------------------------------------------------

VALUE_CASES: dict[str, tuple[str, str]] = {
    "env float": (
        "    env:\n      GO_VERSION: 1.20\n",
        "pkgs/a/pkg.yaml:6: GO_VERSION must be a string, not a number (quote it)",
    ),
    "env octal": (
        "    env:\n      UMASK: 0755\n",
        "pkgs/a/pkg.yaml:6: UMASK must be a string, not a number (quote it)",
    ),
    "env yes": (
        "    env:\n      STATIC: yes\n",
        "pkgs/a/pkg.yaml:6: STATIC must be a string, not a boolean (quote it)",
    ),
    "env name with newline": ('    env:\n      "A\\n": x\n', "pkgs/a/pkg.yaml:5: env name 'A\\n' is not a valid shell"),
    "env name with dash": ("    env:\n      A-B: x\n", "pkgs/a/pkg.yaml:5: env name 'A-B' is not a valid shell"),
}


@pytest.mark.parametrize("case", sorted(VALUE_CASES))
def test_env_values_and_names(case: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    step, expected = VALUE_CASES[case]
    write_tree(tmp_path, {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - build: [make]\n" + step + FIN})
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, expected)


PATH_CASES: dict[str, tuple[str, str]] = {
    "name with trailing newline": ('name: "a\\n"\nvariant: stage0\n', "pkgs/a/pkg.yaml:1: bad package name 'a\\n'"),
    "from with newline and dotdot": (
        'name: a\nvariant: stage0\ndependencies:\n  - stage: base\n    from: "/x\\n/../../../../"\n',
        "pkgs/a/pkg.yaml:5: from must be an absolute path without '..', ':', ','",
    ),
    "to with a colon": (
        'name: a\nvariant: stage0\ndependencies:\n  - stage: base\n    to: "/a:/etc"\n',
        "pkgs/a/pkg.yaml:5: to must be an absolute path without '..', ':', ','",
    ),
    "to with a comma": (
        'name: a\nvariant: stage0\ndependencies:\n  - stage: base\n    to: "/a,upperdir=/"\n',
        "pkgs/a/pkg.yaml:5: to must be an absolute path without '..', ':', ','",
    ),
    "stage with trailing newline": (
        'name: a\nvariant: stage0\ndependencies:\n  - stage: "base\\n"\n',
        "pkgs/a/pkg.yaml:4: bad dependency name 'base\\n'",
    ),
    "sha256 with trailing newline": (
        "name: a\nvariant: stage0\nsteps:\n  - sources:\n      - url: https://x.org/a.tgz\n"
        '        destination: a.tgz\n        sha256: "' + "a" * 64 + '\\n"\n' + FIN,
        "pkgs/a/pkg.yaml:7: malformed sha256",
    ),
    "destination with a NUL": (
        'name: a\nvariant: stage0\nsteps:\n  - sources:\n      - path: src\n        destination: "a\\0b"\n' + FIN,
        "pkgs/a/pkg.yaml:6: destination must be a path relative to /tmp/build without '..' or control",
    ),
    "finalize with an escape": (
        'name: a\nvariant: stage0\nfinalize:\n  - from: "/out\\e[2J"\n    to: /\n',
        "pkgs/a/pkg.yaml:4: from must be an absolute path without '..' or control",
    ),
    "url with trailing newline": (
        'name: a\nvariant: stage0\nsteps:\n  - sources:\n      - url: "https://x.org/a.tgz\\n"\n'
        "        destination: a.tgz\n        sha256: " + "a" * 64 + "\n" + FIN,
        "pkgs/a/pkg.yaml:5: url must be an http(s) or ftp URL",
    ),
}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_paths_and_names_are_checked_whole(case: str, tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    source, expected = PATH_CASES[case]
    write_tree(tmp_path, {"base/pkg.yaml": OK, "a/pkg.yaml": source})
    result, elapsed = validate(kiln)
    assert_refused(result, elapsed, expected)
    assert "\x1b" not in result.err  # control characters are shown escaped, never sent to the terminal


def test_invalid_package_is_not_also_an_unknown_dependency(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(
        tmp_path,
        {
            "libfoo/pkg.yaml": "name: libfoo\nvariant: stage0\nsteps:\n  - build:\n      - true\n" + FIN,
            "app/pkg.yaml": "name: app\nvariant: stage0\ndependencies:\n  - stage: libfoo\n",
        },
    )
    result = kiln("validate")
    assert result.code == 2
    assert result.err.splitlines() == ["pkgs/libfoo/pkg.yaml:5: build[0] must be a string, not a boolean (quote it)"]


def test_shipped_tree_still_validates(kiln: Callable[..., Result], monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    for extra in ([], ["--set", "toolchain=toolchain"]):
        result = kiln("validate", "--pkgs", str(root / "pkgs"), *extra)
        assert result.code == 0, result.err


# --- the other YAML readers: profiles and kiln-project.yaml ---------------------------------------------------


def test_profile_with_alias_is_an_input_error(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("name: p\nx: &x [1]\n")
    with pytest.raises(InputError) as info:
        load_profile(file)
    assert str(info.value) == f"{file}:2: YAML anchors (&x) are not allowed in Kiln files"


def test_profile_fifo_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    os.mkfifo(file)
    with pytest.raises(InputError, match="profile is not a regular file"):
        load_profile(file)


def test_the_project_file_is_read_through_the_hardened_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_MIRRORS", raising=False)
    (tmp_path / "kiln-project.yaml").write_bytes(b"mirrors: [\xff]\n")
    with pytest.raises(InputError, match=r"kiln-project.yaml:1: kiln-project.yaml is not valid UTF-8"):
        load_mirrors(tmp_path)
    (tmp_path / "kiln-project.yaml").write_text("mirrors: " + "[" * 200 + "]" * 200 + "\n")
    with pytest.raises(InputError, match=r"kiln-project.yaml:1: nested more than 64 levels deep"):
        load_mirrors(tmp_path)


def test_read_yaml_file_raises_only_input_errors(tmp_path: Path) -> None:
    for content in [b"", b"\x00", b"a: !!python/object:os.system x\n", b"? [a, {b: c}]\n: 1\n", b"\xef\xbb\xbfa: 1\n"]:
        file = tmp_path / "x.yaml"
        file.write_bytes(content)
        try:
            read_yaml_file(file)
        except KilnError as exc:
            assert isinstance(exc, InputError)


def test_directories_nested_past_the_recursion_limit(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    """Finding pkg.yaml files walks iteratively: 1100 nested directories are no RecursionError."""
    pkgs = write_tree(tmp_path, {"base/pkg.yaml": OK})
    chain = [str(pkgs)]
    for _ in range(1100):  # os.mkdir one level at a time: Path.mkdir(parents=True) itself recurses
        chain.append(os.path.join(chain[-1], "d"))
        os.mkdir(chain[-1])
    Path(chain[-1], "pkg.yaml").write_text("name: deep\nvariant: stage0\n")
    try:
        result = kiln("validate")
        assert result.code == 0, result.err
        assert "2 packages valid" in result.out
    finally:  # pytest's recursive cleanup would hit the recursion limit too
        os.unlink(os.path.join(chain[-1], "pkg.yaml"))
        for directory in reversed(chain[1:]):
            os.rmdir(directory)


# --- the signed template cache -----------------------------------------------------------------------

TEMPLATED = "name: a\nvariant: stage0\nversion: '{% if arch %}1{% endif %}'\n" + FIN


def evil_code(tmp_path: Path) -> bytes:
    return marshal.dumps(compile(f"open({str(tmp_path / 'canary')!r}, 'w').write('pwned')", "x", "exec"))


def test_signed_cache_is_used_and_a_forged_entry_is_not(
    tmp_path: Path, cache: Path, kiln: Callable[..., Result]
) -> None:
    write_tree(tmp_path, {"a/pkg.yaml": TEMPLATED})
    assert kiln("validate").code == 0
    entries = list((cache / "templates").iterdir())
    assert len(entries) == 1
    assert (tmp_path / "state" / "template-cache.key").stat().st_mode & 0o777 == 0o600
    # A planted entry: right name, any MAC the attacker can make without the key.
    entries[0].write_bytes(b"\0" * 32 + evil_code(tmp_path))
    template._COMPILED.clear()
    result = kiln("validate")
    assert result.code == 0, result.err
    assert not (tmp_path / "canary").exists()
    # Signed with a key of the attacker's own: still refused.
    other = b"k" * 32
    name = entries[0].stem.encode()
    payload = evil_code(tmp_path)
    entries[0].write_bytes(hmac.new(other, name + payload, hashlib.sha256).digest() + payload)
    template._COMPILED.clear()
    assert kiln("validate").code == 0
    assert not (tmp_path / "canary").exists()


def test_a_key_others_can_read_disables_the_cache(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "template-cache.key").write_bytes(b"k" * 32)
    (state / "template-cache.key").chmod(0o644)
    write_tree(tmp_path, {"a/pkg.yaml": TEMPLATED})
    assert kiln("validate").code == 0
    assert not (cache / "templates").exists()


def test_a_cached_template_keeps_its_errors_and_lines(tmp_path: Path, cache: Path, kiln: Callable[..., Result]) -> None:
    """Loaded from the signed cache, a template reports runtime errors at the same line."""
    source = "name: a\nvariant: stage0\n\nversion: '{{ 10 // n }}'\n"
    pkgs = write_tree(tmp_path, {"vars.yaml": "n: 5\n", "a/pkg.yaml": source})
    assert kiln("validate").code == 0
    (pkgs / "vars.yaml").write_text("n: 0\n")
    template._COMPILED.clear()
    result = kiln("validate")
    assert result.code == 2
    assert result.err.startswith("pkgs/a/pkg.yaml:4: template error: ZeroDivisionError")
