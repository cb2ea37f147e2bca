"""fish completion made from an argparse parser: shtab writes bash, zsh and tcsh scripts, not fish's.

fish completes from `complete` commands, one per verb or option, each with a condition saying when it
applies (no verb yet; this verb given; this verb's action given). Options with choices offer them;
verbs with positional arguments complete file names, the others none.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _help(action: argparse.Action) -> str:
    return " ".join((action.help or "").split())[:120]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _choice_helps(group: argparse._SubParsersAction) -> dict[str, str]:  # type: ignore[type-arg]
    return {choice.dest: " ".join((choice.help or "").split())[:120] for choice in group._choices_actions}


def _options(prog: str, parser: argparse.ArgumentParser, condition: str) -> Iterator[str]:
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        parts = [f"complete -c {prog}", f"-n {_quote(condition)}"]
        for option in action.option_strings:
            parts.append(f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}")
        if action.nargs != 0:
            parts.append("-r")
            if action.choices:
                parts.append(f"-f -a {_quote(' '.join(str(c) for c in action.choices))}")
        parts.append(f"-d {_quote(_help(action))}")
        yield " ".join(parts)


def _takes_files(parser: argparse.ArgumentParser) -> bool:
    return any(not a.option_strings and not isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def fish_script(parser: argparse.ArgumentParser, prog: str) -> str:
    """The fish script: `kiln completion fish | source`, or saved as ~/.config/fish/completions/kiln.fish."""
    lines = [f"# fish completion for {prog}, made from its argument parser", f"complete -c {prog} -f"]
    lines += _options(prog, parser, "__fish_use_subcommand")
    verbs = _subparsers(parser)
    if verbs is None:
        return "\n".join(lines) + "\n"
    helps = _choice_helps(verbs)
    for name, sub in verbs.choices.items():
        lines.append(f"complete -c {prog} -n __fish_use_subcommand -a {name} -d {_quote(helps.get(name, ''))}")
        given = f"__fish_seen_subcommand_from {name}"
        lines += _options(prog, sub, given)
        actions = _subparsers(sub)
        if actions is None:
            if _takes_files(sub):
                lines.append(f"complete -c {prog} -n {_quote(given)} -F")
            continue
        names = " ".join(actions.choices)
        action_helps = _choice_helps(actions)
        for action_name, action_parser in actions.choices.items():
            none_yet = f"{given}; and not __fish_seen_subcommand_from {names}"
            help_text = _quote(action_helps.get(action_name, ""))
            lines.append(f"complete -c {prog} -n {_quote(none_yet)} -a {action_name} -d {help_text}")
            both = f"{given}; and __fish_seen_subcommand_from {action_name}"
            lines += _options(prog, action_parser, both)
            if _takes_files(action_parser):
                lines.append(f"complete -c {prog} -n {_quote(both)} -F")
    return "\n".join(lines) + "\n"
