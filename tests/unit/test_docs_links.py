"""README.md and docs/*.md name only what exists: every relative link and every `docs/*.md` and
`src/kiln/...` path they mention is a file (or directory) of the project, and every `kiln VERB` in
their shell examples is a verb (and sub-verb) the parser has. A doc that names a file that is gone,
or a verb that was renamed, fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from kiln.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
DOC_PATH = re.compile(r"(?<![\w/.-])docs/[\w.-]+\.md")
SRC_PATH = re.compile(r"(?<![\w/.-])src/kiln/[\w/.-]*[\w/]")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
# `kiln VERB` (or `.venv/bin/kiln VERB`) at the start of a command: a line, or after `$(`, `|`, `&&`, `;`
COMMAND = re.compile(
    r"""(?:^|[(|&;]\s*)(?:\$ |# )?(?:[A-Z_]+=(?:"[^"]*"|\S*) )*(?:\.venv/bin/)?kiln ([a-z][\w-]*(?: [a-z][\w-]*)?)"""
)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_the_docs_are_found() -> None:
    assert (ROOT / "README.md") in DOCS and len(DOCS) > 10


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_name_files_that_exist(doc: Path) -> None:
    missing = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # https:, mailto:, an anchor here
            continue
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            missing.append(target)
    assert missing == [], f"{doc.name} links to files that do not exist"


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_named_docs_and_source_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    named = set(DOC_PATH.findall(text)) | {p.rstrip(".") for p in SRC_PATH.findall(text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], f"{doc.name} names paths that do not exist"


def _verbs() -> dict[str, set[str]]:
    """Each verb of the parser, with its sub-verbs (empty for a verb that has none)."""

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    return {verb: set(choices(sub)) for verb, sub in choices(build_parser()).items()}


def _commands(text: str) -> list[str]:
    found = []
    for language, body in FENCE.findall(text):
        if language not in SHELL_BLOCKS:
            continue
        for line in body.splitlines():
            found += COMMAND.findall(line.split(" # ", 1)[0].strip())
    return found


def test_the_command_pattern() -> None:
    lines = [
        "kiln build x  # kiln nothing",
        "$ .venv/bin/kiln cache ls",
        "KEY=$(kiln bootstrap | y)",
        'A="b, c" kiln ls',
    ]
    text = "```sh\n" + "\n".join(lines) + "\n```\n"
    assert _commands(text) == ["build x", "cache ls", "bootstrap", "ls"]


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_shell_examples_use_real_verbs(doc: Path) -> None:
    verbs = _verbs()
    wrong = []
    for command in _commands(doc.read_text()):
        verb, _, rest = command.partition(" ")
        if verb not in verbs:
            wrong.append(f"kiln {verb}")
        elif verbs[verb] and rest.strip() and rest.strip() not in verbs[verb]:
            wrong.append(f"kiln {verb} {rest.strip()}")
    assert wrong == [], f"{doc.name} shows commands the parser does not have"


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.description or "", parser.epilog or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        if isinstance(action, argparse._SubParsersAction):
            texts += [choice.help or "" for choice in action._choices_actions]
            for sub in action.choices.values():
                texts += _help_texts(sub)
    return texts


def test_help_examples_name_packages_of_the_tree() -> None:
    packages = {
        m.group(1)
        for path in (ROOT / "pkgs").rglob("pkg.yaml")
        if (m := re.search(r"^name: *([\w.+-]+)", path.read_text(), re.MULTILINE))
    }
    named = {
        m.group(1)
        for text in _help_texts(build_parser())
        for m in re.finditer(r"kiln (?:eval|build|shell|log|dump) ([a-z][\w.+-]*)", text)
    }
    assert named, "the help shows no package example any more: drop this test"
    assert named - packages == set()


def test_cli_md_describes_each_variable_as_the_help_does() -> None:
    from kiln.usage.environment import VARIABLES

    text = (ROOT / "docs/cli.md").read_text()
    rows = {
        m.group(1): m.group(2).replace("`", "") for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$", text, re.MULTILINE)
    }
    assert {name: rows.get(name) for name in VARIABLES} == VARIABLES
