"""Every class of bad input gives `file:line: message` on stderr, exit 2, no traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SHA, Result, write_tree

OK_DEP = """
name: base
variant: stage0
finalize:
  - from: /
    to: /
"""

# (files, expected stderr lines without the trailing count line)
CASES: dict[str, tuple[dict[str, str], list[str]]] = {
    "yaml syntax": (
        {"a/pkg.yaml": "name: a\nvariant: [stage0\n"},
        ["pkgs/a/pkg.yaml:3: YAML syntax: did not find expected ',' or ']'"],
    ),
    "unknown key with suggestion": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\ndependancies: []\n"},
        ["pkgs/a/pkg.yaml:3: unknown key 'dependancies' (did you mean 'dependencies'?)"],
    ),
    "unknown key in a step": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - biuld: [make]\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:4: unknown key 'biuld' in steps[0] (did you mean 'build'?)"],
    ),
    "wrong type": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - build: make\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:4: build must be a list, not a string"],
    ),
    "wrong type of runtime": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\ndependencies:\n  - stage: a\n    runtime: maybe\n"},
        ["pkgs/a/pkg.yaml:5: runtime must be true or false, not a string"],
    ),
    "bad name": (
        {"a/pkg.yaml": "variant: stage0\nname: My_Pkg\n"},
        [
            "pkgs/a/pkg.yaml:2: bad package name 'My_Pkg': use lowercase letters, digits and '._+-', "
            "starting with a letter or digit"
        ],
    ),
    "missing name": (
        {"a/pkg.yaml": "variant: stage0\n"},
        ["pkgs/a/pkg.yaml:1: missing required key 'name'"],
    ),
    "bad variant": (
        {"a/pkg.yaml": "name: a\nvariant: alpine\n"},
        ["pkgs/a/pkg.yaml:2: variant must be one of stage0, toolchain, scratch, not 'alpine'"],
    ),
    "duplicate names": (
        {"a/pkg.yaml": OK_DEP, "b/pkg.yaml": "# another\nname: base\nvariant: stage0\n"},
        ["pkgs/b/pkg.yaml:2: duplicate package name 'base' (also defined at pkgs/a/pkg.yaml:1)"],
    ),
    "unknown dependency": (
        {"base/pkg.yaml": OK_DEP, "a/pkg.yaml": "name: a\nvariant: stage0\ndependencies:\n  - stage: bsae\n"},
        ["pkgs/a/pkg.yaml:4: unknown dependency 'bsae' (did you mean 'base'?)"],
    ),
    "dependency cycle": (
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\ndependencies:\n  - stage: b\n",
            "b/pkg.yaml": "name: b\nvariant: stage0\ndependencies:\n  - stage: c\n",
            "c/pkg.yaml": "name: c\nvariant: stage0\ndependencies:\n  - stage: a\n",
        },
        ["pkgs/a/pkg.yaml:4: dependency cycle: a -> b -> c -> a"],
    ),
    "malformed sha256": (
        {
            "a/pkg.yaml": (
                "name: a\nvariant: stage0\nsteps:\n  - sources:\n      - url: https://x.org/a.tgz\n"
                "        destination: a.tgz\n        sha256: ABC123\nfinalize: [{from: /, to: /}]\n"
            )
        },
        ["pkgs/a/pkg.yaml:7: malformed sha256 'ABC123': expected 64 lowercase hex digits"],
    ),
    "exclude on a remote source": (
        {
            "a/pkg.yaml": (
                "name: a\nvariant: stage0\nsteps:\n  - sources:\n      - url: https://x.org/a.tgz\n"
                f"        destination: a.tgz\n        sha256: {SHA}\n        exclude: [x]\n"
                "finalize: [{from: /, to: /}]\n"
            )
        },
        [
            "pkgs/a/pkg.yaml:5: a source is either {url, destination, sha256[, debian]} "
            "or a local {path, destination[, exclude]}"
        ],
    ),
    "exclude pattern leading out": (
        {
            "a/pkg.yaml": (
                "name: a\nvariant: stage0\nsteps:\n  - sources:\n      - path: src\n"
                "        destination: src\n        exclude: [../x]\nfinalize: [{from: /, to: /}]\n"
            )
        },
        [
            "pkgs/a/pkg.yaml:7: exclude pattern must be relative to the source path without '..' "
            "or control characters, not '../x'"
        ],
    ),
    "relative finalize path": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nfinalize:\n  - from: out\n    to: /\n"},
        ["pkgs/a/pkg.yaml:4: from must be an absolute path without '..' or control characters, not 'out'"],
    ),
    "dotdot in to": (
        {
            "base/pkg.yaml": OK_DEP,
            "a/pkg.yaml": "name: a\nvariant: stage0\ndependencies:\n  - stage: base\n    to: /usr/../../etc\n",
        },
        [
            "pkgs/a/pkg.yaml:5: to must be an absolute path without '..', ':', ',' or control characters "
            "(it becomes an overlay mount option), not '/usr/../../etc'"
        ],
    ),
    "destination escapes build dir": (
        {
            "a/pkg.yaml": (
                "name: a\nvariant: stage0\nsteps:\n  - sources:\n      - url: https://x.org/a.tgz\n"
                f"        destination: ../a.tgz\n        sha256: {SHA}\nfinalize: [{{from: /, to: /}}]\n"
            )
        },
        [
            "pkgs/a/pkg.yaml:6: destination must be a path relative to /tmp/build without '..' or control characters, "
            "not '../a.tgz'"
        ],
    ),
    "undefined variable": (
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - build:\n      - make {{ flags }}\n"
            "finalize: [{from: /, to: /}]\n"
        },
        ["pkgs/a/pkg.yaml:5: undefined variable 'flags'"],
    ),
    "undefined attribute at render time": (
        {
            "vars.yaml": "versions: {musl: 1}\n",
            "a/pkg.yaml": "name: a\n\nvariant: stage0\nversion: '{{ versions.gcc }}'\n",
        },
        ["pkgs/a/pkg.yaml:4: undefined: 'dict object' has no attribute 'gcc'"],
    ),
    "template syntax": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\n{% if arch %}\nversion: '1'\n"},
        # Jinja lists the awaited tags in set order, so only the stable prefix is compared.
        ["pkgs/a/pkg.yaml:4: template syntax: Unexpected end of template. Jinja was looking for the following..."],
    ),
    "missing finalize": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - build: [make]\n"},
        ["pkgs/a/pkg.yaml:3: package 'a' has steps but no finalize: say what its output is"],
    ),
    "duplicate key": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nname: b\n"},
        ["pkgs/a/pkg.yaml:3: duplicate key 'name' (first at line 1)"],
    ),
    "yaml error after a loop maps to the template line": (
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n{% for i in [1, 2, 3] %}\n  - build: [echo {{ i }}]\n"
            "{% endfor %}\nfinalize: [{from: /, to: /}\nversion: '1'\n"
        },
        ["pkgs/a/pkg.yaml:8: YAML syntax: did not find expected ',' or ']'"],
    ),
    "toolchain variant without toolchain package": (
        {"a/pkg.yaml": "name: a\n"},
        [
            "pkgs/a/pkg.yaml:1: variant 'toolchain' builds on package 'toolchain' (the 'toolchain' variable), "
            "which is not in the tree; add it or use variant stage0 or scratch"
        ],
    ),
    "yaml boolean where a snippet belongs": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - build:\n      - true\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:5: build[0] must be a string, not a boolean (quote it)"],
    ),
    "bad env name": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - env:\n      1FOO: x\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:4: env name '1FOO' is not a valid shell variable name"],
    ),
    "cache path that climbs out": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - cache: [/tmp/../etc]\nfinalize: [{from: /, to: /}]\n"},
        [
            "pkgs/a/pkg.yaml:4: cache[0] must be an absolute path of letters, digits and '._+-' "
            "(a directory inside the build root), not '/tmp/../etc'"
        ],
    ),
    "cache path that is the root": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - cache: [/]\nfinalize: [{from: /, to: /}]\n"},
        [
            "pkgs/a/pkg.yaml:4: cache[0] must be an absolute path of letters, digits and '._+-' "
            "(a directory inside the build root), not '/'"
        ],
    ),
    "scratch path that is the root": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - scratch: [/]\nfinalize: [{from: /, to: /}]\n"},
        [
            "pkgs/a/pkg.yaml:4: scratch[0] must be an absolute path of letters, digits and '._+-' "
            "(a directory inside the build root), not '/'"
        ],
    ),
    "finalize from a scratch directory": (
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - scratch: [/tmp/src]\n"
            "finalize:\n  - {from: /out, to: /}\n  - {from: /tmp/src/lib, to: /lib}\n"
        },
        ["pkgs/a/pkg.yaml:7: from '/tmp/src/lib' is in a scratch directory, never part of the output"],
    ),
    "finalize from a directory holding a scratch directory": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - scratch: [/tmp/src]\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:5: from '/' holds the scratch directory '/tmp/src', never part of the output"],
    ),
    "bad network": (
        {"a/pkg.yaml": "name: a\nvariant: stage0\nsteps:\n  - network: host\nfinalize: [{from: /, to: /}]\n"},
        ["pkgs/a/pkg.yaml:4: network must be 'none' or 'default', not 'host'"],
    ),
    "vars file syntax": (
        {"vars.yaml": "a: [1\n", "a/pkg.yaml": OK_DEP},
        ["pkgs/vars.yaml:2: YAML syntax: did not find expected ',' or ']'"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_reported_with_file_and_line(case: str, tmp_path: Path, kiln: Callable[..., Result]) -> None:
    files, expected = CASES[case]
    write_tree(tmp_path, files)
    result = kiln("validate")
    assert result.code == 2
    lines = result.err.splitlines()
    trailer = [f"{len(expected)} errors"] if len(expected) > 1 else []  # one error has no count line
    assert len(lines) == len(expected) + len(trailer)
    for line, want in zip(lines, expected, strict=False):
        if want.endswith("..."):
            assert line.startswith(want[:-3])
        else:
            assert line == want
    assert lines[len(expected) :] == trailer
    assert "Traceback" not in result.err


def test_all_errors_are_reported_not_just_the_first(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(
        tmp_path,
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\nvarient: x\ndependencies:\n  - stage: nope\n",
            "b/pkg.yaml": "name: B\nvariant: stage0\n",
            "c/pkg.yaml": "name: c\nvariant: stage0\nversion: '{{ missing_one }}-{{ missing_two }}'\n",
        },
    )
    result = kiln("validate")
    assert result.code == 2
    assert result.err.splitlines() == [
        "pkgs/a/pkg.yaml:3: unknown key 'varient' (did you mean 'variant'?)",
        "pkgs/b/pkg.yaml:1: bad package name 'B': use lowercase letters, digits and '._+-', "
        "starting with a letter or digit",
        "pkgs/c/pkg.yaml:3: undefined variable 'missing_one'",
        "pkgs/c/pkg.yaml:3: undefined variable 'missing_two'",
        "4 errors",
    ]


def test_two_independent_cycles_are_both_reported(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(
        tmp_path,
        {
            "a/pkg.yaml": "name: a\nvariant: stage0\ndependencies: [{stage: b}]\n",
            "b/pkg.yaml": "name: b\nvariant: stage0\ndependencies: [{stage: a}]\n",
            "x/pkg.yaml": "name: x\nvariant: stage0\ndependencies: [{stage: x}]\n",
        },
    )
    result = kiln("validate")
    assert result.err.splitlines()[:-1] == [
        "pkgs/a/pkg.yaml:3: dependency cycle: a -> b -> a",
        "pkgs/x/pkg.yaml:3: dependency cycle: x -> x",
    ]


def test_bad_platform_and_bad_set(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    write_tree(tmp_path, {"a/pkg.yaml": OK_DEP})
    result = kiln("validate", "--platform", "linux/riscv64")
    assert (result.code, result.err.strip()) == (
        2,
        "unsupported platform 'linux/riscv64': choose one of linux/amd64, linux/arm64",
    )
    result = kiln("validate", "--set", "novalue")
    assert (result.code, result.err.strip()) == (2, "--set expects key=value with an identifier key, got 'novalue'")


def test_missing_tree(tmp_path: Path, kiln: Callable[..., Result]) -> None:
    result = kiln("validate", "--pkgs", "nowhere")
    assert result.code == 2
    assert "is not a directory (use --pkgs DIR)" in result.err
