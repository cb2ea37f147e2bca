"""The CLI's grammar: no prefix abbreviations, and a closed pipe is not a traceback."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli import build_parser
from kiln.core.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--js"],  # --json
        ["build", "--all", "--no-ca"],  # --no-cache
        ["image", "metal", "--ou", "x"],  # --out (or the old --output)
        ["cache", "ls", "--js"],
        ["boot", "x.iso", "--kee"],  # --keep
    ],
)
def test_abbreviated_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_full_option_names_still_parse() -> None:
    args = build_parser().parse_args(["ls", "--json"])
    assert args.json is True
    args = build_parser().parse_args(["boot", "x.iso", "--keep", "--blank-disk", "4G"])
    assert args.keep and args.blank_disk == "4G" and args.accel == "auto"
    assert build_parser().parse_args(["boot", "x.iso", "--keep-running"]).old_keep  # the old name still works


def test_a_reader_that_goes_away_ends_kiln_quietly(tmp_path: Path) -> None:
    """`kiln dump --json | head -c 1`: the real CLI in a child process, its pipe closed before it writes."""
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write fails with EPIPE
    child = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "dump", "--json"],
        cwd=ROOT,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    os.close(write)
    assert "Traceback" not in child.stderr and "BrokenPipe" not in child.stderr, child.stderr
    assert child.returncode == 128 + signal.SIGPIPE


FIXTURE = ROOT / "tests/fixtures/buildgraph/pkgs"


def run_kiln(*argv: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KILN_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_validate_json_gives_the_result_or_every_error(tmp_path: Path) -> None:
    good = run_kiln("validate", "--json", "--pkgs", str(FIXTURE), cache=tmp_path / "c")
    assert good.returncode == 0 and json.loads(good.stdout) == {"ok": True, "platform": "linux/amd64", "packages": 5}
    bad = tmp_path / "pkgs"
    shutil.copytree(FIXTURE, bad)
    (bad / "greet-lib/pkg.yaml").write_text("name: greet-lib\nsteps: 5\n")
    result = run_kiln("validate", "--json", "--pkgs", str(bad), cache=tmp_path / "c")
    assert result.returncode == 2 and result.stderr == ""
    assert json.loads(result.stdout) == {
        "ok": False,
        "errors": [
            {"file": str(bad / "greet-lib/pkg.yaml"), "line": 2, "message": "steps must be a list, not a number"}
        ],
    }


def test_graph_json_is_format_json_and_fetch_json_names_its_packages(tmp_path: Path) -> None:
    as_flag = run_kiln("graph", "--json", "--pkgs", str(FIXTURE), cache=tmp_path / "c")
    as_format = run_kiln("graph", "--format", "json", "--pkgs", str(FIXTURE), cache=tmp_path / "c")
    assert as_flag.returncode == 0 and as_flag.stdout == as_format.stdout and json.loads(as_flag.stdout)["order"]
    fetched = run_kiln("fetch", "greet-lib", "--json", "--pkgs", str(FIXTURE), cache=tmp_path / "c")
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout) == {"fetched": 0, "packages": ["greet-lib"]}


def test_bash_completion_completes_verbs_and_options(tmp_path: Path) -> None:
    """The script `kiln completion bash` prints, sourced into a real bash and asked as the shell would."""
    script = tmp_path / "kiln.bash"
    made = run_kiln("completion", "bash", cache=tmp_path / "c")
    assert made.returncode == 0, made.stderr
    script.write_text(made.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(["kiln", *words])
        probe = (
            f"source {script}; COMP_WORDS=(kiln {' '.join(words)}); COMP_CWORD={len(words)}; "
            f"COMP_LINE='{line}'; COMP_POINT={len(line)}; _shtab_kiln; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        return result.stdout.split()

    assert set(complete("b")) == {"boot", "bootstrap", "build"}
    assert complete("comp") == ["completion"]
    assert "--keep" in complete("boot", "--ke")
    assert "--json" in complete("validate", "--j")


@pytest.mark.parametrize(
    ("argv", "pkgs", "platform"),
    [
        (["ls"], None, None),
        (["--pkgs", "X", "ls"], ["X"], None),
        (["ls", "--pkgs", "Y"], ["Y"], None),
        (["ls", "--pkgs", "Y", "--pkgs", "Z"], ["Y", "Z"], None),  # several trees, in order
        (["--pkgs", "X", "--platform", "linux/arm64", "ls", "--pkgs", "Y"], ["Y"], "linux/arm64"),
        (["--platform", "linux/arm64", "image", "metal"], None, "linux/arm64"),
    ],
)
def test_tree_options_may_come_before_the_verb_and_after_it_win(
    argv: list[str], pkgs: list[str] | None, platform: str | None
) -> None:
    args = build_parser().parse_args(argv)  # None: the project's pkgs/ (cli.apply_project)
    assert (args.pkgs, args.platform) == (pkgs, platform)


def test_tree_options_before_the_verb_reach_the_handler(tmp_path: Path) -> None:
    result = run_kiln("--pkgs", str(FIXTURE), "validate", "--json", cache=tmp_path / "c")
    assert result.returncode == 0 and json.loads(result.stdout)["packages"] == 5


def test_image_kind_and_its_old_name(capsys: pytest.CaptureFixture[str]) -> None:
    from kiln.core.errors import InputError
    from kiln.image.kernel_initramfs import kinds

    parse = build_parser().parse_args
    assert kinds(parse(["image", "--kind", "kernel"])) == "kernel"
    assert kinds(parse(["image"])) == "kernel,initramfs"
    assert kinds(parse(["image", "--output", "initramfs"])) == "initramfs"
    assert "--output is now --kind" in capsys.readouterr().err
    with pytest.raises(InputError, match="give one of them"):
        kinds(parse(["image", "--kind", "kernel", "--output", "kernel"]))


def test_progress_mode_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """--progress plain|tty|auto decides between the live view and lines; stderr's terminal-ness is
    stubbed (isatty), the two renderers themselves are tested in test_progress."""
    from kiln.build import progress
    from kiln.build.session import choose_progress

    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    for argv, live in ((["build", "x"], True), (["--progress", "plain", "build", "x"], False)):
        progress.set_mode(build_parser().parse_args(argv).progress)
        assert progress.live() is live
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    progress.set_mode(build_parser().parse_args(["build", "x", "--progress", "tty"]).progress)
    assert progress.live() and type(choose_progress(json_output=False)).__name__ == "LiveProgress"
    assert type(choose_progress(json_output=True)).__name__ == "PlainProgress"  # beside --json: lines
    monkeypatch.setenv(progress.PROGRESS_ENV, "tty")
    progress.set_mode(None)
    assert progress.live()
    monkeypatch.setenv(progress.PROGRESS_ENV, "fancy")
    with pytest.raises(InputError, match="KILN_PROGRESS='fancy': choose from auto, plain, tty"):
        progress.set_mode(None)
    progress.set_mode("auto")


def test_fish_completion_from_the_parser_in_a_real_fish(tmp_path: Path) -> None:
    """shtab has no fish: usage.fish makes the script, and fish itself completes with it."""
    script = tmp_path / "kiln.fish"
    result = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "completion", "fish"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    script.write_text(result.stdout)

    def complete(line: str) -> list[str]:
        probe = f"source {script}; complete -C {json.dumps(line)}"
        done = subprocess.run(["fish", "-c", probe], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return [entry.split("\t")[0] for entry in done.stdout.splitlines()]

    assert set(complete("kiln b")) == {"boot", "bootstrap", "build"}
    assert complete("kiln boot --acc") == ["--accel"]
    assert sorted(complete("kiln boot --accel ")) == ["auto", "kvm", "tcg"]
    assert {"gc", "ls", "push", "pull"} <= set(complete("kiln cache "))
    assert "--json" in complete("kiln cache ls --j")
    assert "--keep-running" not in complete("kiln boot --kee")  # hidden old names are not offered


def every_verb(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every verb and sub-verb of the parser, with its own parser."""
    found = [(path, parser)] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += every_verb(sub, (*path, name))
    return found


def test_every_verb_has_help_and_every_json_option_says_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    verbs = every_verb(build_parser())
    assert len(verbs) > 30
    for path, parser in verbs:
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([*path, "--help"])
        assert exit_info.value.code == 0, path
        assert capsys.readouterr().out.startswith(f"usage: kiln {' '.join(path)}"), path
        for action in parser._actions:
            if "--json" in action.option_strings:
                assert action.help and action.help != argparse.SUPPRESS, f"kiln {' '.join(path)} --json"
