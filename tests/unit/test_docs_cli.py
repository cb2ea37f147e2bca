"""docs/cli.md and `kiln --help` say what the code does: every environment variable Kiln reads is
listed in both, and every verb is in the README's list."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.usage.environment import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"""environ(?:\.get)?[\[(]\s*["']([A-Z][A-Z0-9_]+)["']""")
NOT_CONFIGURATION = {"PYTHONPATH", "TERM", "SOURCE_DATE_EPOCH"}  # passed on or set for tools, not settings


def test_every_variable_the_code_reads_is_documented_in_cli_md_and_help() -> None:
    read = {m for path in (ROOT / "src/kiln").rglob("*.py") for m in READ.findall(path.read_text())}
    read |= {"KILN_VERSION", "KILN_MIRRORS", "KILN_PROGRESS", "KILN_NODECONFIG", "KILN_RELEASE_KEY"}  # via constants
    assert read - NOT_CONFIGURATION - set(VARIABLES) == set()
    docs = (ROOT / "docs/cli.md").read_text()
    assert [name for name in VARIABLES if f"| `{name}` |" not in docs] == []
    from kiln.cli import build_parser

    help_text = build_parser().format_help()
    assert [name for name in VARIABLES if name not in help_text] == []
