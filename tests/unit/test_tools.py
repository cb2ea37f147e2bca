"""kiln.core.tools.run: every external program fails in one style, with the end of what it printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.core import tools
from kiln.core.errors import BuildError, InputError


def test_output_is_captured_and_stdin_fed() -> None:
    assert tools.run(["tr", "a-z", "A-Z"], stdin="kiln\n").stdout == b"KILN\n"


def test_a_failure_names_the_step_the_exit_code_and_the_end_of_stderr() -> None:
    with pytest.raises(BuildError, match=r"^listing nothing failed \(exit 2\): .*nowhere.*") as caught:
        tools.run(["ls", "/nowhere"], what="listing nothing")
    assert caught.value.exit_code == 1


def test_stdout_is_the_detail_when_stderr_is_empty_and_long_output_is_cut() -> None:
    with pytest.raises(BuildError) as caught:
        tools.run(["sh", "-c", "printf 'x%.0s' $(seq 5000); echo END; exit 3"])
    message = str(caught.value)
    assert message.startswith("sh failed (exit 3): ") and message.endswith("END")
    assert len(message) < tools.DETAIL + 100


def test_accepted_codes_and_the_callers_error_class(tmp_path: Path) -> None:
    assert tools.run(["sh", "-c", "exit 1"], ok=(0, 1)).returncode == 1
    with pytest.raises(InputError, match="no output"):
        tools.run(["false"], error=InputError)
    with (tmp_path / "out").open("wb") as out:
        tools.run(["echo", "to a file"], stdout=out)
    assert (tmp_path / "out").read_text() == "to a file\n"


def test_a_missing_program_is_said_not_raised_as_a_traceback() -> None:
    with pytest.raises(BuildError, match="kiln-no-such-tool is not installed"):
        tools.run(["kiln-no-such-tool", "--help"])
