"""`kiln completion SHELL`: a completion script made from the whole parser (kiln.cli's, in ctx.parser)."""

from __future__ import annotations

import argparse

from kiln.core.verb import Context

SHELLS = ("bash", "zsh", "fish", "tcsh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "print a completion script for SHELL (made from this parser: by shtab for bash, zsh and "
        "tcsh), e.g. `kiln completion bash > /etc/bash_completion.d/kiln`, `source <(kiln completion bash)` or "
        "`kiln completion fish > ~/.config/fish/completions/kiln.fish`"
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help=", ".join(SHELLS))


def run(ctx: Context[object]) -> int:
    if ctx.args.shell == "fish":
        from kiln.usage.fish import fish_script

        print(fish_script(ctx.parser, "kiln"), end="")
        return 0
    import shtab

    print(shtab.complete(ctx.parser, shell=ctx.args.shell), end="")
    return 0
