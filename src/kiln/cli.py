"""Command line: argument parsing and dispatch only.

Over 400 lines because the parser of every verb is here; what a verb does lives in its room.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kiln import __version__
from kiln.boot import command as boot_command
from kiln.build import cancel
from kiln.build.commands import bootstrap as bootstrap_cmd
from kiln.build.commands import build as build_cmd
from kiln.build.commands import cache as cache_cmd
from kiln.build.commands import export as export_cmd
from kiln.build.commands import fetch as fetch_cmd
from kiln.build.commands import log as log_cmd
from kiln.build.commands import ls as ls_cmd
from kiln.build.commands import shell as shell_cmd
from kiln.build.commands import validate as validate_cmd
from kiln.build.progress import set_mode as set_progress_mode
from kiln.cloud import command as upload_command
from kiln.core import console
from kiln.core.errors import InputErrors, KilnError
from kiln.core.project import PACKAGE_TREE, PROFILES_DIR, Project
from kiln.core.project import current as current_project
from kiln.core.verb import Context
from kiln.factory import command as factory_command
from kiln.image import command as image_command
from kiln.image import dev as dev_command
from kiln.image import extension_command, schematic_command
from kiln.installer import command as install_command
from kiln.installer import release_command
from kiln.kernel import command as kernel_command
from kiln.node import command as node_command
from kiln.node import secrets_command
from kiln.pkg import dump_command, eval_command, init_command
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options, load_graph
from kiln.report import command as report_command
from kiln.report import graph_command
from kiln.signing import command as keys_command
from kiln.signing import verify_command
from kiln.usage import completion
from kiln.usage.environment import help_text as environment_help

if TYPE_CHECKING:
    pass

Handler = Callable[[Context[Graph]], int]
# --platform's default. It parses as None so `kiln image` can tell a profile's arch from an explicit --platform.


# What a flag left unset takes when the project file does not say either.
BUILTIN_DEFAULTS: dict[str, object] = {"jobs": 2, "runner": "sandbox", "cache_from": None, "cache_to": None}


def apply_project(args: argparse.Namespace) -> Project:
    """Fill what the command line left unset: from kiln-project.yaml (found by walking up from the
    working directory), then the built-in defaults. The tree and profiles are the project's."""
    set_progress_mode(args.progress)
    project = current_project()
    if args.pkgs is None:
        args.pkgs = [str(project.root / tree) for tree in project.pkgs] or [str(project.root / PACKAGE_TREE)]
    if getattr(args, "profiles_dir", "") is None:
        args.profiles_dir = str(project.root / PROFILES_DIR)
    for name, builtin in BUILTIN_DEFAULTS.items():
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, getattr(project, name) or builtin)
    return project


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: `--js` is an error, not `--json`, so an abbreviation in a
    script cannot start meaning another option when one is added. Subparsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kiln",
        description="Build minimal, immutable Linux images from a declarative package graph.",
        epilog=environment_help() + "\n\ndocs/cli.md: the grammar, the project file and these variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    add_tree_options(parser, defaults=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    def room_verb(name: str, room: Any, help_text: str, description: str | None = None) -> None:
        """A verb of a room's command module: its add_arguments and run."""
        sub = verbs.add_parser(name, help=help_text, description=description or help_text)
        room.add_arguments(sub)
        sub.set_defaults(handler=room.run)

    room_verb("validate", validate_cmd, "check every pkg.yaml of the tree; print all errors as file:line: message")
    room_verb("ls", ls_cmd, "list packages with variant, version, what they need and their cache key")
    room_verb("graph", graph_command, "print the dependency graph (build order), optionally of TARGETs only")
    room_verb(
        "eval",
        eval_command,
        "render a Jinja2 template with TARGET's variables, e.g. kiln eval toolchain-seed '{{ target }}'",
    )
    room_verb("dump", dump_command, "print the rendered, canonical spec of every package (or of TARGETs)")

    room_verb("bootstrap", bootstrap_cmd, "make the stage0 seed root (debootstrap, or --from-tar PATH) and store it")
    room_verb("fetch", fetch_cmd, "download and verify the sources of TARGETs (default: all packages)")
    room_verb("build", build_cmd, "build TARGETs and what they need, in parallel, skipping stored keys")
    room_verb("shell", shell_cmd, "open a shell in TARGET's build root (dependencies merged, sources in place)")
    room_verb("export", export_cmd, "write the graph for other build systems")
    room_verb("log", log_cmd, "print TARGET's last build log")

    room_verb("cache", cache_cmd, "inspect and clean the store")

    room_verb("kernel", kernel_command, "edit the kernel config in the kernel's build container")

    room_verb(
        "image",
        image_command,
        "build what profiles need, then write their outputs (kiln image iso metal "
        "aws --out DIR); without a profile, vmlinuz and initramfs.zst",
    )

    room_verb(
        "dev",
        dev_command,
        "the inner loop: kiln dev boot rebuilds what changed, writes vmlinuz and initramfs.zst to _out/dev "
        "and boots them to machined's ready line, with the time of each phase",
    )

    room_verb(
        "init",
        init_command,
        "start an extension project: kiln init --extension NAME DIR writes DIR/kiln-project.yaml (the stock tree "
        "of --pkgs, then its own), pkgs/NAME and a README",
    )

    room_verb(
        "extension",
        extension_command,
        "the extension author's loop: kiln extension build NAME builds NAME and the kernel, checks it as "
        "kiln image would (paths, Kiln and kernel ranges, vermagic) and writes its layer to _out/extensions",
    )

    room_verb(
        "factory",
        factory_command,
        "serve images on demand: schematics in, any profile's outputs out, over HTTP (docs/factory.md)",
    )

    room_verb(
        "install",
        install_command,
        "write a profile's disk layout (default metal) onto a disk or disk "
        "file; a disk that is not empty needs --wipe, one in use is refused",
    )

    release = verbs.add_parser(
        "release",
        help="publish releases to an OCI registry or a cloud",
        description="publish releases to an OCI registry or a cloud",
    )
    release_verbs = release.add_subparsers(dest="release_verb", metavar="ACTION", required=True)
    release_push = release_verbs.add_parser(
        "push",
        help="push an installer image to HOST/REPO:<version> with release annotations (channel, architecture)",
        description="push an installer OCI layout (or its .tar, or an installer profile, built first) to a "
        "registry under the tag of its version, annotated with its channel, architecture and --upgrade-from",
    )
    release_command.add_arguments(release_push)
    release_push.set_defaults(handler=release_command.run)
    release_upload = release_verbs.add_parser(
        "upload",
        help="publish a kiln image output directory to a cloud: an AWS AMI (EBS snapshot, copies, SSM parameter)",
        description="publish a kiln image output directory to a cloud (docs/clouds.md)",
    )
    upload_command.add_arguments(release_upload)
    release_upload.set_defaults(handler=upload_command.run)

    room_verb("boot", boot_command, "boot an artifact in QEMU and wait for machined's ready line")
    room_verb(
        "node",
        node_command,
        "talk to running machines over machined's mutual-TLS API: status, logs, rollback, rolling upgrades",
        "talk to running machines over machined's mutual-TLS API (docs/node-client.md)",
    )
    room_verb(
        "secrets",
        secrets_command,
        "make a fleet's API certificates: two CAs, machines' (serverAuth) and clients' with a role",
        "make a fleet's API certificates: a machines CA and a clients CA, each machine's server certificate and "
        "api: section, each client's certificate (role admin, operator or reader) and kiln node config "
        "(docs/machine-config.md#the-api)",
    )
    room_verb(
        "keys",
        keys_command,
        "make your own Secure Boot, kernel module and release keys",
        "make your own Secure Boot, kernel module and release keys (docs/secure-boot.md)",
    )
    room_verb(
        "report",
        report_command,
        "pictures: a build's timeline (kiln build --json) or what takes the space in an image",
        "draw a build's timeline from kiln build --json, or measure what takes the space in an image",
    )
    room_verb(
        "schematic",
        schematic_command,
        "check a schematic and print its ID (what kiln image --schematic records and a factory serves)",
        "check a schematic (extensions, kernel arguments, machine config; docs/factory.md) and print its ID, "
        "the sha256 of its canonical form",
    )
    room_verb(
        "verify",
        verify_command,
        "check DIR against its SHA256SUMS and the release key's signature over it",
        "check that DIR holds exactly the files its SHA256SUMS lists, and that SHA256SUMS.sig "
        "is the release key's signature over it (docs/release-signing.md)",
    )

    room_verb("completion", completion, "print a shell completion script: source <(kiln completion bash)")
    return parser


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
