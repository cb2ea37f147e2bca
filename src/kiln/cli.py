"""Command line: the global options, the table of verbs and the dispatch; nothing a verb does.

Each verb is its room's command module, with `add_arguments(parser)` and `run(ctx)` (kiln.core.verb).
The modules are imported here to build the parser, and import their room's machinery only when they run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from kiln import __version__
from kiln.boot import command as boot
from kiln.build import cancel
from kiln.build.commands import bootstrap, build, cache, export, fetch, log, ls, shell, validate
from kiln.build.progress import set_mode as set_progress_mode
from kiln.cloud import command as upload
from kiln.core import console
from kiln.core.errors import InputErrors, KilnError
from kiln.core.project import Project, fill_options
from kiln.core.project import current as current_project
from kiln.core.verb import Context
from kiln.factory import command as factory
from kiln.image import command as image
from kiln.image import dev_command, extension_command, schematic_command
from kiln.installer import command as install
from kiln.installer import release_command
from kiln.kconfig import command as kernel
from kiln.node import command as node
from kiln.node import secrets_command
from kiln.pkg import dump_command, eval_command, init_command
from kiln.pkg.options import add_tree_options, load_graph
from kiln.report import command as report
from kiln.report import graph_command
from kiln.signing import keys_command, verify_command
from kiln.usage import completion
from kiln.usage.environment import help_text as environment_help


@dataclass(frozen=True)
class Verb:
    """A verb: its command module (or the actions of several rooms it groups, as `kiln release push|upload`)
    and its help, which is also its description unless the module sets one."""

    name: str
    module: ModuleType | None
    help: str
    actions: tuple[Verb, ...] = ()


# fmt: off
VERBS = (
    Verb("validate", validate, "check every pkg.yaml of the tree; print all errors as file:line: message"),
    Verb("ls", ls, "list packages with variant, version, what they need and their cache key"),
    Verb("graph", graph_command, "print the dependency graph (build order), optionally of TARGETs only"),
    Verb("eval", eval_command,
         "render a Jinja2 template with TARGET's variables, e.g. kiln eval toolchain-seed '{{ target }}'"),
    Verb("dump", dump_command, "print the rendered, canonical spec of every package (or of TARGETs)"),
    Verb("bootstrap", bootstrap, "make the stage0 seed root (debootstrap, or --from-tar PATH) and store it"),
    Verb("fetch", fetch, "download and verify the sources of TARGETs (default: all packages)"),
    Verb("build", build, "build TARGETs and what they need, in parallel, skipping stored keys"),
    Verb("shell", shell, "open a shell in TARGET's build root (dependencies merged, sources in place)"),
    Verb("export", export, "write the graph for other build systems"),
    Verb("log", log, "print TARGET's last build log"),
    Verb("cache", cache, "inspect and clean the store"),
    Verb("kernel", kernel, "edit the kernel config in the kernel's build container"),
    Verb("image", image, "build what profiles need, then write their outputs (kiln image iso metal aws --out DIR); "
         "without a profile, vmlinuz and initramfs.zst"),
    Verb("dev", dev_command, "the inner loop: kiln dev boot rebuilds what changed, writes vmlinuz and initramfs.zst to "
         "_out/dev and boots them to machined's ready line, with the time of each phase"),
    Verb("init", init_command, "start an extension project: kiln init --extension NAME DIR writes "
         "DIR/kiln-project.yaml (the stock tree of --pkgs, then its own), pkgs/NAME and a README"),
    Verb("extension", extension_command, "the extension author's loop: kiln extension build NAME builds NAME and "
         "the kernel, checks it as kiln image would (paths, Kiln and kernel ranges, vermagic) and writes its layer "
         "to _out/extensions"),
    Verb("factory", factory,
         "serve images on demand: schematics in, any profile's outputs out, over HTTP (docs/factory.md)"),
    Verb("install", install, "write a profile's disk layout (default metal) onto a disk or disk file; a disk that "
         "is not empty needs --wipe, one in use is refused"),
    Verb("release", None, "publish releases to an OCI registry or a cloud", actions=(
        Verb("push", release_command,
             "push an installer image to HOST/REPO:<version> with release annotations (channel, architecture)"),
        Verb("upload", upload,
             "publish a kiln image output directory to a cloud: an AWS AMI (EBS snapshot, copies, SSM "
             "parameter) or an Azure page blob (the VHD, and the az command that makes its image)"),
    )),
    Verb("boot", boot, "boot an artifact in QEMU and wait for machined's ready line"),
    Verb("node", node,
         "talk to running machines over machined's mutual-TLS API: status, logs, rollback, rolling upgrades"),
    Verb("secrets", secrets_command,
         "make a fleet's API certificates: two CAs, machines' (serverAuth) and clients' with a role"),
    Verb("keys", keys_command, "make your own Secure Boot, kernel module and release keys"),
    Verb("report", report, "pictures: a build's timeline (kiln build --json) or what takes the space in an image"),
    Verb("schematic", schematic_command,
         "check a schematic and print its ID (what kiln image --schematic records and a factory serves)"),
    Verb("verify", verify_command,
         "check DIR against its SHA256SUMS, its provenance and the release key's signatures over them"),
    Verb("completion", completion, "print a shell completion script: source <(kiln completion bash)"),
)
# fmt: on


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: `--js` is an error, not `--json`, so an abbreviation in a
    script cannot start meaning another option when one is added. Subparsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The global options (the package tree's, which may come before the verb) and every verb of VERBS."""
    parser = Parser(
        prog="kiln",
        description="Build minimal, immutable Linux images from a declarative package graph.",
        epilog=environment_help() + "\n\ndocs/cli.md: the grammar, the project file and these variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    add_tree_options(parser, defaults=True)
    add_verbs(parser.add_subparsers(dest="verb", metavar="VERB"), VERBS)
    return parser


def add_verbs(subparsers: argparse._SubParsersAction[Parser], verbs: tuple[Verb, ...]) -> None:
    for verb in verbs:
        sub = subparsers.add_parser(verb.name, help=verb.help, description=verb.help)
        if verb.module is None:
            add_verbs(sub.add_subparsers(dest=f"{verb.name}_verb", metavar="ACTION", required=True), verb.actions)
        else:
            verb.module.add_arguments(sub)
            sub.set_defaults(handler=verb.module.run)


def apply_project(args: argparse.Namespace) -> Project:
    """The project around the working directory (kiln-project.yaml, found by walking up), with what the
    command line left unset filled from it (core.project.fill_options); --progress taken."""
    set_progress_mode(args.progress)
    project = current_project()
    fill_options(args, project)
    return project


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`kiln ls --json | head -1`): not an error of Kiln's, and nothing more
        # can be printed; stdout goes to /dev/null so the interpreter's final flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        project = apply_project(args)
        ctx = Context(args, project, partial(load_graph, args, project), parser)
        with cancel.handlers():  # SIGINT/SIGTERM stop running steps; nothing half done is stored
            return int(args.handler(ctx))
    except cancel.Interrupted as exc:
        console.error(str(exc))
        return exc.exit_code
    except InputErrors as exc:
        for err in exc.errors:
            console.error(str(err))
        if len(exc.errors) > 1:
            console.error(f"{len(exc.errors)} errors")
        return exc.exit_code
    except KilnError as exc:
        if cancel.TOKEN.cancelled:  # a build step's error caused by the cancel itself
            interrupted = cancel.Interrupted(cancel.TOKEN.signum or signal.SIGINT)
            console.error(str(interrupted))
            return interrupted.exit_code
        console.error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        console.error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
