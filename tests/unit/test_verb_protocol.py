"""Every verb is its room's command module with `add_arguments(parser)` and `run(ctx)`, and cli.py stays
the global options, a table of those modules and the dispatch."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from kiln import cli


def command_modules(verbs: tuple[cli.Verb, ...] = cli.VERBS, above: str = "") -> Iterator[tuple[str, ModuleType]]:
    for verb in verbs:
        name = f"{above}{verb.name}"
        if verb.module is None:
            assert verb.actions, f"kiln {name}: neither a module nor actions"
            yield from command_modules(verb.actions, f"{name} ")
        else:
            assert not verb.actions, f"kiln {name}: a module and actions"
            yield name, verb.module


def test_every_verb_module_has_add_arguments_and_a_run_of_one_context() -> None:
    seen = list(command_modules())
    assert len(seen) > 25
    for name, module in seen:
        arguments = list(inspect.signature(module.add_arguments).parameters)
        assert arguments == ["parser"], f"kiln {name}: {module.__name__}.add_arguments{arguments}"
        required = [
            parameter.name
            for parameter in inspect.signature(module.run).parameters.values()
            if parameter.default is inspect.Parameter.empty
        ]
        assert required == ["ctx"], f"kiln {name}: {module.__name__}.run takes {required}, not one ctx"
        assert module.__name__ != "kiln.cli" and not module.__name__.startswith("kiln.core"), name


def test_the_table_is_every_verb_of_the_parser() -> None:
    parser = cli.build_parser()
    (verbs,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert list(verbs.choices) == [verb.name for verb in cli.VERBS]


def test_cli_stays_under_200_lines() -> None:
    lines = Path(cli.__file__).read_text().splitlines()
    assert len(lines) < 200, f"cli.py has {len(lines)} lines: what a verb does belongs in its room's command module"
